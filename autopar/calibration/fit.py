"""Fit a cost model's free efficiency parameters to measured step times.

Objective: the mean over runs of |log(predicted / measured tokens/s/GPU)|, each data source
weighted equally (so 900 small single-node runs do not drown 10 cluster-scale ones). Minimized
by Nelder–Mead (Nelder & Mead 1965) on an unconstrained transform of each parameter (logit for
fractions, log for positive values). Unstated run settings are re-chosen between rounds: fix the
best plan per run under the current parameters, fit, repeat (an alternating minimization).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from autopar.cost.params import CostParams, params_from_file
from autopar.cost.step import estimate
from autopar.data import data_dir
from autopar.errors import SchemaError
from autopar.hardware import gpu_arch
from autopar.limits import MAX_CALIBRATION_STEPS, MAX_HELD_OUT_FITS
from autopar.schema.cost_model import CostModelFile, FitReport, GemmShape
from autopar.schema.plan import ParallelPlan
from autopar.validate.dataset import MeasuredRun
from autopar.validate.runner import _cluster_for, _graph_for, predict

# Free parameters: (section, field, transform). "unit": in (0, 1]; "pos": > 0; "gain": in (1, the GPU's
# fp8 gain bound, fp8_gain_max).
FREE_PARAMETERS: dict[str, tuple[str, str, str]] = {
    "gemm_max": ("compute", "gemm_max", "unit"),
    "gemm_half_dim": ("compute", "gemm_half_dim", "pos"),
    "attention_max": ("compute", "attention_max", "unit"),
    "attention_half_seq": ("compute", "attention_half_seq", "pos"),
    "unfused_attention_max": ("compute", "unfused_attention_max", "unit"),
    "hbm_efficiency": ("compute", "hbm_efficiency", "unit"),
    "kernel_overhead_us": ("compute", "kernel_overhead_us", "pos"),
    "fp8_speedup": ("compute", "fp8_speedup", "gain"),
    "layer_launch_floor_us": ("compute", "layer_launch_floor_us", "pos"),
    "intra_node": ("network", "intra_node", "unit"),
    "inter_node": ("network", "inter_node", "unit"),
    "half_message_bytes": ("network", "half_message_bytes", "pos"),
    "collective_overhead_us": ("network", "collective_overhead_us", "pos"),
    "tp_overlap": ("network", "tp_overlap", "unit"),
}


# A fitted efficiency must stay plausible on its own terms, or it absorbs what the physics misses.
# (low, high) of each bounded efficiency, with the measurement that bounds it:
# - gemm_max <= 0.9: cuBLAS's large bf16 GEMMs stay below ~90 % of the dense datasheet peak (our own
#   H200 run, cost_models/measured/h200_kernels.json: best 765 of 989 TFLOP/s; A100 8192^3 about 0.85-0.9);
# - inter_node / intra_node >= 0.5: NCCL reaches 80-95 % of link rate as bus bandwidth at large messages
#   (NVIDIA nccl-tests PERFORMANCE.md); half of it is the least a healthy fabric gives;
# - hbm_efficiency in [0.5, 0.95]: streaming kernels reach 85-93 % of datasheet HBM bandwidth (our H200 copy:
#   4.0 of 4.8 TB/s).
PLAUSIBLE_RANGE: dict[str, tuple[float, float]] = {
    "gemm_max": (0.3, 0.9), "inter_node": (0.5, 1.0), "intra_node": (0.5, 1.0), "hbm_efficiency": (0.5, 0.95),
}


def _to_free(value: float, kind: str, bounds: tuple[float, float] = (0.0, 1.0)) -> float:
    if kind == "gain":
        # An fp8 gain on its bound starts 1 % inside it: at the logit's far tail a simplex step no longer
        # moves it, and a gain that reached the bound could never come back. Efficiencies on a bound keep
        # their start.
        lo, hi = bounds
        return _to_free(lo + min(max((value - lo) / (hi - lo), 0.01), 0.99) * (hi - lo), "unit", bounds)
    if kind == "unit":
        lo, hi = bounds
        v = min(max((value - lo) / (hi - lo), 1e-6), 1 - 1e-6)
        return math.log(v / (1 - v))
    return math.log(max(value, 1e-12))


def _from_free(x: float, kind: str, bounds: tuple[float, float] = (0.0, 1.0)) -> float:
    if kind in ("unit", "gain"):
        lo, hi = bounds
        return lo + (hi - lo) / (1.0 + math.exp(-x))
    return math.exp(min(x, 60.0))


def _bounds(name: str, base: CostModelFile | None = None) -> tuple[float, float]:
    """Plausible range of a free parameter ("fw.field" takes the field's); an fp8 gain's is
    (1, fp8_gain_max of the file's GPUs)."""
    field_name = name.split(".", 1)[-1]
    if field_name == "fp8_speedup":
        return 1.0, fp8_gain_max(base.gpus if base is not None else ())
    return PLAUSIBLE_RANGE.get(field_name, (0.0, 1.0))


# Transformer Engine and torchao run the forward GEMM of an fp8 linear with fast accumulation and its
# two backward GEMMs (dgrad, wgrad) with full-precision accumulation (TE module/base.py _2X_ACC_FPROP
# False, _2X_ACC_DGRAD / _2X_ACC_WGRAD True, at v2.2; torchao float8 config: use_fast_accum in the
# forward only). One linear's three equal-FLOP GEMMs then gain over bf16 at most the harmonic mean of
# the forward's bound, the datasheet's dense fp8/bf16 peak ratio, and the backward's measured gain.
_DATASHEET_FP8_GAIN = 2.0


@lru_cache(maxsize=1)
def hopper_precise_fp8_gain() -> float:
    """fp8 over bf16 reference rate of our H200 GEMMs (reference_gemm_tflops: the shape factor's
    reference, so fp8_speedup's own scale), torch._scaled_mm's default full-precision accumulation
    (cost_models/measured/h200_kernels.json, 2026-11-30: 1.77)."""
    table = json.loads((data_dir("cost_models") / "measured" / "h200_kernels.json").read_text())
    return reference_gemm_tflops(table["fp8_gemm"]) / reference_gemm_tflops(table["gemm"])


def fp8_gain_max(gpus: Sequence[str]) -> float:
    """Upper bound of a fitted fp8 gain (fp8_speedup) for these GPUs: on Hopper the three GEMMs'
    harmonic mean of the fast-accumulation forward at the datasheet ratio and the two backward GEMMs
    at our measured full-precision gain (1.84); elsewhere the datasheet's 2x (no fp8 GEMM of ours
    measured; Blackwell has no fast-accumulation mode, TE #2748)."""
    if gpus and all(gpu_arch(g) == "hopper" for g in gpus):
        return 3.0 / (1.0 / _DATASHEET_FP8_GAIN + 2.0 / hopper_precise_fp8_gain())
    return _DATASHEET_FP8_GAIN


FRAMEWORK_FIELDS = {"gemm_max": ("compute", "unit"), "hbm_efficiency": ("compute", "unit"),
                    "inter_node": ("network", "unit"), "intra_node": ("network", "unit"),
                    "collective_overhead_us": ("network", "pos"), "kernel_overhead_us": ("compute", "pos"),
                    "fp8_speedup": ("compute", "gain")}


def _spec(name: str) -> tuple[str | None, str, str, str]:
    """(framework or None, section, field, transform) of a free-parameter name; "fw.field" names a
    framework's own efficiency (cost-model file `frameworks` section)."""
    if "." in name:
        framework, field_name = name.split(".", 1)
        section, kind = FRAMEWORK_FIELDS[field_name]
        return framework, section, field_name, kind
    section, field_name, kind = FREE_PARAMETERS[name]
    return None, section, field_name, kind


def with_values(base: CostModelFile, values: dict[str, float], fit_note: str = "") -> CostModelFile:
    """A copy of `base` with the named free parameters replaced ("fw.field": a framework's own)."""
    from autopar.schema.cost_model import FrameworkEfficiency

    sections: dict[str, dict] = {}
    frameworks = dict(base.frameworks)
    for name, value in values.items():
        framework, section, field_name, _ = _spec(name)
        if framework is None:
            sections.setdefault(section, {})[field_name] = value
            continue
        current = frameworks.get(framework) or FrameworkEfficiency(source=fit_note or "set by with_values")
        updated = {**getattr(current, section), field_name: value}
        frameworks[framework] = current.model_copy(update={section: updated, **({"source": fit_note} if fit_note else {})})
    updates = {s: getattr(base, s).model_copy(update=f) for s, f in sections.items()}
    return base.model_copy(update={**updates, "frameworks": frameworks})


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
        x0 = np.array([_to_free(start[n], _spec(n)[3], _bounds(n, base)) for n in free])

        def f(x: np.ndarray) -> float:
            nonlocal evals
            evals += 1
            values = {n: _from_free(v, _spec(n)[3], _bounds(n, base)) for n, v in zip(free, x)}
            return _objective(rs, plans, params_from_file(with_values(current, values)))

        x, value = nelder_mead(f, x0, iters=iters)
        current = with_values(current, {n: _from_free(v, _spec(n)[3], _bounds(n, base)) for n, v in zip(free, x)})
    return FitResult(file=current, objective=value, evaluations=evals)


def _field(f: CostModelFile, name: str) -> float:
    """Current value of a free parameter; a framework without its own value starts from the file's."""
    framework, section, field_name, _ = _spec(name)
    own = f.frameworks.get(framework) if framework else None
    if own is not None and field_name in getattr(own, section):
        return getattr(own, section)[field_name]
    return getattr(getattr(f, section), field_name)


def stamp(f: CostModelFile, command: str, sources: list[str], notes: str, report: FitReport) -> CostModelFile:
    prov = f.provenance.model_copy(update={"method": "calibrated", "command": command,
                                           "date": date.today().isoformat(), "sources": sources, "notes": notes})
    return f.model_copy(update={"provenance": prov, "fit": report})


__all__ = ["FREE_PARAMETERS", "FitResult", "builtin_fit_runs", "calibrate_builtin", "derive", "fit", "fittable",
           "nelder_mead", "stamp", "with_values", "without_frameworks"]


# --------------------------------------------------------------------------- the shipped defaults

# Free parameters per base. Megatron's efficiencies are the file's own values; every other
# framework gets its own compute/network efficiencies ("fw.field"), fitted on its runs only.
# A100: Megatron (Narayanan'21, Korthikanti'22) and DeepSpeed (Megatron-DeepSpeed: vTrain's 1,549
# runs and the SC'21 ZeRO-3 baselines); the many vTrain runs pin the shared shape and overhead
# terms; hbm_efficiency is kept at the earlier A100 fit's 0.91 (fitted freely it runs to its bound of 1,
# which no elementwise kernel reaches). H100: Megatron/NeMo (24 rows) and torchtitan (10 rows on the 500 W 96 GB SKU, its peaks
# in its cluster profile); the GEMM shape curve is kept from the A100 fit.
FREE_FOR_GPU = {
    "a100": ["gemm_max", "gemm_half_dim", "unfused_attention_max", "kernel_overhead_us",
             "layer_launch_floor_us", "intra_node", "inter_node", "collective_overhead_us",
             "deepspeed.gemm_max", "deepspeed.inter_node"],
    "h100": ["gemm_max", "fp8_speedup", "inter_node", "torchtitan.gemm_max", "torchtitan.fp8_speedup"],
    # GB200: the dgxc recipe tables of 2025 (NeMo 25.04) on GB200 NVL72 fix Blackwell's achieved GEMM rate
    # and fp8 gain; attention comes from the file's kernel table (FlashAttention-4 paper), the rest from H100.
    "gb200": ["gemm_max", "fp8_speedup"],
}
# H100's HBM efficiency is measured, not fitted: fitted, it sat at its lower bound 0.5 (elementwise
# work is a few percent of a Megatron step, so the fit used it as a spare knob), which prices
# torchtitan's eager elementwise ops at half the bandwidth a copy reaches (_PRIOR_SOURCES_FOR_GPU).
# H100's per-kernel overhead is not identifiable from its runs either (refitting the rest with it held
# at 2, 4, ..., 18 µs moves the objective by under 2 %, 0.0664 -> 0.0652, and the free fit drifted from
# 4 to 12 µs when one NeMo row's recipe was corrected), so it is taken from a kernel measurement
# (_PRIOR_SOURCES_FOR_GPU["compute.kernel_overhead_us"]).
# H100's NVLink efficiency is not identifiable from its runs (the fit objective moves by under 1 %
# for any value in 0.7-1.0: the Megatron rows hide TP traffic behind TE userbuffers, torchtitan's
# FSDP gathers behind compute), so it is taken from a published NVLink4 benchmark instead
# (_PRIOR_SOURCES["network.intra_node"]).
# The few efficiencies a leave-one-source-out refit re-fits (shape and overhead terms stay as shipped).
LOSO_FREE_FOR_GPU = {
    "a100": ["gemm_max", "inter_node", "deepspeed.gemm_max", "deepspeed.inter_node"],
    "h100": ["gemm_max", "inter_node", "fp8_speedup", "torchtitan.gemm_max", "torchtitan.fp8_speedup"],
    "gb200": ["gemm_max", "fp8_speedup"],
}
CLUSTERS_FOR_GPU = {"a100": ("vtrain-a100", "dgx-a100-80gb", "dgx-a100-40gb"),
                    "h100": ("dgx-h100", "grandteton-h100-96gb"), "gb200": ("gb200-nvl72",)}
_A100_FLASH_NOTE = ("The A100 runs all use unfused attention; flash-attention rates come from the file's "
                    "attention_kernels table (FlashAttention-2 paper), not from the fit.")
_H100_FLASH_NOTE = ("Attention rates per kernel family (fa2, cudnn, fa3) come from the file's attention_kernels "
                    "table (FlashAttention-3 paper figures), not from the fit; the framework profile picks the "
                    "family (autopar/frameworks/).")
_GB200_FLASH_NOTE = ("Attention rates per kernel family (cudnn, fa4, fa2) come from the file's attention_kernels "
                     "table (FlashAttention-4 paper, B200), not from the fit.")
VTRAIN_SINGLE_FIT_STRIDE = 4  # fit on every 4th single-node fit row: 225 rows carry its shapes


def _thinned(r: MeasuredRun, stride: int) -> bool:
    return r.source == "vtrain-single" and int(r.run_id.rsplit("_", 1)[-1]) % stride != 0


def builtin_fit_runs(gpu: str, split: str | None = "fit", exclude_sources: frozenset[str] = frozenset(),
                     single_stride: int = VTRAIN_SINGLE_FIT_STRIDE) -> list[MeasuredRun]:
    """The shipped measured runs on this GPU family (the fit split, or every split with None),
    without `exclude_sources`, with vTrain's single-node set thinned to every `single_stride`-th."""
    from autopar.validate.dataset import load_runs

    return [r for r in load_runs() if r.cluster in CLUSTERS_FOR_GPU[gpu] and (split is None or r.split == split)
            and r.source not in exclude_sources and not _thinned(r, single_stride)]


def _mape(runs: Sequence[MeasuredRun], p: CostParams) -> float | None:
    errs = [abs(pr.error) for pr in (predict(r, p) for r in runs) if pr is not None]
    return sum(errs) / len(errs) if errs else None


def fittable(free: Sequence[str], runs: Sequence[MeasuredRun]) -> list[str]:
    """The free parameters the runs can inform: a framework's own efficiencies need its runs."""
    frameworks = {r.framework for r in runs}
    return [n for n in free if "." not in n or n.split(".", 1)[0] in frameworks]


def without_frameworks(base: CostModelFile, frameworks: set[str]) -> CostModelFile:
    """`base` with the named frameworks' own efficiencies dropped (they fall back to the file's)."""
    return base.model_copy(update={"frameworks": {k: v for k, v in base.frameworks.items() if k not in frameworks}})


def calibrate_builtin(gpu: str, base: CostModelFile, command: str, rounds: int = 2, iters: int = 200) -> CostModelFile:
    """Fit `base` on every shipped run of `gpu` ("a100", "h100" or "gb200"); report the fit's MAPE."""
    if gpu not in FREE_FOR_GPU:
        from autopar.errors import SchemaError
        raise SchemaError(f"--gpu {gpu!r} has no shipped measured runs; use one of {', '.join(FREE_FOR_GPU)}")
    # Every split: the honest error is the leave-one-source-out one (autopar.calibration.loso), which
    # refits without each source; the shipped model uses all the data.
    fit_runs = builtin_fit_runs(gpu, split=None)
    free = fittable(FREE_FOR_GPU[gpu], fit_runs)
    result = fit(fit_runs, base, free, rounds=rounds, iters=iters)
    fitted = result.file
    for framework in {n.split(".", 1)[0] for n in free if "." in n}:
        runs_of = sorted({r.source for r in fit_runs if r.framework == framework})
        fitted = fitted.model_copy(update={"frameworks": {**fitted.frameworks, framework: fitted.frameworks[framework].model_copy(
            update={"source": f"fitted on all runs of {', '.join(runs_of)} ({framework} runs), `{command}`"})}})
    p = params_from_file(fitted)
    report = FitReport(runs_fit=len(fit_runs), runs_holdout=0, mape_fit=_mape(fit_runs, p), mape_holdout=None)
    sources = sorted({f"{r.source}: {r.source_detail.split(',')[0]}" for r in fit_runs})
    notes = (f"Fitted parameters: {', '.join(free)}; others from the base file. "
             f"{result.evaluations} objective evaluations, source-weighted mean |log error| {result.objective:.4f}. "
             "Fitted on every split; the error to expect on a new source is the leave-one-source-out one "
             "(`autopar validate --leave-one-source-out`, README). "
             f"Base file: {base.name} ({base.provenance.method}: {base.provenance.command}). "
             + (_A100_FLASH_NOTE if gpu == "a100" else _GB200_FLASH_NOTE if gpu == "gb200" else _H100_FLASH_NOTE))
    stamped = stamp(fitted, command, sources, notes, report)
    return stamped.model_copy(update={"constant_sources": constant_sources(stamped, free, fit_runs, command, gpu)})


def constant_sources(f: CostModelFile, free: Sequence[str], fit_runs: Sequence[MeasuredRun], command: str,
                     gpu: str | None = None) -> dict[str, str]:
    """Where each constant of `f` comes from: fitted (on which runs), kernel benchmark, or prior."""
    priors = {**_PRIOR_SOURCES, **_PRIOR_SOURCES_FOR_GPU.get(gpu or "", {})}
    by_framework: dict[str, set[str]] = {}
    for r in fit_runs:
        by_framework.setdefault(r.framework, set()).add(r.source)
    out: dict[str, str] = {}
    for section in ("compute", "network", "memory"):
        for field_name in getattr(f, section).model_fields:
            key = f"{section}.{field_name}"
            if field_name in free:
                out[key] = f"fitted on {', '.join(sorted({r.source for r in fit_runs}))} (all splits), `{command}`"
            else:
                out[key] = priors.get(key, f"fitted earlier and kept: not identifiable from these runs; the base "
                                                   f"file's history: {f.provenance.notes.split('Base file: ')[-1][:200]}")
    for name in free:
        if "." in name:
            framework = name.split(".", 1)[0]
            out[f"frameworks.{name}"] = f"fitted on {', '.join(sorted(by_framework.get(framework, set())))} (all splits)"
    out["attention_kernels"] = "kernel benchmark tables, each entry names its figure (FlashAttention-2/-3 papers)"
    if f.gemm_shape:
        out["gemm_shape"] = GEMM_SHAPE_SOURCE
    return out


GEMM_SHAPE_SOURCE = (
    "kernel benchmark: fitted (autopar.calibration.fit.fit_gemm_shape) to the relative efficiency of 65 bf16 and 65 fp8 "
    "GEMM shapes measured on an H200 (cost_models/measured/h200_kernels.json: torch a@b and torch._scaled_mm e4m3, "
    "median of 10 CUDA-event timings; the same GH100 compute as H100 and H800), each shape's efficiency over the "
    "median of the shapes with every dim >= 4096; not fitted to runs")


_PRIOR_SOURCES = {
    "compute.attention_max": "fallback flash rate when attention_kernels is empty (FlashAttention-3 paper, Figs. 5-8); unused with a kernel table",
    "compute.attention_half_seq": "prior: FlashAttention-2 paper Figs. 4-6 (A100) reach about half their long-sequence rate near 512 tokens",
    "compute.attention_backward_ratio": "Dao 2023 (FlashAttention-2) §3: backward does 2.5x the forward matmul FLOPs (5 vs 2 matmuls)",
    "network.intra_node": "network benchmark: DeepEP (deepseek-ai/DeepEP, docs/legacy.md, Performance) measures H800 NVLink4 at '~160 GB/s NVLink maximum bandwidth' (intranode EP8 dispatch 153 GB/s, combine 158 GB/s) of its 200 GB/s per-direction rate: 0.80; not identifiable from the H100 runs (fit objective within 1 % for 0.7-1.0)",
    "network.half_message_bytes": "prior: NCCL tests on NVLink/InfiniBand reach half their bus bandwidth near 1 MB messages (NVIDIA nccl-tests PERFORMANCE.md)",
    "network.tp_overlap": "prior: Transformer Engine userbuffers overlap hides most TP communication (Megatron-LM --tp-comm-overlap docs); not identifiable from the runs",
    "network.cp_overlap": "prior: ring attention overlaps the K/V exchange with attention compute (Liu et al. 2023); not identifiable from the runs",
    "memory.cuda_context_gib": "measured order of the CUDA context plus cuBLAS/NCCL workspaces on H100/A100 (about 1 GiB); prior",
    "memory.fragmentation": "prior: PyTorch caching-allocator fragmentation of a few percent of allocated bytes",
    "memory.comm_buffer_gib": "prior: NCCL channel buffers and DDP/FSDP buckets, about 1 GiB per GPU",
}


# Constants one GPU family's file takes from a measurement rather than its fit.
_PRIOR_SOURCES_FOR_GPU = {
    "h100": {
        "compute.hbm_efficiency": "kernel benchmark: a 4 GiB device-to-device copy on H200 moves 4.00 TB/s of its "
                                  "4.8 TB/s datasheet rate (cost_models/measured/h200_kernels.json, "
                                  "hbm_copy_bytes_per_s): 0.834, taken for the HBM3/HBM3e H100 family",
        "compute.kernel_overhead_us": "kernel benchmark: torchao's roofline model times a Triton kernel that reads "
                                      "and writes one element at 2 µs of GPU time on an H100, from a trace "
                                      "(pytorch/ao torchao/testing/training/roofline_utils.py at v0.18.0, "
                                      "KERNEL_LAUNCH_OVERHEAD_SEC; TRITON_KERNEL_1_ELEMENT_TIME_SEC at eab345c): 2.0",
    },
}


def derive(base: CostModelFile, name: str, gpus: list[str], command: str, reason: str) -> CostModelFile:
    """A cost model for GPUs without measured runs: the base file's efficiencies, stated as such."""
    prov = base.provenance.model_copy(update={
        "method": "derived", "command": command, "date": date.today().isoformat(),
        "sources": [f"{base.name}.json ({base.provenance.method}: {base.provenance.command})"], "notes": reason})
    return base.model_copy(update={"name": name, "gpus": gpus, "provenance": prov, "fit": None})


# --------------------------------------------------------------------------- GEMM shape factors

# The shapes whose median efficiency is the reference of the shape factor: every dim at least this.
SHAPE_REFERENCE_MIN_DIM = 4096


def relative_gemm_efficiency(points: Sequence[dict[str, float]],
                             peak_tflops: float) -> list[tuple[int, int, int, float]]:
    """(m, n, k, relative efficiency) of measured GEMMs ({m, n, k, tflops}): each shape's efficiency
    over the median efficiency of the shapes with every dim at least SHAPE_REFERENCE_MIN_DIM."""
    reference = reference_gemm_tflops(points) / peak_tflops
    return [(int(g["m"]), int(g["n"]), int(g["k"]), g["tflops"] / peak_tflops / reference) for g in points]


def reference_gemm_tflops(points: Sequence[dict[str, float]]) -> float:
    """Median TFLOP/s of the measured GEMMs ({m, n, k, tflops}) with every dim at least
    SHAPE_REFERENCE_MIN_DIM: the shape factor's reference."""
    large = sorted(g["tflops"] for g in points if min(g["m"], g["n"], g["k"]) >= SHAPE_REFERENCE_MIN_DIM)
    if not large:
        raise ValueError(f"no measured GEMM with every dim >= {SHAPE_REFERENCE_MIN_DIM} to normalise by")
    mid = len(large) // 2
    return large[mid] if len(large) % 2 else (large[mid - 1] + large[mid]) / 2


def fit_gemm_shape(points: Sequence[dict[str, float]], peak_tflops: float) -> GemmShape:
    """The GemmShape (scale · mn/(mn + half_mn) · k/(k + half_k)) nearest, in squared log error, to the
    relative efficiencies of measured GEMMs (relative_gemm_efficiency): two half-sizes and a scale,
    monotone in every dim as the search's lower bounds need (a larger micro batch never computes
    slower per token), where an interpolation of the raw points would carry their noise."""
    rel = relative_gemm_efficiency(points, peak_tflops)
    logs = np.array([math.log(f) for *_, f in rel])
    mn = np.array([float(m) * n for m, n, _, _ in rel])
    kk = np.array([float(k) for _, _, k, _ in rel])

    def model(x: np.ndarray) -> np.ndarray:
        scale, half_mn, half_k = math.exp(x[0]), math.exp(x[1]), math.exp(x[2])
        return math.log(scale) + np.log(mn / (mn + half_mn)) + np.log(kk / (kk + half_k))

    x0 = np.array([0.0, math.log(1e6), math.log(256.0)])
    x, _ = nelder_mead(lambda x: float(np.sum((logs - model(x)) ** 2)), x0, iters=2000)
    return GemmShape(scale=math.exp(x[0]), half_mn=math.exp(x[1]), half_k=math.exp(x[2]))


# --------------------------------------------------------------------------- a user's own runs

USER_FREE = ["gemm_max", "attention_max", "hbm_efficiency", "inter_node", "intra_node"]


def load_user_runs(path: str) -> list[MeasuredRun]:
    """MeasuredRun records of a runs YAML, each with the exact plan it states (autopar.validate.user_runs)."""
    from autopar.validate.user_runs import load_user_runs as load

    return load(path)


def held_out_folds(n: int) -> list[range]:
    """The runs each held-out refit leaves out: each run alone (leave-one-out) up to
    MAX_HELD_OUT_FITS runs, above it MAX_HELD_OUT_FITS folds (run i in fold i mod K), so the refits
    grow with the runs, not their square, and every run is still predicted by a fit that never saw it."""
    if n < 2:
        return []
    k = min(n, MAX_HELD_OUT_FITS)
    return [range(f, n, k) for f in range(k)]


def check_calibration_steps(n: int, iters: int) -> None:
    """Refuse, before fitting, a calibration of more than MAX_CALIBRATION_STEPS run-iterations (runs ·
    fits · Nelder-Mead iterations), naming the runs and the --iters it would take."""
    fits = 1 + len(held_out_folds(n))
    steps = n * fits * iters
    if steps <= MAX_CALIBRATION_STEPS:
        return
    most = max((m for m in range(1, n) if m * (1 + len(held_out_folds(m))) * iters <= MAX_CALIBRATION_STEPS),
               default=0)
    fewer = MAX_CALIBRATION_STEPS // (n * fits)
    fix = " or ".join(([f"calibrate on at most {most:,} of the runs"] if most else [])
                      + ([f"lower --iters to {fewer:,}"] if fewer else []))
    raise SchemaError(f"calibrating on {n:,} runs with {fits} fits of {iters:,} iterations is {steps:,} "
                      f"run-iterations, over the {MAX_CALIBRATION_STEPS:,} a calibration takes; "
                      f"{fix or 'calibrate on fewer runs'}")


def runs_gpus(runs: Sequence[MeasuredRun]) -> list[str]:
    """The GPU names (as in hardware profiles) of the runs' clusters, sorted."""
    from autopar.hardware import load_profile

    return sorted({load_profile(r.cluster).gpu.name for r in runs})


def base_for_gpus(gpus: Sequence[str]) -> str:
    """The shipped cost model of these GPUs: what a calibration on their runs starts from and is
    named after. Refused when they have different ones (or none), naming the fix."""
    from autopar.cost.params import cost_model_for_gpu
    from autopar.errors import AutoparError

    gpu_to_base: dict[str, str] = {}
    for gpu in gpus:
        try:
            gpu_to_base[gpu] = cost_model_for_gpu(gpu)[0].name
        except AutoparError:
            raise SchemaError(f"no shipped cost model covers {gpu}, the GPU of the runs; name the one to start "
                              "from with --base (a shipped name or a file)") from None
    bases = sorted(set(gpu_to_base.values()))
    if len(bases) > 1:
        listed = ", ".join(f"{g} ({b})" for g, b in gpu_to_base.items())
        raise SchemaError(f"the runs are on GPUs with different cost models: {listed}; calibrate each GPU's runs "
                          "from their own file, or name one base with --base")
    return bases[0]


def calibrate_user(runs_path: str, base: CostModelFile | None, command: str, free: Sequence[str] = USER_FREE,
                   iters: int = 150) -> tuple[CostModelFile, list[tuple[str, float]]]:
    """Fit on all runs; held out: refit without each run (leave-one-out; above MAX_HELD_OUT_FITS
    runs, without each of that many folds, held_out_folds) and predict what was left out. Returns
    the file and (run_id, held-out error) pairs in run order. A framework with its own GEMM ceiling
    in `base` (torchtitan, DeepSpeed) has it fitted too where the runs use that framework: its runs
    never read the file's. Over MAX_CALIBRATION_STEPS run-iterations, refused before fitting.
    `base` None: the shipped cost model of the runs' GPU (base_for_gpus). The file is named after
    that model ("h100-calibrated") and applies to the runs' GPUs alone (its `gpus`)."""
    from autopar.cost.params import load_cost_model

    runs = stated_runs(runs_path)
    check_calibration_steps(len(runs), iters)
    gpus = runs_gpus(runs)
    shipped = base_for_gpus(gpus) if base is None else _shipped_base(gpus)
    if base is None:
        base = load_cost_model(shipped)[0]
    own = sorted({r.framework for r in runs if "gemm_max" in getattr(base.frameworks.get(r.framework), "compute", {})})
    free = list(free) + [f"{fw}.gemm_max" for fw in own if f"{fw}.gemm_max" not in free]
    result = fit(runs, base, free, rounds=1, iters=iters)
    folds = held_out_folds(len(runs))
    error_of: dict[int, float] = {}
    for fold in folds:
        others = [r for i, r in enumerate(runs) if i not in fold]
        p = params_from_file(fit(others, base, free, rounds=1, iters=iters).file)
        for i in fold:
            pr = predict(runs[i], p)
            error_of[i] = pr.error if pr else math.nan
    loo = [(runs[i].run_id, error_of[i]) for i in sorted(error_of)]
    p = params_from_file(result.file)
    report = FitReport(runs_fit=len(runs), runs_holdout=len(loo), mape_fit=_mape(runs, p),
                       mape_holdout=sum(abs(e) for _, e in loo) / len(loo) if loo else None)
    held = ("leave-one-out" if all(len(f) == 1 for f in folds) else f"{len(folds)}-fold (run i held out in fold "
            f"i mod {len(folds)})")
    notes = (f"Fitted {', '.join(free)} on {len(runs)} user runs on {', '.join(gpus)}; mape_holdout is the {held} "
             f"error. Base file: {base.name} ({base.provenance.method}: {base.provenance.command}).")
    # the runs' GPUs and, with the shipped model of their GPU, the GPUs it covers (one family, e.g. H100s)
    family = load_cost_model(shipped)[0].gpus if shipped else []
    fitted = result.file.model_copy(update={"name": f"{shipped or base.name}-calibrated",
                                            "gpus": sorted({*gpus, *family})})
    return stamp(fitted, command, [runs_source(runs_path)], notes, report), loo


def stated_runs(runs_path: str | Sequence[Any]) -> list[Any]:
    """The runs of a runs YAML, or MeasuredRun records given as they are (autopar.logs' runs from
    training logs)."""
    return load_user_runs(runs_path) if isinstance(runs_path, str) else list(runs_path)


def runs_source(runs_path: str | Sequence[Any]) -> str:
    """The provenance line of the runs: the runs file, or the training logs they were read from."""
    if isinstance(runs_path, str):
        return f"runs file {runs_path}"
    return "training logs: " + "; ".join(r.source_detail for r in runs_path)


def _shipped_base(gpus: Sequence[str]) -> str | None:
    """The shipped cost model of `gpus` (base_for_gpus), None when they have none or several."""
    try:
        return base_for_gpus(gpus)
    except SchemaError:
        return None


def uncalibrated_mape(runs_path: str, base: CostModelFile | None) -> float | None:
    """Mean absolute error of `base` (None: the runs' GPU's shipped model) on the runs, unfitted:
    what a calibration's held-out error must beat to be worth using."""
    from autopar.cost.params import load_cost_model

    runs = stated_runs(runs_path)
    base = base if base is not None else load_cost_model(base_for_gpus(runs_gpus(runs)))[0]
    return _mape(runs, params_from_file(base))
