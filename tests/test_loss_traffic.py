"""The loss's HBM traffic, per framework and per switch, hand-worked from each framework's code
(autopar.frameworks: megatron UNFUSED_LOSS_BYTES / FUSED_LOSS_BYTES, torchtitan EAGER_LOSS_BYTES)."""

from __future__ import annotations

import pytest

from autopar.cost.compute import memory_bound_time_s
from autopar.cost.layer import loss_s
from autopar.cost.params import load_cost_model
from autopar.cost.step import estimate, setup
from autopar.export import megatron_args, plan_from_megatron_args
from autopar.frameworks import framework_profile
from autopar.frameworks.megatron import FUSED_LOSS_BYTES, UNFUSED_LOSS_BYTES
from autopar.frameworks.torchtitan import EAGER_LOSS_BYTES
from autopar.hardware import load_cluster
from autopar.schema.plan import ParallelPlan, plan_violations
from autopar.validate.dataset import load_runs
from autopar.validate.runner import _graph_for

_, H100 = load_cost_model("h100")

FP32, BF16 = 4, 2


def test_megatron_unfused_cross_entropy_op_by_op():
    """megatron/core/tensor_parallel/cross_entropy.py (core_r0.8.0): .float() of the bf16 logits,
    max, subtract, exp, sum, divide in place; backward: mul_ by the loss gradient, then the cast's
    backward to bf16."""
    forward = (BF16 + FP32) + FP32 + 2 * FP32 + 2 * FP32 + FP32 + 2 * FP32
    backward = 2 * FP32 + (FP32 + BF16)
    assert UNFUSED_LOSS_BYTES == (forward, backward) == (38.0, 14.0)


def test_megatron_fused_cross_entropy_kernel_by_kernel():
    """megatron/core/fusions/fused_cross_entropy.py: three jit_fuser kernels forward (cast + max,
    subtract-exp-sum, divide), one backward (update the saved softmax, write the bf16 gradient)."""
    forward = (BF16 + FP32) + 2 * FP32 + 2 * FP32
    backward = 2 * FP32 + BF16
    assert FUSED_LOSS_BYTES == (forward, backward) == (22.0, 10.0)


def test_eager_torch_cross_entropy_pass_by_pass():
    """F.cross_entropy(pred.float(), labels): the cast, log_softmax's three reads and one write
    (cunn_SoftMaxForward on a row beyond shared memory); backward: the zero-filled nll gradient,
    log_softmax_backward's sum pass and output pass, the cast back to bf16."""
    forward = (BF16 + FP32) + 3 * FP32 + FP32
    backward = FP32 + FP32 + 3 * FP32 + (FP32 + BF16)
    assert EAGER_LOSS_BYTES == (forward, backward) == (22.0, 26.0)


@pytest.mark.parametrize("framework, release, fusion, torch_compile, expected", [
    ("megatron", None, None, None, FUSED_LOSS_BYTES),           # as autopar exports it
    ("megatron", None, False, None, UNFUSED_LOSS_BYTES),        # Megatron-LM without the flag
    ("megatron", "pre-core", None, None, UNFUSED_LOSS_BYTES),   # 2021-22: no fused loss yet
    ("megatron", "pre-core", True, None, UNFUSED_LOSS_BYTES),
    ("torchtitan", "2024-12", None, None, EAGER_LOSS_BYTES),    # loss left out of torch.compile
    ("torchtitan", None, None, False, EAGER_LOSS_BYTES),        # an eager torchtitan plan
    ("deepspeed", None, None, None, EAGER_LOSS_BYTES),          # the Hugging Face model's loss
    ("deepspeed", "megatron-deepspeed", None, None, UNFUSED_LOSS_BYTES),
])
def test_each_plan_runs_its_frameworks_loss(framework, release, fusion, torch_compile, expected):
    plan = ParallelPlan(global_batch=64, seq_len=4096, framework=framework, framework_release=release,
                        cross_entropy_fusion=fusion, torch_compile=torch_compile)
    graph = _graph_for(next(r for r in load_runs({"megatron-readme"}) if r.run_id.endswith("1p7b")))
    s = setup(graph, load_cluster("dgx-h100", 8), plan, H100).split
    assert (s.loss_fwd_bytes, s.loss_bwd_bytes) == expected


