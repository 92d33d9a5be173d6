"""GEMM efficiency carried from one GPU to another by a published kernel benchmark.

A cost model's `gemm_max` is the fraction of the GPU's dense peak that a framework's large GEMMs reach
in a training step. Fitted on one GPU's runs, it holds two things: how far that GPU's matmul kernels
stay from its datasheet peak, and what the framework loses around them. Only the first differs between
GPUs of one software stack, and a kernel benchmark measures it: the Maximum Achievable Matmul FLOPS
(MAMF) table of the ML Engineering Open Book (cost_models/measured/matmul_ceilings.json, its source
inside). So a GPU without runs of its own takes a fitted GPU's `gemm_max` times the ratio of their
bf16 MAMF efficiencies:

    gemm_max(to) = gemm_max(from) · mamf_efficiency(to) / mamf_efficiency(from)

The fp8 gain over bf16 (`fp8_speedup`) is left to the fit it comes from: the table's float8 rows time
torch._scaled_mm with per-tensor scales, not Transformer Engine's recipes with their casts and amax
reductions, which is what a fitted fp8 gain holds. Used by the leave-one-source-out refit when every
run of a GPU is withheld (autopar.calibration.loso) and by `python -m autopar.calibration.ceilings`,
which rewrites the derived cost models' `gemm_max` (those without runs of their own).
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

from autopar.data import data_dir

CEILINGS_FILE = "measured/matmul_ceilings.json"

# Derived cost models (no runs of their own) -> the fitted cost model whose gemm_max they carry.
DERIVED_FROM = {"b200": "gb200", "b300": "gb200", "mi300x": "h100", "mi325x": "h100", "mi355x": "h100"}

_AMD = ("mi300x", "mi325x", "mi355x")


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads((data_dir("cost_models") / CEILINGS_FILE).read_text(encoding="utf-8"))


def mamf_efficiency(gpu: str, precision: str = "bf16") -> float | None:
    """MAMF / dense peak of cost-model family `gpu` (e.g. "h100", "gb200"), None where the table has no row."""
    row = _table()[precision].get(gpu)
    return None if row is None else float(row["efficiency"])


def amd_fp8_gain_ratio() -> float:
    """AMD's fp8-over-bf16 GEMM gain relative to H100's, from the file's `fp8_gain_benchmark` (a GEMM
    benchmark of both stacks; the MAMF table has no AMD fp8 row): (990/620)/(1,280/720) = 0.898."""
    bench = _table()["fp8_gain_benchmark"]
    gain = {gpu: bench[gpu]["fp8_tflops"] / bench[gpu]["bf16_tflops"] for gpu in ("mi300x", "h100")}
    return gain["mi300x"] / gain["h100"]


def carried_gemm_max(value: float, from_gpu: str, to_gpu: str) -> float:
    """`value` (a gemm_max fitted on `from_gpu`) carried to `to_gpu` by their bf16 MAMF efficiencies;
    unchanged where either has no row (the fraction of peak is then taken as it is)."""
    a, b = mamf_efficiency(from_gpu), mamf_efficiency(to_gpu)
    if a is None or b is None:
        return value
    return value * b / a


def source_line(from_gpu: str, to_gpu: str, fitted: float) -> str:
    """The constant_sources line of a carried gemm_max."""
    a, b = mamf_efficiency(from_gpu), mamf_efficiency(to_gpu)
    ta, tb = _table()["bf16"][from_gpu], _table()["bf16"][to_gpu]
    return (f"derived from a kernel benchmark: the {from_gpu} fit's gemm_max ({fitted:.4f}) times the {to_gpu}/{from_gpu} "
            f"ratio of bf16 Maximum Achievable Matmul FLOPS efficiencies, {tb['mamf_tflops']:,.1f}/{tb['peak_tflops']:,} over "
            f"{ta['mamf_tflops']:,.1f}/{ta['peak_tflops']:,} = {b:.3f}/{a:.3f}: {carried_gemm_max(fitted, from_gpu, to_gpu):.4f}; "
            + _table()["source"])


def rewrite_derived(names: list[str] | None = None) -> list[str]:
    """Rewrite `gemm_max` (and its constant_sources line) of the derived cost models from their donors'
    current fits. Returns the files written."""
    root = data_dir("cost_models")
    written = []
    for name in names or sorted(DERIVED_FROM):
        donor = DERIVED_FROM[name]
        fitted = json.loads((root / f"{donor}.json").read_text(encoding="utf-8"))["compute"]["gemm_max"]
        path = root / f"{name}.json"
        content = json.loads(path.read_text(encoding="utf-8"))
        content["compute"]["gemm_max"] = round(carried_gemm_max(fitted, donor, name), 4)
        content["constant_sources"]["compute.gemm_max"] = source_line(donor, name, fitted)
        if name in _AMD:
            gain = json.loads((root / f"{donor}.json").read_text(encoding="utf-8"))["compute"]["fp8_speedup"]
            ratio = amd_fp8_gain_ratio()
            content["compute"]["fp8_speedup"] = round(gain * ratio, 4)
            content["constant_sources"]["compute.fp8_speedup"] = (
                f"derived from a kernel benchmark: the {donor} fit's fp8_speedup ({gain:.3f}) times the AMD/H100 "
                f"ratio of fp8-over-bf16 GEMM gains, (990/620)/(1,280/720) = {ratio:.3f}: "
                f"{gain * ratio:.4f}; SemiAnalysis, 'MI300X vs H100 vs H200 Benchmark Part 1: Training' "
                "(Dec 2024), GEMM benchmark, large shapes (read from the charts, +-10 %): MI300X ~620 TFLOP/s BF16, "
                "~990 FP8 (hipBLASLt); H100 ~720 BF16, ~1,280 FP8 (cuBLASLt); the MAMF table has no AMD fp8 row")
        content["provenance"]["command"] = ("python -m autopar.calibration.ceilings (gemm_max" + (
            ", fp8_speedup" if name in _AMD else "") + f" from {donor}.json); every other constant by the formula "
            "its constant_sources line states (docs/hardware.md, 'Cost models')")
        if _table()["source"] not in content["provenance"]["sources"]:
            content["provenance"]["sources"].append(_table()["source"])
        path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(str(path))
    return written


if __name__ == "__main__":  # python -m autopar.calibration.ceilings [NAME ...]
    for line in rewrite_derived(sys.argv[1:] or None):
        print("wrote", line)
