"""torchtitan training logs: the config dump, the device-mesh line and the per-step metrics line,
read from their format strings in pytorch/torchtitan at two releases (read, not copied):

- v0.2.0 (29624e3): torchtitan/tools/logging.py formats "[titan] %(asctime)s - %(name)s -
  %(levelname)s - %(message)s"; torchtitan/train.py logs f"Running with args:
  {job_config.to_dict()}" (a Python dict, with job.print_config); distributed/parallel_dims.py
  f"Building {n}-D device mesh with {names}, {dims}"; components/metrics.py `log`:
  f"step: {step:2}  loss: {loss:7.4f}  grad_norm: {grad_norm:7.4f}  memory:
  {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)  tps: {round(tps):,}  tflops:
  {tflops:,.2f}  mfu: {mfu:.2f}%" between colour codes (ANSI escapes, dropped here).
- main at b5bcd76 (2026-08-21, torchtitan 0.3): trainer.py `maybe_log` f"Running with configs:
  {json.dumps(self.to_dict(), indent=2)}" (JSON over several lines, with debug.print_config);
  parallel_dims.py f"Building device mesh with parallelism: pp={pp}, dp_replicate={r},
  dp_shard={s}, cp={cp}, tp={tp}, ep={ep}"; the metrics line with loss {:8.5f} and mfu "N/A"
  under quantisation; activation checkpointing a tyro subcommand (None, SelectiveAC.Config with
  force_recompute_mm_shapes_by_fqns, FullAC.Config, MemoryBudgetAC.Config with memory_budget).

tps is tokens per second per device (metrics.py: tokens / (time · non-data-parallel size)), so the
measured speed is the median tps after warm-up; peak memory is the largest max-reserved GiB. The
plan maps the config back the way autopar.export.torchtitan writes it: tp, pp, cp, ep degrees;
dp_shard > 1 is FSDP2 (ZeRO 3, or 2 with fsdp_reshard_after_forward "never"; HSDP with a
replicate degree: zero_shard_size = dp_shard), dp_shard 1 is DDP (ZeRO 0); mbs is the pipeline
micro-batch with pp, else the local batch; compile.enable is torch_compile; float8 converters fp8.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from autopar.errors import AutoparError
from autopar.logs.common import LogError, ParsedLog, StepLine, bad_line

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN = "[titan] "
STEP = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)\s+memory:\s*([0-9.]+)GiB"
                  r"\(([0-9.]+)%\)\s+tps:\s*([0-9,]+)\s+tflops:\s*([0-9,.]+)\s+mfu:\s*(\S+)")
MESH_V020 = re.compile(r"Building (\d+)-D device mesh with \[([^\]]*)\], \[([0-9, ]*)\]")
MESH_MAIN = re.compile(r"Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(\d+), "
                       r"cp=(\d+), tp=(\d+), ep=(\d+)")
PRESETS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3.1-405b"}
INTERLEAVED = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "ScheduleInterleaved1F1B")


def _clean(line: str) -> str:
    return ANSI.sub("", line)


def looks_like(lines: list[str]) -> int | None:
    for i, raw in enumerate(lines, 1):
        line = _clean(raw)
        if line.startswith(TITAN) or "Running with configs:" in line or "Running with args: {" in line:
            return i
    return None


def _config(path: str, lines: list[str]) -> tuple[dict[str, Any], str]:
    """(config dict, release) from the 'Running with args/configs' dump."""
    for number, raw in enumerate(lines, 1):
        line = _clean(raw)
        if "Running with args: {" in line:
            text = line[line.index("Running with args: ") + len("Running with args: "):]
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise bad_line(path, number, "torchtitan's 'Running with args:' dump is not a whole Python dict; "
                                             "pass the log as torchtitan printed it") from None
            return value, "v0.2.0"
        if "Running with configs: {" in line:
            chunk = [line[line.index("Running with configs: ") + len("Running with configs: "):]]
            for more in lines[number:number + 100_000]:
                chunk.append(_clean(more))
                if more.startswith("}"):
                    break
            try:
                return json.loads("\n".join(chunk)), "main-b5bcd76"
            except ValueError as exc:
                raise bad_line(path, number, f"torchtitan's 'Running with configs:' JSON does not parse ({exc}); pass "
                                             "the log as torchtitan printed it") from None
    raise LogError(f"log {path} has no torchtitan config dump ('Running with args:' or 'Running with configs:'); "
                   "rerun with --job.print_config (0.2) or --debug.print_config (0.3), which logs it")


def _world(path: str, lines: list[str]) -> int:
    for raw in lines:
        line = _clean(raw)
        m = MESH_MAIN.search(line)
        if m:
            return math.prod(int(g) for g in m.groups()[:5])
        m = MESH_V020.search(line)
        if m:
            return math.prod(int(x) for x in m.group(3).split(",") if x.strip())
    raise LogError(f"log {path} has no 'Building ... device mesh' line, which gives the GPU count; pass the whole log "
                   "from the start of the run")


def _recompute(c: dict[str, Any]) -> str:
    ac = c.get("activation_checkpoint")
    if ac is None:
        return "none"
    if "mode" in ac:
        mode = ac["mode"]
    elif "memory_budget" in ac:
        mode = "memory_budget"
    else:
        mode = "selective" if "force_recompute_mm_shapes_by_fqns" in ac else "full"
    if mode not in ("none", "selective", "full"):
        raise LogError(f"torchtitan activation checkpointing {mode!r} has no autopar form; use none, selective or full")
    return mode


def plan_fields(c: dict[str, Any], world: int) -> dict[str, Any]:
    """ParallelPlan fields from a torchtitan config on `world` GPUs (the inverse of the export)."""
    p, t, comp = c.get("parallelism", {}), c.get("training", {}), c.get("compile", {})
    tp, pp = int(p.get("tensor_parallel_degree", 1)), int(p.get("pipeline_parallel_degree", 1))
    cp, ep = int(p.get("context_parallel_degree", 1)), int(p.get("expert_parallel_degree", 1))
    if world % (tp * pp * cp):
        raise LogError(f"tp {tp} x pp {pp} x cp {cp} does not divide the {world} GPUs of the device mesh")
    dp = world // (tp * pp * cp)
    replicate = int(p.get("data_parallel_replicate_degree", 1))
    shard = int(p.get("data_parallel_shard_degree", -1))
    shard = dp // replicate if shard == -1 else shard
    fields: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "framework": "torchtitan"}
    if shard <= 1:
        fields["zero"] = 0
    else:
        fields["zero"] = 2 if p.get("fsdp_reshard_after_forward") == "never" else 3
        if replicate > 1:
            fields["zero_shard_size"] = shard
    local = int(t.get("local_batch_size", t.get("batch_size", 1)))
    gbs = t.get("global_batch_size", -1)
    fields["global_batch"] = local * dp if gbs in (-1, None) else int(gbs)
    fields["seq_len"] = int(t["seq_len"])
    fields["mbs"] = int(p.get("pipeline_parallel_microbatch_size", 1)) if pp > 1 else local
    schedule = str(p.get("pipeline_parallel_schedule", "1F1B"))
    if pp > 1 and schedule in INTERLEAVED:
        parts = p.get("module_fqns_per_model_part")
        if not parts:
            raise LogError(f"pipeline schedule {schedule} without module_fqns_per_model_part: autopar cannot tell the "
                           "virtual stages; pass a plan with --runs instead")
        fields["vpp"] = len(parts) // pp
    fields["recompute"] = {"mode": _recompute(c)}
    fields["torch_compile"] = bool(comp.get("enable", False))
    fields["tp_comm_overlap"] = bool(comp.get("enable_async_tensor_parallel",
                                              p.get("enable_async_tensor_parallel", False)))
    if tp > 1 and p.get("enable_sequence_parallel", True) is False:
        fields["sp"] = False
    model = c.get("model") or {}
    converters = model.get("converters") or c.get("model_converters", {}).get("converters") or []
    if any("float8" in str(x).lower() for x in converters):
        fields["precision"] = "fp8"
    return fields


def _model(c: dict[str, Any]) -> str | None:
    m = c.get("model_spec") or c.get("model") or {}
    return PRESETS.get((str(m.get("name", "")), str(m.get("flavor", ""))))


def _steps(path: str, lines: list[str]) -> tuple[list[StepLine], float | None]:
    steps, peak = [], None
    for number, raw in enumerate(lines, 1):
        line = _clean(raw)
        if " step:" not in line or "loss:" not in line or "validate step:" in line:
            continue
        m = STEP.search(line)
        if not m:
            raise bad_line(path, number, "a torchtitan step line that is not 'step: N  loss: ..  grad_norm: ..  "
                                         "memory: X GiB(Y%)  tps: ..  tflops: ..  mfu: ..'")
        tps = float(m.group(6).replace(",", ""))
        if not tps > 0:
            raise bad_line(path, number, f"tps {m.group(6)} is not positive")
        mem = float(m.group(4))
        peak = max(peak or 0.0, mem)
        steps.append(StepLine(line=number, step=int(m.group(1)), tokens_per_s_per_gpu=tps, memory_gib=mem))
    return steps, peak


def parse(path: str, lines: list[str]) -> ParsedLog:
    from pydantic import ValidationError

    from autopar.schema import one_line
    from autopar.schema.plan import ParallelPlan

    config, release = _config(path, lines)
    if not isinstance(config, dict):
        raise LogError(f"log {path}: torchtitan's config dump is not a mapping")
    world = _world(path, lines)
    try:
        plan = ParallelPlan(**plan_fields(config, world))
    except ValidationError as exc:
        raise LogError(one_line(exc, f"log {path}: the torchtitan config gives an invalid plan")) from None
    except AutoparError as exc:
        raise LogError(f"log {path}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise LogError(f"log {path}: torchtitan's config dump lacks or mistypes {exc}; pass the log as torchtitan "
                       "printed it") from None
    steps, peak = _steps(path, lines)
    return ParsedLog(path=path, framework="torchtitan", release=release, plan=plan, gpus=world, steps=steps,
                     model=_model(config), peak_memory_gib=peak, memory_kind="max reserved (metrics line)")
