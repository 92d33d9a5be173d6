"""Precisions beyond fp8 (issue 29): NVFP4 and MXFP8 on Blackwell, FP8 on AMD, and the refusal of a
format the GPU or the framework lacks."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.api import estimate_plan, load_cluster, load_model, make_plan
from autopar.cli import app
from autopar.cost.compute import gemm_peak_flops
from autopar.cost.params import load_cost_model
from autopar.errors import InvalidPlanError
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv

RUNNER = CliRunner()
PLAN = dict(tp=4, pp=2, global_batch=128, seq_len=8192)


def _step_s(cluster: str, precision: str, gpus: int = 64) -> float:
    plan = make_plan(**PLAN, precision=precision)
    return estimate_plan("llama3-70b", cluster, gpus, plan).step_time_s


def test_nvfp4_is_faster_than_fp8_on_gb200_and_fp8_than_bf16():
    bf16, fp8, mxfp8, nvfp4 = (_step_s("gb200-nvl72", p) for p in ("bf16", "fp8", "mxfp8", "nvfp4"))
    assert nvfp4 < fp8 < bf16
    assert mxfp8 == fp8  # MXFP8 GEMMs at the FP8 tensor-core rate, the casts priced alike
    assert fp8 / nvfp4 > 1.2  # the GEMMs are most of a 70B step


def test_gemm_rates_hand_worked():
    c = load_cluster("gb200-nvl72", 8)
    _, p = load_cost_model("gb200")
    peaks = c.peak_flops_by_dtype
    assert gemm_peak_flops("bf16", peaks, p) == 2500e12
    assert gemm_peak_flops("fp8", peaks, p) == 2500e12 * p.fp8_speedup  # the expression the estimate always used
    assert gemm_peak_flops("mxfp8", peaks, p) == gemm_peak_flops("fp8", peaks, p)
    # no measured fp4 gain: derived as fp8's gain times the dense fp4/fp8 peak ratio, 10,000/5,000 on GB200
    assert p.fp4_speedup == 0.0
    assert gemm_peak_flops("nvfp4", peaks, p) == pytest.approx(2500e12 * p.fp8_speedup * 2)
    g = load_cluster("gb300-nvl72", 8)  # Blackwell Ultra: 15,000 dense fp4 over 5,000 fp8
    _, q = load_cost_model("gb300")
    assert gemm_peak_flops("nvfp4", g.peak_flops_by_dtype, q) == pytest.approx(2500e12 * q.fp8_speedup * 3)


@pytest.mark.parametrize("cluster, precision, lists", [
    ("dgx-h100", "nvfp4", "fp8"), ("dgx-h100", "mxfp8", "fp8"), ("dgx-a100-80gb", "fp8", "none"),
    ("mi300x", "mxfp8", "fp8"), ("mi355x", "nvfp4", "fp8, mxfp8, mxfp4"),
])
def test_a_precision_the_gpu_lacks_is_refused(cluster, precision, lists):
    with pytest.raises(InvalidPlanError, match=f"no {precision} tensor cores \\(its profile lists {lists} besides bf16\\)"):
        estimate_plan("llama3-70b", cluster, 64, make_plan(**PLAN, precision=precision))


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_nvfp4_on_h100_is_one_line_exit_2(command):
    layout = ["--tp", "4", "--pp", "2"] if command == "estimate" else ["-q"]
    result = RUNNER.invoke(app, [command, "llama3-70b", "-c", "dgx-h100", "-n", "64", "-b", "128", "-s", "8192",
                                 *layout, "--precision", "nvfp4"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no nvfp4 tensor cores" in lines[0]
    assert "use --precision bf16 or fp8" in lines[0] and "Traceback" not in result.output


def test_a_precision_the_framework_lacks_is_refused():
    with pytest.raises(InvalidPlanError, match="torchtitan has no nvfp4 training recipe \\(it offers bf16, fp8\\)"):
        estimate_plan("llama3-70b", "gb200-nvl72", 64, make_plan(tp=1, pp=2, global_batch=128, seq_len=8192,
                                                                  precision="nvfp4", framework="torchtitan"))
    with pytest.raises(InvalidPlanError, match="megatron has no mxfp4 training recipe"):
        estimate_plan("llama3-70b", "mi355x", 64, make_plan(**PLAN, precision="mxfp4"))


def test_fp8_on_amd_is_priced_at_its_own_gain():
    """MI300X: fp8 (e4m3fnuz) at the derived SemiAnalysis gain, faster than bf16, slower than the 2x peak ratio."""
    bf16, fp8 = _step_s("mi300x", "bf16"), _step_s("mi300x", "fp8")
    _, p = load_cost_model("mi300x")
    assert 1.0 < p.fp8_speedup < 2.0 and fp8 < bf16 < 2 * fp8


def test_block_scaled_activations_are_saved_at_fp8_bytes():
    """Transformer Engine saves a low-precision GEMM input for the weight gradient at (at most) one byte."""
    bf16, fp8, nvfp4 = (estimate_plan("llama3-70b", "gb200-nvl72", 64, make_plan(**PLAN, precision=p))
                        for p in ("bf16", "fp8", "nvfp4"))
    act = lambda e: e.memory_breakdown_bytes["activations"]  # noqa: E731
    assert act(nvfp4) == act(fp8) < act(bf16)


@pytest.mark.parametrize("precision, flags, dests", [
    ("mxfp8", ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"], {"fp8": "e4m3", "fp8_recipe": "mxfp8"}),
    ("nvfp4", ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"], {"fp4": "e2m1", "fp4_recipe": "nvfp4", "fp8": None}),
])
def test_megatron_export_writes_the_recipe(precision, flags, dests):
    from autopar.export import megatron_args
    from autopar.schema.plan_file import PlanFile, PlanTarget

    plan = make_plan(**PLAN, precision=precision)
    pf = PlanFile(autopar_version="0.1.0", parallel=plan, target=PlanTarget(
        model="llama3-70b", model_spec=load_model("llama3-70b").spec, cluster="gb200-nvl72", gpus=64))
    args = megatron_args(pf)
    joined = " ".join(args)
    assert " ".join(flags) in joined and "--bf16" in args
    parsed = parse_megatron_argv(args)
    assert {k: parsed[k] for k in dests} == dests
    assert megatron_violations(args, 64) == []
