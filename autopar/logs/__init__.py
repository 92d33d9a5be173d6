"""Measured runs from the training logs users already have: Megatron-LM, torchtitan, DeepSpeed.

`read_log(path, framework=None)` recognises the framework from the lines only it prints (or checks
the one given), reads the plan from the logged arguments/config through autopar's importers, and
the speed of every logged step; `runs_from_logs` turns logs into the MeasuredRun records that
`validate --from-log` and `calibrate --from-log` predict and fit, with the step time the median
after warm-up (common.WARMUP_RULE). Each framework's module names the source release it reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autopar.logs import deepspeed, megatron, torchtitan
from autopar.logs.common import FRAMEWORKS, WARMUP_RULE, LogError, ParsedLog, median, read_lines, steady_steps

_MODULES = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed}
_WHAT = {"megatron": "Megatron-LM", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}
MAX_LOGS = 1000

__all__ = ["read_log", "runs_from_logs", "detect", "WARMUP_RULE", "LogError", "ParsedLog", "FRAMEWORKS"]


def detect(path: str, lines: list[str]) -> tuple[str, int]:
    """(framework, line number of the first line only it prints); LogError when none matches."""
    hits = [(line, name) for name, mod in _MODULES.items() if (line := mod.looks_like(lines)) is not None]
    if not hits:
        raise LogError(f"log {path} is not a Megatron-LM, torchtitan or DeepSpeed training log (no argument dump, "
                       "config print or step line of theirs); pass the log the training job printed")
    line, name = min(hits)
    return name, line


def read_log(path: str, framework: str | None = None, *, seq_len: int | None = None) -> ParsedLog:
    """A training log parsed; `framework` (megatron, torchtitan, deepspeed) must be the one that
    wrote it. `seq_len`: DeepSpeed's, which its config does not record."""
    lines = read_lines(path)
    found, line = detect(path, lines)
    if framework is not None and framework != found:
        raise LogError(f"--framework {framework}, but {path} is a {_WHAT[found]} log (line {line}); pass "
                       f"--framework {found} or the {_WHAT[framework]} log")
    if found == "deepspeed":
        if seq_len is None:
            raise LogError(f"log {path}: a DeepSpeed config does not record the sequence length; pass --seq-len or "
                           "--model (whose default sequence length is used)")
        return deepspeed.parse(path, lines, seq_len)
    return _MODULES[found].parse(path, lines)


def _model_for(log: ParsedLog, model: str | None) -> str:
    from autopar.model import load_model

    if model is not None:
        if log.model_fields:
            from autopar.errors import SchemaError

            spec = load_model(model).spec
            differ = [f"{k} {log.model_fields[k]} (the model has {getattr(spec, k)})"
                      for k in ("num_layers", "hidden_size", "num_attention_heads")
                      if log.model_fields.get(k) is not None and log.model_fields[k] != getattr(spec, k)]
            if differ:
                raise SchemaError(f"log {log.path} trains another model than {model}: {', '.join(differ)}; pass the "
                                  "model the log trains")
        return model
    if log.model is None:
        said = "arguments match no preset" if log.model_fields else "config does not name a preset model"
        raise LogError(f"log {log.path}: the logged {said}; pass --model with a preset, config.json or model YAML")
    return log.model


def runs_from_logs(paths: list[str], cluster: str, *, model: str | None = None, framework: str | None = None,
                   seq_len: int | None = None) -> tuple[list[Any], list[dict[str, Any]]]:
    """(MeasuredRun per log, what was read from each: framework, release, steps used, median),
    every run predicted with exactly the plan its log states."""
    from autopar.errors import AutoparError, SchemaError
    from autopar.model import load_model
    from autopar.validate.user_runs import measured_run

    if len(paths) > MAX_LOGS:
        raise SchemaError(f"{len(paths):,} logs; autopar reads at most {MAX_LOGS:,} at once")
    runs, read = [], []
    names = [Path(p).stem for p in paths]
    for path, name in zip(paths, names):
        seq = seq_len or (load_model(model).spec.seq_length if model else None)
        log = read_log(path, framework, seq_len=seq)
        chosen = _model_for(log, model)
        steady = steady_steps(path, log.steps)
        run_id = name if names.count(name) == 1 else f"{name}_{len(runs):03d}"
        if log.framework == "torchtitan":
            speed = {"tokens_per_s_per_gpu": median([s.tokens_per_s_per_gpu for s in steady])}
        else:
            speed = {"step_time_s": median([s.step_time_s for s in steady])}
        try:
            run = measured_run(log.plan, chosen, cluster, log.gpus, run_id=run_id,
                               source=f"{log.framework} log", source_detail=f"{path} ({_WHAT[log.framework]} "
                                                                           f"{log.release})",
                               peak_memory_gib=log.peak_memory_gib, **speed)
        except AutoparError as exc:
            raise type(exc)(f"log {path}: {exc}") from None
        runs.append(run)
        read.append({"log": path, "run_id": run_id, "framework": log.framework, "release": log.release,
                     "model": chosen, "gpus": log.gpus, "step_lines": len(log.steps), "steps_used": len(steady),
                     "warmup_rule": WARMUP_RULE, "measured_step_time_s": run.measured_step_time_s,
                     "measured_tokens_per_s_per_gpu": run.measured_tokens_per_s_per_gpu,
                     "peak_memory_gib": log.peak_memory_gib, "memory_kind": log.memory_kind})
    return runs, read
