"""GEMM shape factor (CostModelFile.gemm_shape): scale · mn/(mn + half_mn) · k/(k + half_k),
fitted to our H200 kernel measurements, multiplying the run-fitted gemm_max. Hand-worked cases,
and the shipped constants reproduced from the measurement file they cite."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from autopar.calibration.fit import fit_gemm_shape, relative_gemm_efficiency
from autopar.cost.compute import gemm_efficiency, gemm_time_s
from autopar.cost.layer import gemm_pass_times_s
from autopar.cost.params import load_cost_model

ROOT = Path(__file__).parent.parent
KERNELS = json.loads((ROOT / "cost_models" / "measured" / "h200_kernels.json").read_text())


def test_relative_efficiency_is_each_shape_over_the_large_shape_median():
    # Peak 1000 TFLOP/s: efficiencies 0.7 and 0.8 for the two large shapes (median 0.75), 0.35 for k = 512.
    points = [{"m": 4096, "n": 4096, "k": 4096, "tflops": 700.0}, {"m": 8192, "n": 8192, "k": 8192, "tflops": 800.0},
              {"m": 4096, "n": 4096, "k": 512, "tflops": 350.0}]
    assert relative_gemm_efficiency(points, 1000.0) == [
        (4096, 4096, 4096, pytest.approx(0.7 / 0.75)), (8192, 8192, 8192, pytest.approx(0.8 / 0.75)),
        (4096, 4096, 512, pytest.approx(0.35 / 0.75))]
    with pytest.raises(ValueError):
        relative_gemm_efficiency(points[2:], 1000.0)


def test_fit_recovers_the_parameters_of_exact_data():
    scale, half_mn, half_k = 1.05, 2.0e6, 400.0
    shapes = [(m, n, k) for m in (1024, 4096, 8192) for n in (1024, 4096, 16384) for k in (256, 1024, 4096, 16384)]
    big = [(m, n, k) for m, n, k in shapes if min(m, n, k) >= 4096]
    f = {s: scale * (s[0] * s[1] / (s[0] * s[1] + half_mn)) * (s[2] / (s[2] + half_k)) for s in shapes}
    ref = sorted(f[s] for s in big)[len(big) // 2]  # odd count: the median itself
    points = [{"m": m, "n": n, "k": k, "tflops": 1000.0 * 0.7 * f[(m, n, k)] / ref} for m, n, k in shapes]
    g = fit_gemm_shape(points, 1000.0)
    assert g.half_mn == pytest.approx(half_mn, rel=0.02) and g.half_k == pytest.approx(half_k, rel=0.02)
    assert g.scale == pytest.approx(scale / ref, rel=0.01)


@pytest.mark.parametrize("name", ["h100", "h800", "h200"])
def test_shipped_shape_is_the_fit_to_the_h200_measurement(name):
    f, _ = load_cost_model(name)
    for dtype, key, peak in (("bf16", "gemm", 989.0), ("fp8", "fp8_gemm", 1979.0)):
        g = fit_gemm_shape(KERNELS[key], peak)
        assert getattr(f.gemm_shape, dtype).model_dump() == pytest.approx(g.model_dump(), rel=1e-9)
    assert "h200_kernels.json" in f.constant_sources["gemm_shape"]
    # What the measurement says, by hand: the bf16 4096² GEMM at k = 512 ran at 389 TFLOP/s against a
    # large-shape median of 0.7018 · 989 = 694 TFLOP/s, 0.56 of it; the fitted factor agrees within 5 %.
    b = f.gemm_shape.bf16
    factor = b.scale * (4096 * 4096 / (4096 * 4096 + b.half_mn)) * (512 / (512 + b.half_k))
    measured = next(g["tflops"] for g in KERNELS["gemm"] if (g["m"], g["n"], g["k"]) == (4096, 4096, 512))
    assert measured / (0.70184 * 989.0) == pytest.approx(0.56, abs=0.005)
    assert factor == pytest.approx(0.56, rel=0.05)


def _params_with(shape, shape_fp8=None):
    _, p = load_cost_model("h100")
    return replace(p, gemm_shape=shape, gemm_shape_fp8=shape_fp8, gemm_table=())


def test_efficiency_is_gemm_max_times_saturation_times_the_shape_factor():
    p = _params_with((1.1, 1.0e6, 500.0))
    h = p.gemm_half_dim
    sat = (4096 / (4096 + h)) ** 2 * (512 / (512 + h))
    factor = 1.1 * (4096 * 4096 / (4096 * 4096 + 1.0e6)) * (512 / (512 + 500.0))
    assert gemm_efficiency(4096, 4096, 512, p) == pytest.approx(p.gemm_max * sat * factor)
    # Monotone in every dim, as the search's lower bounds need: more tokens never compute slower.
    for dim in range(3):
        small, large = [4096, 4096, 512], [4096, 4096, 512]
        large[dim] *= 2
        assert gemm_efficiency(*large, p) > gemm_efficiency(*small, p)


def test_fp8_gemms_use_their_own_fit():
    p = _params_with((1.0, 0.0, 500.0), (1.0, 0.0, 1500.0))
    ratio = gemm_efficiency(4096, 4096, 512, p, fp8=True) / gemm_efficiency(4096, 4096, 512, p)
    assert ratio == pytest.approx((512 / 2012) / (512 / 1012))
    q = _params_with((1.0, 0.0, 500.0))  # no fp8 fit: the bf16 one
    assert gemm_efficiency(4096, 4096, 512, q, fp8=True) == gemm_efficiency(4096, 4096, 512, q)


def test_backward_gemms_are_priced_at_their_own_shapes():
    # A projection with k = 512 (hidden/tp) and n = 4096: forward (m × n, inner k) is the starved shape;
    # dgrad dx = dy·Wᵀ is (m × k, inner n) and wgrad dW = xᵀ·dy is (k × n, inner m).
    p = _params_with((1.0, 0.0, 500.0))  # factor k/(k + 500): depth only
    peak, h = 989e12, p.gemm_half_dim
    sat = (8192 / (8192 + h)) * (4096 / (4096 + h)) * (512 / (512 + h))
    flops = 2.0 * 8192 * 4096 * 512
    fwd, bwd = gemm_pass_times_s(8192, 4096, 512, 1.0, 2.0, peak, 0.0, p)
    assert fwd == pytest.approx(flops / (peak * p.gemm_max * sat * 512 / 1012) + p.kernel_overhead_s)
    expected_bwd = (flops / (peak * p.gemm_max * sat * 4096 / 4596) + flops / (peak * p.gemm_max * sat * 8192 / 8692)
                    + 2 * p.kernel_overhead_s)
    assert bwd == pytest.approx(expected_bwd)
    assert fwd == pytest.approx(gemm_time_s(8192, 4096, 512, peak, p))
    assert math.isclose(bwd, gemm_time_s(8192, 512, 4096, peak, p) + gemm_time_s(512, 4096, 8192, peak, p))
