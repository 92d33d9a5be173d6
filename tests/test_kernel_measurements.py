"""The shipped attention-kernel rates and the fit's plausible ranges against our own H200 kernel
measurement (cost_models/measured/h200_kernels.json: torch SDPA on one H200, 2026-11-30)."""

import json

import pytest

from autopar.calibration.fit import (PLAUSIBLE_RANGE, _bounds, _from_free, _to_free, fp8_gain_max,
                                     hopper_precise_fp8_gain)
from autopar.cost.params import load_cost_model
from autopar.data import data_dir

H100_BF16_PEAK_FLOPS = 989e12  # H100/H200 SXM dense BF16 datasheet peak (same compute die)


def _measured():
    return json.loads((data_dir("cost_models") / "measured" / "h200_kernels.json").read_text())


@pytest.mark.parametrize("family,backend", [("fa2", "flash"), ("cudnn", "cudnn")])
def test_shipped_attention_rates_match_the_h200_measurement(family, backend):
    """FlashAttention-3 paper rates (H100) vs SDPA measured on H200 (same SMs and clocks), causal,
    head dim 128, 8K-16K tokens: within 15 % forward and backward."""
    table = load_cost_model("h200")[0].attention_kernels[family]
    rows = [r for r in _measured()["attention"] if r.get("backend") == backend and r.get("head_dim") == 128
            and r.get("causal") and r.get("seq") in (8192, 16384)]
    assert len(rows) == 2
    fwd = sum(r["fwd_tflops"] for r in rows) / 2 * 1e12 / H100_BF16_PEAK_FLOPS
    bwd = sum(r["bwd_tflops"] for r in rows) / 2 * 1e12 / H100_BF16_PEAK_FLOPS
    assert table.fwd == pytest.approx(fwd, rel=0.15)
    assert table.bwd == pytest.approx(bwd, rel=0.15)


def test_gemm_ceiling_is_above_every_measured_gemm():
    """gemm_max's plausible ceiling (0.9) lies above the best bf16 GEMM measured (765 of 989 TFLOP/s)."""
    best = max(g["tflops"] for g in _measured()["gemm"]) * 1e12 / H100_BF16_PEAK_FLOPS
    assert 0.7 < best < PLAUSIBLE_RANGE["gemm_max"][1]


def test_bounded_transform_round_trips_and_stays_in_range():
    lo, hi = _bounds("deepspeed.gemm_max")
    assert (lo, hi) == PLAUSIBLE_RANGE["gemm_max"]
    for v in (0.31, 0.6, 0.89):
        assert _from_free(_to_free(v, "unit", (lo, hi)), "unit", (lo, hi)) == pytest.approx(v)
    assert lo < _from_free(40.0, "unit", (lo, hi)) <= hi + 1e-12
    assert lo - 1e-12 <= _from_free(-40.0, "unit", (lo, hi)) < hi
    assert _bounds("gemm_half_dim") == (0.0, 1.0)


def test_hopper_fp8_gain_bound_is_worked_from_the_h200_gemms():
    """Hand-worked: the 41 measured shapes with every dim >= 4096 have median rates 694.1 (bf16) and
    1,226.1 (fp8, full-precision accumulation) TFLOP/s: 1.766. With the forward GEMM's fast accumulation
    at most the datasheet's 2x, the three GEMMs of a linear gain at most 3 / (1/2 + 2/1.766) = 1.838."""
    assert hopper_precise_fp8_gain() == pytest.approx(1226.08 / 694.12, rel=1e-4)
    assert fp8_gain_max(["H100 SXM5 80GB"]) == pytest.approx(1.838, abs=5e-4)
    assert fp8_gain_max(["H800 SXM5 80GB", "H200 SXM5 141GB"]) == fp8_gain_max(["H100 SXM5 80GB"])
    assert fp8_gain_max(["GB200 186GB"]) == 2.0 and fp8_gain_max([]) == 2.0


def test_fp8_gain_transform_stays_inside_its_bound():
    f = load_cost_model("h100")[0]
    lo, hi = _bounds("torchtitan.fp8_speedup", f)
    assert (lo, hi) == (1.0, fp8_gain_max(f.gpus))
    for v in (1.2, 1.6, 1.8):
        assert _from_free(_to_free(v, "gain", (lo, hi)), "gain", (lo, hi)) == pytest.approx(v)
    # a start on or above the bound begins 1 % inside it, where a simplex step still moves it
    assert _from_free(_to_free(1.95, "gain", (lo, hi)), "gain", (lo, hi)) == pytest.approx(hi - 0.01 * (hi - 1))
    assert _from_free(40.0, "gain", (lo, hi)) <= hi + 1e-12


@pytest.mark.parametrize("name", ["h100", "h800", "h200", "gb200"])
def test_shipped_fp8_gains_are_within_their_bound(name):
    f = load_cost_model(name)[0]
    gains = [f.compute.fp8_speedup] + [fw.compute["fp8_speedup"] for fw in f.frameworks.values()
                                       if "fp8_speedup" in fw.compute]
    assert all(1.0 < g <= fp8_gain_max(f.gpus) + 1e-6 for g in gains), gains


@pytest.mark.parametrize("name", ["a100", "h100"])
def test_shipped_fitted_efficiencies_are_plausible(name):
    f = load_cost_model(name)[0]
    values = {"gemm_max": f.compute.gemm_max, "hbm_efficiency": f.compute.hbm_efficiency,
              "inter_node": f.network.inter_node, "intra_node": f.network.intra_node}
    for fw in f.frameworks.values():
        values.update({f"{fw.source[:20]}.{k}": v for k, v in {**fw.compute, **fw.network}.items()
                       if k in PLAUSIBLE_RANGE})
    for key, v in values.items():
        lo, hi = PLAUSIBLE_RANGE[key.split(".")[-1]]
        assert lo - 1e-6 <= v <= hi + 1e-6, (key, v)