def test_loss_seconds_hand_worked_on_the_readme_1p7b_run():
    """GPT 1.7B of the Megatron-LM README (vocabulary 131,072), one microbatch of 4 x 4,096 tokens at
    tp 1: 2^29 · 4 logits; turning the fusion off adds (38 - 22) + (14 - 10) = 20 bytes per logit,
    all of it in the step (the head is not recomputed and sits on the only pipeline stage)."""
    run = next(r for r in load_runs({"megatron-readme"}) if r.run_id.endswith("1p7b"))
    graph = _graph_for(run)
    cluster = load_cluster(run.cluster, run.num_gpus)
    fused = ParallelPlan(mbs=4, global_batch=192, seq_len=4096)
    unfused = fused.changed(cross_entropy_fusion=False)
    head = graph.layers[-1]
    s = setup(graph, cluster, fused, H100).split
    logits = 131072 * 16384
    assert head.loss_logits_per_token_tp * s.tokens == logits
    assert loss_s(head, s, cluster, H100) == pytest.approx(
        (memory_bound_time_s(22 * logits, cluster.hbm_bytes_per_s, H100),
         memory_bound_time_s(10 * logits, cluster.hbm_bytes_per_s, H100)))
    extra_s = 20 * logits / (cluster.hbm_bytes_per_s * H100.hbm_efficiency)
    step = estimate(graph, cluster, unfused, H100).step_time_s - estimate(graph, cluster, fused, H100).step_time_s
    assert step == pytest.approx(extra_s, rel=1e-9)
    assert H100.hbm_efficiency == pytest.approx(0.834, abs=0.001)  # h100.json: measured, not fitted
    assert extra_s == pytest.approx(42.95e9 / (3.35e12 * 0.834), rel=0.002)  # 15.4 ms of a 0.4 s step


def test_cross_entropy_fusion_is_megatrons_switch():
    plan = ParallelPlan(global_batch=64, seq_len=4096, framework="torchtitan", cross_entropy_fusion=True)
    found = [v for v in plan_violations(plan, num_gpus=8, num_layers=32, num_heads=32, num_kv_heads=8)
             if "cross_entropy_fusion" in v]
    assert found and "leave cross_entropy_fusion unset" in found[0]
    assert ParallelPlan(global_batch=64, seq_len=4096, framework="torchtitan").cross_entropy_fusion is None
    assert ParallelPlan(global_batch=64, seq_len=4096).cross_entropy_fusion is True


def _plan_file(plan: ParallelPlan):
    from autopar.model import load_spec
    from autopar.schema.plan_file import PlanFile, PlanTarget
    return PlanFile(autopar_version="test", target=PlanTarget(model="llama3-8b", model_spec=load_spec("llama3-8b"),
                                                              cluster="dgx-h100", gpus=8), parallel=plan)


def test_the_megatron_export_passes_the_flag_and_the_import_reads_it():
    fused = megatron_args(_plan_file(ParallelPlan(tp=2, global_batch=64, seq_len=4096)))
    unfused = megatron_args(_plan_file(ParallelPlan(tp=2, global_batch=64, seq_len=4096, cross_entropy_fusion=False)))
    assert "--cross-entropy-loss-fusion" in fused and "--cross-entropy-loss-fusion" not in unfused
    assert plan_from_megatron_args(fused, num_gpus=8)[0].cross_entropy_fusion is True
    assert plan_from_megatron_args(unfused, num_gpus=8)[0].cross_entropy_fusion is False


def test_the_measured_runs_loss_is_their_recipes():
    runs = {r.run_id: r for r in load_runs()}
    readme = [r for r in runs.values() if r.source == "megatron-readme"]
    assert readme and all(r.cross_entropy_fusion is False for r in readme)  # not among the README's flags
    assert all(r.cross_entropy_fusion is True for r in runs.values() if r.source == "dgxc-nemo25")
    dgxc24 = {r.run_id: r.cross_entropy_fusion for r in runs.values() if r.source == "dgxc-nemo24"}
    assert all(v is True for k, v in dgxc24.items() if "llama" in k or "nemotron" in k)
    assert all(v is False for k, v in dgxc24.items() if "grok" in k or "gpt3" in k)
    assert all(r.cross_entropy_fusion is None for r in runs.values()
               if r.source in ("torchtitan-2412", "vtrain-single", "narayanan21-zero3"))
