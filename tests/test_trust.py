"""Bands calibrated at the source level and plan ranking (autopar.calibration.trust): hand-worked
cases, and the shipped bands' own promises (coverage, point inside, sources)."""

from __future__ import annotations

import json

import pytest

from autopar.calibration.trust import (
    BAND_COVERAGE_TARGET, Residual, Scored, calibrate_bands, interval, rank_accuracy, ranked_right, ratio_error,
    weighted_quantile,
)
from autopar.data import data_dir
from autopar.validate.bands import BANDS_FILE, error_band
from autopar.validate.regimes import REGIMES


def test_weighted_quantile_by_hand() -> None:
    # values 1..4 with weights 1,1,1,5 (total 8): cumulative 1,2,3,8 -> q 0.5 needs 4 -> value 4.
    assert weighted_quantile([1, 2, 3, 4], [1, 1, 1, 5], 0.5) == 4
    assert weighted_quantile([1, 2, 3, 4], [1, 1, 1, 5], 0.25) == 2
    assert weighted_quantile([3, 1, 2], [1, 1, 1], 0.0) == 1


def test_interval_always_holds_zero_and_widens_about_it() -> None:
    rs = [Residual("a", "moe", v) for v in (0.10, 0.20, 0.30)]  # all one-signed: the point must stay inside
    lo, hi = interval(rs, 0.0, 1.0)
    assert (lo, hi) == (0.0, 0.30)
    lo, hi = interval(rs, 0.0, 2.0)
    assert (lo, hi) == (0.0, pytest.approx(0.60))


def _sources(values_by_source: dict[str, list[float]], regime: str = "dense<=8k") -> list[Residual]:
    return [Residual(s, regime, v) for s, vs in values_by_source.items() for v in vs]


def test_band_is_the_narrowest_step_that_holds_on_a_withheld_source() -> None:
    # Four sources, five runs each at ±0.05 except source d at +0.15. At q 0.10 the band built
    # without d is [-0.05, 0.05]: d's runs fall outside (coverage 15/20 = 0.75 < 0.80), so the
    # family widens. Every q gives the same interval here; widen 1.25 gives [-0.0625, 0.0625],
    # still short; 1.5 -> 0.075, 2.0 -> 0.10 still short of 0.15; 3.0 -> 0.15: every run of d
    # inside. Equal widths go to the smaller widening, then the larger q: (0.10, 3.0).
    rs = _sources({"a": [-0.05, 0.05] * 2 + [0.0], "b": [-0.05, 0.05] * 2 + [0.0],
                   "c": [-0.05, 0.05] * 2 + [0.0], "d": [0.15] * 5})
    out = calibrate_bands(rs, ["dense<=8k"])
    band = out["bands"]["dense<=8k"]
    assert (band["quantile"], band["widen"]) == (0.1, 3.0)
    assert band["band_coverage"] == 1.0
    assert band["low"] == pytest.approx(-0.15) and band["high"] == pytest.approx(0.45)  # all sources, widened 3x
    assert band["sources"] == 4 and not band["widened"]
    assert out["band_coverage"] >= BAND_COVERAGE_TARGET


def test_regime_on_fewer_than_three_sources_holds_the_overall_band_and_says_so() -> None:
    rs = _sources({"a": [-0.1, 0.1], "b": [-0.1, 0.1], "c": [-0.1, 0.1]}) + _sources({"t": [0.02, 0.04]}, "moe")
    out = calibrate_bands(rs, ["dense<=8k", "moe"])
    moe = out["bands"]["moe"]
    assert moe["widened"] and moe["sources"] == 1 and "fewer than 3" in moe["note"]
    # Its own interval is [0, 0.04]; the overall one of all runs is wider: the union holds both.
    assert moe["low"] <= -0.1 + 1e-12 and moe["high"] >= 0.1 - 1e-12
    assert moe["bias"] == pytest.approx(0.03)


def _scored(source, group, setting, predicted, measured) -> Scored:
    return Scored(source, group, setting, predicted, measured)


def test_ranking_by_hand() -> None:
    a = _scored("s", ("m",), ("tp2",), 100.0, 110.0)
    b = _scored("s", ("m",), ("tp4",), 90.0, 100.0)   # measured a > b by 10 %, predicted a > b: right
    c = _scored("s", ("m",), ("tp8",), 120.0, 101.0)  # b vs c: measured 1 % apart: a tie, right either way
    assert ranked_right(a, b) and ranked_right(b, c)
    assert not ranked_right(a, c)  # measured a > c by 8.9 %, predicted c > a
    assert ratio_error(a, b) == pytest.approx((100 / 90) / (110 / 100) - 1)
    other = _scored("t", ("m",), ("tp2",), 1.0, 1.0)  # another source is never paired with s
    acc = rank_accuracy([a, b, c, other])
    assert acc["pairs"] == 3 and acc["correct_share"] == pytest.approx(2 / 3)
    assert acc["sources"] == [{"source": "s", "pairs": 3, "correct_share": pytest.approx(2 / 3)}]


