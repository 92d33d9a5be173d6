"""Fit a cost model's free efficiency parameters to measured step times.

Objective: the mean over runs of |log(predicted / measured tokens/s/GPU)|, each data source
weighted equally (so 900 small single-node runs do not drown 10 cluster-scale ones). Minimized
by Nelder–Mead (Nelder & Mead 1965) on an unconstrained transform of each parameter (logit for
fractions, log for positive values). Unstated run settings are re-chosen between rounds: fix the
best plan per run under the current parameters, fit, repeat (an alternating minimization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from typing import Callable, Sequence

import numpy as np

from autopar.cost.params import CostParams, params_from_file
from autopar.cost.step import estimate
from autopar.schema.cost_model import CostModelFile, FitReport
from autopar.schema.plan import ParallelPlan
from autopar.validate.dataset import MeasuredRun
from autopar.validate.runner import _cluster_for, _graph_for, predict

# Free parameters: (section, field, transform). "unit": in (0, 1]; "pos": > 0; "ratio2": in (1, 2)
# (fp8 cannot beat its 2x dense peak ratio over bf16).
FREE_PARAMETERS: dict[str, tuple[str, str, str]] = {
    "gemm_max": ("compute", "gemm_max", "unit"),
    "gemm_half_dim": ("compute", "gemm_half_dim", "pos"),
    "attention_max": ("compute", "attention_max", "unit"),
    "attention_half_seq": ("compute", "attention_half_seq", "pos"),
    "unfused_attention_max": ("compute", "unfused_attention_max", "unit"),
    "hbm_efficiency": ("compute", "hbm_efficiency", "unit"),
    "kernel_overhead_us": ("compute", "kernel_overhead_us", "pos"),
    "fp8_speedup": ("compute", "fp8_speedup", "ratio2"),
    "layer_launch_floor_us": ("compute", "layer_launch_floor_us", "pos"),
    "intra_node": ("network", "intra_node", "unit"),
    "inter_node": ("network", "inter_node", "unit"),
    "half_message_bytes": ("network", "half_message_bytes", "pos"),
    "collective_overhead_us": ("network", "collective_overhead_us", "pos"),
    "tp_overlap": ("network", "tp_overlap", "unit"),
}


def _to_free(value: float, kind: str) -> float:
    if kind == "ratio2":
        return _to_free(value - 1.0, "unit")
    if kind == "unit":
        v = min(max(value, 1e-6), 1 - 1e-6)
        return math.log(v / (1 - v))
    return math.log(max(value, 1e-12))


def _from_free(x: float, kind: str) -> float:
    if kind == "ratio2":
        return 1.0 + _from_free(x, "unit")
    if kind == "unit":
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(min(x, 60.0))


def with_values(base: CostModelFile, values: dict[str, float]) -> CostModelFile:
    """A copy of `base` with the named free parameters replaced."""
    sections: dict[str, dict] = {}
    for name, value in values.items():
        section, field_name, _ = FREE_PARAMETERS[name]
        sections.setdefault(section, {})[field_name] = value
    updates = {s: getattr(base, s).model_copy(update=f) for s, f in sections.items()}
    return base.model_copy(update=updates)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.3, iters: int = 300,
                tol: float = 1e-5) -> tuple[np.ndarray, float]:
    """Minimize f from x0 (standard reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    best = int(np.argmin(values))
    return simplex[best], values[best]


@dataclass(frozen=True)
class FitResult:
    file: CostModelFile
    objective: float
    evaluations: int


def _objective(runs: Sequence[MeasuredRun], plans: Sequence[ParallelPlan], p: CostParams) -> float:
    """Source-weighted mean |log(pred/measured)|."""
    by_source: dict[str, list[float]] = {}
    for run, plan in zip(runs, plans):
        e = estimate(_graph_for(run), _cluster_for(run.cluster, run.num_gpus), plan, p)
        by_source.setdefault(run.source, []).append(abs(math.log(e.tokens_per_s_per_gpu / run.measured_tokens_per_s_per_gpu)))
    return sum(sum(v) / len(v) for v in by_source.values()) / len(by_source)


def fit(runs: Sequence[MeasuredRun], base: CostModelFile, free: Sequence[str], rounds: int = 2,
        iters: int = 150) -> FitResult:
    """Fit `free` parameters of `base` on `runs` (alternating plan choice and Nelder–Mead)."""
    current, evals, value = base, 0, math.inf
    for _ in range(rounds):
        p = params_from_file(current)
        chosen = [(r, predict(r, p)) for r in runs]
        chosen = [(r, pr.plan) for r, pr in chosen if pr is not None]
        rs, plans = [r for r, _ in chosen], [pl for _, pl in chosen]
        start = {name: _field(current, name) for name in free}
        x0 = np.array([_to_free(start[n], FREE_PARAMETERS[n][2]) for n in free])

        def f(x: np.ndarray) -> float:
            nonlocal evals
            evals += 1
            values = {n: _from_free(v, FREE_PARAMETERS[n][2]) for n, v in zip(free, x)}
            return _objective(rs, plans, params_from_file(with_values(current, values)))

        x, value = nelder_mead(f, x0, iters=iters)
        current = with_values(current, {n: _from_free(v, FREE_PARAMETERS[n][2]) for n, v in zip(free, x)})
    return FitResult(file=current, objective=value, evaluations=evals)


def _field(f: CostModelFile, name: str) -> float:
    section, field_name, _ = FREE_PARAMETERS[name]
    return getattr(getattr(f, section), field_name)


def stamp(f: CostModelFile, command: str, sources: list[str], notes: str, report: FitReport) -> CostModelFile:
    prov = f.provenance.model_copy(update={"method": "calibrated", "command": command,
                                           "date": date.today().isoformat(), "sources": sources, "notes": notes})
    return f.model_copy(update={"provenance": prov, "fit": report})


__all__ = ["FREE_PARAMETERS", "FitResult", "calibrate_builtin", "derive", "fit", "nelder_mead", "stamp", "with_values"]


# --------------------------------------------------------------------------- the shipped defaults

# Free parameters per base: the A100 data (1,549 vTrain runs + 20 published) pins shape and
# overhead terms; the 24 H100 rows pin the peak fractions, network efficiencies, the fp8 gain and
# the launch overheads (Megatron-Core with Transformer Engine launches far fewer kernels than the
# Megatron-DeepSpeed of the A100 runs); the GEMM shape curve is kept from the A100 fit.
FREE_FOR_GPU = {
    "a100": ["gemm_max", "gemm_half_dim", "unfused_attention_max", "hbm_efficiency", "kernel_overhead_us",
             "layer_launch_floor_us", "intra_node", "inter_node", "collective_overhead_us"],
    "h100": ["gemm_max", "hbm_efficiency", "fp8_speedup", "intra_node", "inter_node",
             "kernel_overhead_us"],
}
CLUSTERS_FOR_GPU = {"a100": ("vtrain-a100", "dgx-a100-80gb", "dgx-a100-40gb"), "h100": ("dgx-h100",)}
_A100_FLASH_NOTE = ("The A100 runs all use unfused attention, so attention_max (flash) is not fitted: 0.6 of "
                    "peak from Dao 2023, FlashAttention-2, Fig. 5-6 (A100 forward+backward 50-73%).")
# Parameters the shipped runs cannot identify, set from published kernel benchmarks (not training
# runs) before fitting: the 16 H100 fit rows are short-sequence, so attention is a small share of
# their time and trades off against gemm_max; long-context plans depend on it.
FIXED_FOR_GPU = {
    "h100": ({"attention_max": 0.5},
             "attention_max 0.5 (not fitted): FlashAttention-3, Shah et al. 2024, Figs. 5-8, H100 BF16 causal "
             "attention reaches 60-75% of peak forward and 45-60% backward at long sequence."),
}
VTRAIN_SINGLE_FIT_STRIDE = 4  # fit on every 4th single-node fit row: 225 rows carry its shapes


def builtin_fit_runs(gpu: str) -> list[MeasuredRun]:
    """The fit split of the shipped measured runs on this GPU family."""
    from autopar.validate.dataset import load_runs

    out = []
    for r in load_runs():
        if r.cluster not in CLUSTERS_FOR_GPU[gpu] or r.split != "fit":
            continue
        if r.source == "vtrain-single" and int(r.run_id.rsplit("_", 1)[-1]) % VTRAIN_SINGLE_FIT_STRIDE:
            continue
        out.append(r)
    return out


def _mape(runs: Sequence[MeasuredRun], p: CostParams) -> float | None:
    errs = [abs(pr.error) for pr in (predict(r, p) for r in runs) if pr is not None]
    return sum(errs) / len(errs) if errs else None


def calibrate_builtin(gpu: str, base: CostModelFile, command: str, rounds: int = 2, iters: int = 200) -> CostModelFile:
    """Fit `base` on the shipped fit split for `gpu` ("a100" or "h100"); report fit and held-out MAPE."""
    from autopar.validate.dataset import load_runs

    if gpu not in FREE_FOR_GPU:
        from autopar.errors import SchemaError
        raise SchemaError(f"--gpu {gpu!r} has no shipped measured runs; use one of {', '.join(FREE_FOR_GPU)}")
    fit_runs = builtin_fit_runs(gpu)
    fixed, fixed_note = FIXED_FOR_GPU.get(gpu, ({}, ""))
    base = with_values(base, fixed)
    result = fit(fit_runs, base, FREE_FOR_GPU[gpu], rounds=rounds, iters=iters)
    p = params_from_file(result.file)
    holdout = [r for r in load_runs() if r.cluster in CLUSTERS_FOR_GPU[gpu] and r.split == "holdout"]
    report = FitReport(runs_fit=len(fit_runs), runs_holdout=len(holdout), mape_fit=_mape(fit_runs, p),
                       mape_holdout=_mape(holdout, p))
    sources = sorted({f"{r.source}: {r.source_detail.split(',')[0]}" for r in fit_runs})
    notes = (f"Fitted parameters: {', '.join(FREE_FOR_GPU[gpu])}; others from the base file. "
             f"{result.evaluations} objective evaluations, source-weighted mean |log error| {result.objective:.4f}. "
             "Held-out rows (whole model shapes) were not used in fitting. "
             f"Base file: {base.name} ({base.provenance.method}: {base.provenance.command}). "
             + (_A100_FLASH_NOTE if gpu == "a100" else fixed_note))
    return stamp(result.file, command, sources, notes, report)


def derive(base: CostModelFile, name: str, gpus: list[str], command: str, reason: str) -> CostModelFile:
    """A cost model for GPUs without measured runs: the base file's efficiencies, stated as such."""
    prov = base.provenance.model_copy(update={
        "method": "derived", "command": command, "date": date.today().isoformat(),
        "sources": [f"{base.name}.json ({base.provenance.method}: {base.provenance.command})"], "notes": reason})
    return base.model_copy(update={"name": name, "gpus": gpus, "provenance": prov, "fit": None})


# --------------------------------------------------------------------------- a user's own runs

USER_FREE = ["gemm_max", "attention_max", "hbm_efficiency", "inter_node", "intra_node"]


def load_user_runs(path: str) -> list[MeasuredRun]:
    """MeasuredRun records from a runs YAML (autopar/schema/runs.py), every setting stated."""
    from pathlib import Path

    import yaml
    from pydantic import ValidationError

    from autopar.errors import InputFileError, SchemaError
    from autopar.schema import one_line
    from autopar.schema.runs import RunsFile

    from autopar.io import read_text_file

    p = Path(path).expanduser()
    text = read_text_file(p, "runs file", "see `autopar calibrate --help` for its format")
    try:
        raw = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        raise InputFileError(f"runs file {p} is malformed YAML; fix its syntax")
    try:
        spec = RunsFile(**raw) if isinstance(raw, dict) else RunsFile.model_validate(raw)
    except ValidationError as exc:
        raise SchemaError(one_line(exc, f"runs file {p}"))
    out = []
    for i, u in enumerate(spec.runs):
        par = dict(u.parallel)
        tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
        out.append(MeasuredRun(
            run_id=f"user_{i:03d}", source="user", source_detail=u.source or str(p), arch={"model": u.model},
            cluster=u.cluster, num_gpus=u.gpus, seq_len=u.seq_len, global_batch=u.global_batch,
            micro_batch=par.get("mbs", 1), tp=tp, pp=pp, dp=u.gpus // (tp * pp * cp), cp=cp, ep=par.get("ep", 1),
            etp=par.get("etp", tp), vpp=par.get("vpp", 1), sequence_parallel=par.get("sp"),
            recompute=par.get("recompute", "selective"), zero_stage=par.get("zero", 1),
            precision=par.get("precision", "bf16"),
            measured_tokens_per_s_per_gpu=u.global_batch * u.seq_len / u.step_time_s / u.gpus,
            measured_step_time_s=u.step_time_s, conversion="B·s / step time / GPUs", confidence="user",
            split="fit"))
    return out


def calibrate_user(runs_path: str, base: CostModelFile, command: str, free: Sequence[str] = USER_FREE,
                   iters: int = 150) -> tuple[CostModelFile, list[tuple[str, float]]]:
    """Fit on all runs; leave-one-out: refit without each run and predict it. Returns the file and
    (run_id, held-out error) pairs."""
    runs = load_user_runs(runs_path)
    result = fit(runs, base, free, rounds=1, iters=iters)
    loo: list[tuple[str, float]] = []
    if len(runs) > 1:
        for i, r in enumerate(runs):
            others = runs[:i] + runs[i + 1:]
            p = params_from_file(fit(others, base, free, rounds=1, iters=iters).file)
            pr = predict(r, p)
            loo.append((r.run_id, pr.error if pr else math.nan))
    p = params_from_file(result.file)
    report = FitReport(runs_fit=len(runs), runs_holdout=len(loo), mape_fit=_mape(runs, p),
                       mape_holdout=sum(abs(e) for _, e in loo) / len(loo) if loo else None)
    notes = (f"Fitted {', '.join(free)} on {len(runs)} user runs; mape_holdout is the leave-one-out error. "
             f"Base file: {base.name} ({base.provenance.method}: {base.provenance.command}).")
    return stamp(result.file, command, [f"runs file {runs_path}"], notes, report), loo
