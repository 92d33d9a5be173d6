"""The stable JSON records of plans and estimates (`--json` of plan, estimate, compare, explain,
sweep; the `estimate` block of a plan file). Keys are listed in the README and frozen by
tests/cli_surface.json."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from autopar.cost.step import Estimate
from autopar.schema.plan import ParallelPlan
from autopar.validate.bands import estimate_band, estimate_band_sources


def estimate_to_dict(e: Estimate, plan: ParallelPlan) -> dict[str, Any]:
    """The stable JSON shape of the estimate of `plan`. `fits` means peak_memory_bytes ≤
    usable_memory_bytes = memory_capacity_bytes · (1 − memory_margin); tokens_per_s_per_gpu_low/high
    are the error band of the plan's regime (autopar.validate.bands), resting on band_sources sources."""
    low, high = estimate_band(plan, e)
    return {
        "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
        "tokens_per_s_per_gpu_low": low, "tokens_per_s_per_gpu_high": high,
        "band_sources": estimate_band_sources(plan, e),
        "model_tflops_per_gpu": e.model_tflops_per_gpu, "hardware_tflops_per_gpu": e.hardware_tflops_per_gpu,
        "mfu": e.mfu, "peak_memory_bytes": e.peak_memory_bytes, "memory_capacity_bytes": e.memory_capacity_bytes,
        "usable_memory_bytes": e.usable_memory_bytes, "memory_margin": e.memory_margin,
        "fits": e.fits, "num_microbatches": e.num_microbatches, "dp": e.dp,
        "bubble_fraction": e.bubble_fraction, "exposed_comm_fraction": e.exposed_comm_fraction,
        "time_breakdown_s": dict(e.time_breakdown_s), "memory_breakdown_bytes": dict(e.memory_breakdown_bytes),
        "stages": [asdict(s) for s in e.stages], "notes": list(e.notes),
    }


def plan_to_dict(plan: ParallelPlan, num_gpus: int) -> dict[str, Any]:
    """The plan's axes under the names the CLI uses (dp derived)."""
    d = plan.plan_json()  # = model_dump(mode="json"), without building Pydantic's serializer
    d["dp"] = plan.dp_for(num_gpus)
    d["etp"] = plan.expert_tp
    d["sp"] = plan.sequence_parallel
    d["schedule"] = plan.schedule
    return d


def plan_entry(plan: ParallelPlan, est: Estimate, gpus: int) -> dict[str, Any]:
    """One element of `plan --json` / `compare --json`: {"parallel": ..., "estimate": ...}."""
    return {"parallel": plan_to_dict(plan, gpus), "estimate": estimate_to_dict(est, plan)}
