"""Transformer Engine's unfused attention (ParallelPlan.attention_backend "unfused"): what it moves
and saves, counted from TE 2.x's UnfusedDotProductAttention (autopar.frameworks.megatron
TE_UNFUSED_BYTES_PER_SCORE and TE_UNFUSED_SAVED_BYTES_PER_SCORE), the rules
around it, and the runs whose Transformer Engine falls back to it (MLA on Blackwell before TE 2.5)."""

from __future__ import annotations

import pytest

from autopar.api import load_model
from autopar.cost import memory
from autopar.cost.compute import attention_time_s, memory_bound_time_s
from autopar.cost.layer import TE_UNFUSED_BYTES_PER_SCORE, _attention_and_elementwise_s, te_unfused_scores_bytes
from autopar.cost.params import load_cost_model
from autopar.cost.step import estimate, setup
from autopar.export import megatron_args, plan_from_megatron_args
from autopar.hardware import load_cluster
from autopar.model import load_spec
from autopar.schema.plan import ParallelPlan, plan_violations
from autopar.schema.plan_file import PlanFile, PlanTarget
from autopar.validate.dataset import load_runs

BF16 = 2
_, GB200 = load_cost_model("gb200")


def test_forward_bytes_per_score_kernel_by_kernel():
    """baddbmm writes the bf16 scores; the causal fused softmax (scaled_upper_triang_masked_softmax)
    reads the lower triangle and writes every probability; the AV bmm reads them."""
    baddbmm_write, softmax_read, softmax_write, bmm_read = BF16, BF16 / 2, BF16, BF16
    assert TE_UNFUSED_BYTES_PER_SCORE == baddbmm_write + softmax_read + softmax_write + bmm_read == 7.0
    assert memory.TE_UNFUSED_SAVED_BYTES_PER_SCORE == BF16  # the softmax output, for dV and the softmax backward


def _dsv3(backend: str, **plan):
    graph = load_model("deepseek-v3")
    cluster = load_cluster("gb200-nvl72", 128)
    fields = dict(tp=2, pp=4, ep=32, etp=1, global_batch=1024, seq_len=4096, attention_backend=backend)
    return graph, cluster, ParallelPlan(**(fields | plan))


def test_unfused_scores_hand_worked_for_deepseek_v3_on_gb200():
    """DeepSeek-V3 (128 heads) at 4,096 tokens, tp 2, one sequence per microbatch: 64 heads per rank,
    each materialising 4,096 x 4,096 scores, 7 bytes each forward; at GB200's 8 TB/s times the fitted
    HBM efficiency that is ~1.1 ms a layer."""
    graph, cluster, plan = _dsv3("unfused")
    s = setup(graph, cluster, plan, GB200).split
    layer = next(layer for layer in graph.layers if layer.kind == "moe")
    expected_bytes = 7.0 * 128 * 4096 * 4096 / 2  # 7.5 GB
    assert te_unfused_scores_bytes(layer, 4096, s.tokens, s.tp) == pytest.approx(expected_bytes, rel=1e-12)
    _, _, scores_s, *_ = _attention_and_elementwise_s(layer, s, cluster, GB200)
    assert scores_s == pytest.approx(memory_bound_time_s(expected_bytes, cluster.hbm_bytes_per_s, GB200), rel=1e-12)
    assert scores_s == pytest.approx(expected_bytes / (8e12 * GB200.hbm_efficiency) + GB200.kernel_overhead_s)
    # the fused plan materialises none, and its attention runs at cuDNN's rate instead of the unfused GEMMs'
    fused = setup(graph, cluster, plan.model_copy(update={"attention_backend": "auto"}), GB200).split
    attn_fwd_fused, _, scores_fused, *_ = _attention_and_elementwise_s(layer, fused, cluster, GB200)
    attn_fwd, *_ = _attention_and_elementwise_s(layer, s, cluster, GB200)
    assert scores_fused == 0.0
    flops = layer.attention_flops_per_token(4096) * s.tokens / s.tp
    assert attn_fwd == pytest.approx(attention_time_s(flops, 4096, s.attn_peak_flops, GB200, unfused=True))
    assert attn_fwd / attn_fwd_fused == pytest.approx(GB200.attention_rate("cudnn")[0] / GB200.unfused_attention_max,
                                                      rel=0.02)