def test_same_setting_is_not_a_pair() -> None:
    a = _scored("s", ("m",), ("tp2",), 100.0, 110.0)
    assert rank_accuracy([a, _scored("s", ("m",), ("tp2",), 100.0, 120.0)])["pairs"] == 0


def _shipped() -> dict:
    return json.loads((data_dir("cost_models") / "bands" / BANDS_FILE).read_text(encoding="utf-8"))


def test_shipped_bands_hold_on_withheld_sources_and_contain_the_point() -> None:
    content = _shipped()
    assert content["provenance"]["band_coverage"] >= BAND_COVERAGE_TARGET
    assert content["overall"]["band_coverage"] >= BAND_COVERAGE_TARGET
    for regime, band in content["bands"].items():
        assert regime in REGIMES
        assert band["low"] <= 0.0 <= band["high"], regime
        assert band["band_coverage"] >= BAND_COVERAGE_TARGET, regime
        assert band["widened"] == (band["sources"] < 3), regime
        shipped = error_band(regime)
        assert shipped.low_factor <= 1.0 <= shipped.high_factor
        assert shipped.sources == band["sources"]


def test_estimate_json_names_the_sources_its_band_rests_on() -> None:
    from autopar import api
    from autopar.report.records import estimate_to_dict

    plan = api.plan_from_assignments("tp=1,pp=1,mbs=1", 8, 16, 8192)
    est = api.estimate_plan("llama3-8b", "dgx-h100", 8, plan)
    d = estimate_to_dict(est, plan)
    assert d["band_sources"] == error_band("dense<=8k").sources >= 3
    assert d["tokens_per_s_per_gpu_low"] <= d["tokens_per_s_per_gpu"] <= d["tokens_per_s_per_gpu_high"]


@pytest.mark.parametrize("run_id", [
    "torchtitan2412_llama31_8b_8gpu_fsdp", "torchtitan2412_llama31_8b_8gpu_fsdp_compile",
    "torchtitan2412_llama31_8b_8gpu_fsdp_compile_fp8", "torchtitan2412_llama31_8b_128gpu_fsdp",
    "torchtitan2412_llama31_8b_128gpu_fsdp_compile", "torchtitan2412_llama31_8b_128gpu_fsdp_compile_fp8",
    "torchtitan2412_llama31_8b_8gpu_cp1_seq32k", "torchtitan2412_llama31_8b_8gpu_cp2_seq64k",
    "torchtitan2412_llama31_8b_8gpu_cp4_seq128k", "torchtitan2412_llama31_8b_8gpu_cp8_seq256k",
])
def test_every_measured_peak_is_predicted_within_ten_percent(run_id: str) -> None:
    # pytorch/torchtitan docs/performance.md (Dec 2024): max reserved memory per GPU, as each row gives it;
    # predicted by the shipped H100 model under the plan validate picks for the run.
    from autopar.validate.dataset import load_runs
    from autopar.validate.runner import predict
    from autopar.cost.params import load_cost_model, params_from_file

    measured = [r for r in load_runs() if r.measured_memory_gib is not None]
    assert {r.run_id for r in measured} == {  # every measured peak of the sets is one case here
        "torchtitan2412_llama31_8b_8gpu_fsdp", "torchtitan2412_llama31_8b_8gpu_fsdp_compile",
        "torchtitan2412_llama31_8b_8gpu_fsdp_compile_fp8", "torchtitan2412_llama31_8b_128gpu_fsdp",
        "torchtitan2412_llama31_8b_128gpu_fsdp_compile", "torchtitan2412_llama31_8b_128gpu_fsdp_compile_fp8",
        "torchtitan2412_llama31_8b_8gpu_cp1_seq32k", "torchtitan2412_llama31_8b_8gpu_cp2_seq64k",
        "torchtitan2412_llama31_8b_8gpu_cp4_seq128k", "torchtitan2412_llama31_8b_8gpu_cp8_seq256k"}
    run = next(r for r in measured if r.run_id == run_id)
    pred = predict(run, params_from_file(load_cost_model("h100")[0]))
    assert abs(pred.memory_error) <= 0.10, (run_id, pred.memory_error)
