"""The fitting machinery: Nelder-Mead finds known minima, and the fit recovers a planted parameter."""

from dataclasses import replace

import numpy as np
import pytest

from autopar.calibration.fit import fit, nelder_mead, with_values
from autopar.cost.params import load_cost_model, params_from_file
from autopar.validate.dataset import load_runs
from autopar.validate.runner import predict


def test_nelder_mead_rosenbrock():
    rosen = lambda x: (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
    x, value = nelder_mead(rosen, np.array([-1.0, 1.5]), step=0.5, iters=2000, tol=1e-14)
    assert value < 1e-8 and x == pytest.approx([1.0, 1.0], abs=1e-3)


def test_fit_recovers_planted_gemm_efficiency():
    """vTrain's runs are Megatron-DeepSpeed: the fit recovers DeepSpeed's own efficiency."""
    base, _ = load_cost_model("a100")
    truth = with_values(base, {"deepspeed.gemm_max": 0.55})
    p_truth = params_from_file(truth)
    runs = [r for r in load_runs({"vtrain-multi"})][:12]
    synthetic = [replace(r, measured_tokens_per_s_per_gpu=predict(r, p_truth).predicted_tokens_per_s_per_gpu)
                 for r in runs]
    start = with_values(base, {"deepspeed.gemm_max": 0.8})
    result = fit(synthetic, start, ["deepspeed.gemm_max"], rounds=1, iters=80)
    assert result.file.frameworks["deepspeed"].compute["gemm_max"] == pytest.approx(0.55, rel=1e-3)
    assert result.objective < 1e-4


def test_framework_parameters_fit_only_where_that_framework_ran():
    from autopar.calibration.fit import fittable, without_frameworks

    runs = load_runs({"narayanan21"})  # Megatron only
    assert fittable(["gemm_max", "deepspeed.gemm_max", "torchtitan.gemm_max"], runs) == ["gemm_max"]
    base = with_values(load_cost_model("a100")[0], {"deepspeed.gemm_max": 0.5})
    assert "deepspeed" not in without_frameworks(base, {"deepspeed"}).frameworks
