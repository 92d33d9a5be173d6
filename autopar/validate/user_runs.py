"""A user's own measured runs (autopar/schema/runs.py), for `autopar validate --runs` and
`autopar calibrate runs.yaml`.

Each run states its plan as `autopar estimate` takes one: the `parallel` mapping holds plan fields
(tp, pp, cp, ep, vpp, mbs, zero, sp, recompute, precision, framework, ...) and every field it leaves
out takes estimate's default (mbs 1, selective recompute, the framework's ZeRO stage, ...). No
setting is free: the run is predicted with exactly that plan, so its error is the cost model's, not
a plan search's (the shipped runs, which leave settings unstated, are predicted with the fastest
fitting plan among them instead; autopar.validate.runner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autopar.errors import AutoparError, InputFileError, SchemaError
from autopar.limits import MAX_RUNS
from autopar.validate.dataset import MeasuredRun

RUNS_FORMAT_HINT = "see autopar/schema/runs.py (or `autopar validate --help`) for its format"


def load_user_runs(path: str) -> list[MeasuredRun]:
    """MeasuredRun records of a runs YAML, each carrying the exact plan it states (MeasuredRun.plan)."""
    import yaml
    from pydantic import ValidationError

    from autopar.io import read_text_file
    from autopar.schema import one_line
    from autopar.schema.runs import RunsFile

    p = Path(path).expanduser()
    text = read_text_file(p, "runs file", RUNS_FORMAT_HINT)
    from autopar.io import YamlKeyError, strict_yaml

    try:
        raw = strict_yaml(text, fast=True)  # libyaml: a 4 MiB file in 5 s, not 14
    except YamlKeyError as exc:
        raise InputFileError(f"runs file {p}: {exc}")
    except (yaml.YAMLError, ValueError, RecursionError):
        raise InputFileError(f"runs file {p} is malformed YAML; fix its syntax")
    rows = raw.get("runs") if isinstance(raw, dict) else None
    if isinstance(rows, list) and len(rows) > MAX_RUNS:  # (YAML aliases make 100,000 rows a 0.5 MB file)
        raise SchemaError(f"runs file {p} has {len(rows):,} runs; autopar reads at most {MAX_RUNS:,} "
                          f"(each is predicted in about 2 ms), so split it into files of at most {MAX_RUNS:,} runs")
    try:
        spec = RunsFile(**raw) if isinstance(raw, dict) else RunsFile.model_validate(raw)
    except ValidationError as exc:
        raise SchemaError(one_line(exc, f"runs file {p}"))
    runs = []
    for i, u in enumerate(spec.runs):
        run_id = u.name or f"user_{i:03d}"
        try:
            runs.append(_measured_run(u, run_id, str(p)))
        except AutoparError as exc:
            raise type(exc)(f"runs file {p}, run {i + 1} ({run_id}): {exc}") from None
    names = [r.run_id for r in runs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SchemaError(f"runs file {p}: run names {', '.join(repeated)} repeat; give each run its own name")
    return runs


def user_plan(u: Any) -> Any:
    """The ParallelPlan a user run states, estimate's defaults filling what it leaves out."""
    from autopar.choices import default_zero
    from autopar.inputs import plan_from_fields
    from autopar.schema.plan import Framework

    fields = dict(u.parallel)
    misplaced = sorted(set(fields) & {"global_batch", "seq_len", "gpus"})
    if misplaced:
        raise SchemaError(f"parallel states {', '.join(misplaced)}; give each as a key of the run itself, "
                          "beside parallel")
    framework = fields.get("framework", Framework.MEGATRON.value)
    try:
        zero = default_zero(framework)
    except (ValueError, TypeError):
        raise SchemaError(f"framework {framework!r} is not one of {', '.join(f.value for f in Framework)}")
    return plan_from_fields(fields, u.gpus, u.global_batch, u.seq_len, zero=zero)


def _measured_run(u: Any, run_id: str, path: str) -> MeasuredRun:
    return measured_run(user_plan(u), u.model, u.cluster, u.gpus, run_id=run_id, source=u.source or "user",
                        source_detail=u.source or path, step_time_s=u.step_time_s,
                        tokens_per_s_per_gpu=u.tokens_per_s_per_gpu, peak_memory_gib=u.peak_memory_gib)


def measured_run(plan: Any, model: str, cluster: str, gpus: int, *, run_id: str, source: str, source_detail: str,
                 step_time_s: float | None = None, tokens_per_s_per_gpu: float | None = None,
                 peak_memory_gib: float | None = None) -> MeasuredRun:
    """The MeasuredRun of a stated plan (a runs file's, or one read from a training log by
    autopar.logs), its layout checked on the cluster; give the speed as one of the two."""
    from autopar.cost.layout import check_layout
    from autopar.hardware import load_cluster
    from autopar.model import load_model

    graph = load_model(model)
    check_layout(plan, load_cluster(cluster, gpus), graph)
    tokens = plan.global_batch * plan.seq_len
    if step_time_s is not None:
        tokens_per_s_per_gpu = tokens / step_time_s / gpus
        step_s, conversion = step_time_s, "B·s / step time / GPUs"
    else:
        step_s, conversion = tokens / (tokens_per_s_per_gpu * gpus), "tokens/s/GPU as measured"
    return MeasuredRun(
        run_id=run_id, source=source, source_detail=source_detail,
        arch={"model": model, "moe": bool(graph.spec.moe) or None}, cluster=cluster, num_gpus=gpus,
        seq_len=plan.seq_len, global_batch=plan.global_batch, micro_batch=plan.mbs, tp=plan.tp, pp=plan.pp,
        dp=gpus // plan.model_parallel_size(), cp=plan.cp, ep=plan.ep, etp=plan.expert_tp, vpp=plan.vpp,
        sequence_parallel=plan.sequence_parallel, recompute=plan.recompute.mode.value, zero_stage=plan.zero,
        precision=plan.precision.value, measured_tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        measured_step_time_s=step_s, conversion=conversion, confidence="user", split="fit",
        framework=plan.framework.value, framework_release=plan.framework_release,
        grad_reduce_in_bf16=plan.grad_reduce_in_bf16, measured_memory_gib=peak_memory_gib,
        compiled=plan.torch_compile, plan=plan)