def test_unfused_attention_slows_the_step_and_its_softmax_output_is_saved_unless_recomputed():
    graph, cluster, plan = _dsv3("unfused")
    auto = estimate(graph, cluster, plan.model_copy(update={"attention_backend": "auto"}), GB200)
    slow = estimate(graph, cluster, plan, GB200)
    assert slow.step_time_s > 1.5 * auto.step_time_s
    layer = next(layer for layer in graph.layers if layer.kind == "moe")
    tokens, seq = 4096, 4096
    keep = memory.saved_activation_bytes(layer, tokens, seq, 2, True, "none")
    keep_unfused = memory.saved_activation_bytes(layer, tokens, seq, 2, True, "none", unfused_attention=True)
    assert keep_unfused - keep == pytest.approx(BF16 * 128 * seq * tokens / 2, rel=1e-12)  # 2 GiB a layer
    for mode, modules in (("selective", ("core_attn",)), ("full", ())):
        assert memory.saved_activation_bytes(layer, tokens, seq, 2, True, mode, modules, unfused_attention=True) == \
            memory.saved_activation_bytes(layer, tokens, seq, 2, True, mode, modules)


def test_a_dropout_graph_keeps_its_own_unfused_pricing():
    """GPT-3's graph already prices unfused softmax and dropout (Korthikanti et al.): the plan's
    backend adds nothing to it."""
    graph = load_model("gpt3-175b")
    layer = next(layer for layer in graph.layers if layer.kind == "dense")
    assert layer.elementwise_bytes_per_token_per_seq_tp > 0 and not layer.fused_priced_attention
    cluster = load_cluster("dgx-a100-80gb", 64)
    _, a100 = load_cost_model("a100")
    plan = ParallelPlan(tp=8, pp=8, global_batch=64, seq_len=2048)
    base = estimate(graph, cluster, plan, a100)
    same = estimate(graph, cluster, plan.model_copy(update={"attention_backend": "unfused"}), a100)
    assert same.step_time_s == pytest.approx(base.step_time_s, rel=1e-12)
    assert same.peak_memory_bytes == pytest.approx(base.peak_memory_bytes, rel=1e-12)


def test_unfused_attention_is_megatron_s_and_has_no_context_parallelism():
    kw = dict(num_gpus=16, num_layers=32, num_heads=32, num_kv_heads=8)
    ok = ParallelPlan(tp=2, global_batch=16, seq_len=8192, attention_backend="unfused")
    assert plan_violations(ok, **kw) == []
    cp = ok.model_copy(update={"cp": 2})
    assert any("unfused attention has no context parallelism" in v for v in plan_violations(cp, **kw))
    titan = ok.model_copy(update={"framework": "torchtitan", "zero": 3})
    assert any("attention_backend is Megatron's --attention-backend" in v for v in plan_violations(titan, **kw))


def test_megatron_export_passes_and_reads_the_unfused_backend():
    plan = ParallelPlan(tp=2, pp=4, ep=32, etp=1, global_batch=1024, seq_len=4096, attention_backend="unfused")
    pf = PlanFile(autopar_version="test", parallel=plan,
                  target=PlanTarget(model="deepseek-v3", model_spec=load_spec("deepseek-v3"), cluster="gb200-nvl72",
                                    gpus=128))
    args = megatron_args(pf)
    assert args[args.index("--attention-backend") + 1] == "unfused"
    back, _ = plan_from_megatron_args(args, num_gpus=128)
    assert back.attention_backend == "unfused"


def test_mla_on_blackwell_before_te_2_5_runs_unfused():
    """dgxc-nemo25's DeepSeek-V3 GB200 rows (NeMo 25.04.01, Transformer Engine before 2.5): unfused; its
    H100 rows run cuDNN (sm90 takes head dim 192), and no other GB200 row has MLA."""
    runs = load_runs({"dgxc-nemo25"})
    unfused = {r.run_id for r in runs if r.attention_backend == "unfused"}
    assert unfused == {r.run_id for r in runs if "deepseek_v3" in r.run_id and "gb200" in r.run_id}
    assert len(unfused) == 4
    assert all(r.attention_backend == "auto" for r in runs if "deepseek_v3" in r.run_id and "h100" in r.run_id)


def test_unfused_attention_is_why_the_gb200_recipe_recomputes_core_attention():
    """dgxc-benchmarking's DeepSeek-V3 launch.sh (@ 1f6d9f4) recomputes mla_up_proj on H100 but
    core_attn on GB200. With the unfused attention that GB200 image ran, the H100 choice would keep
    each layer's 2 GiB softmax output for every in-flight microbatch and not fit in 186 GiB; core_attn
    recompute fits. Under fused attention both fit: the recipe's choice follows from the backend."""
    from autopar.schema.plan import Recompute
    from autopar.validate.runner import MEASURED_RUN_MARGIN

    fits = {}
    for backend in ("auto", "unfused"):
        for module in ("core_attn", "mla_up_proj"):
            graph, cluster, plan = _dsv3(backend, recompute=Recompute(mode="selective", modules=(module,)),
                                         moe_capacity_factor=1.0, moe_pad_to_capacity=True)
            fits[backend, module] = estimate(graph, cluster, plan, GB200, MEASURED_RUN_MARGIN).fits
    assert fits == {("auto", "core_attn"): True, ("auto", "mla_up_proj"): True,
                    ("unfused", "core_attn"): True, ("unfused", "mla_up_proj"): False}
