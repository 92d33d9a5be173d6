"""Settings NVIDIA's recipes fix that change what a step costs, each hand-worked against the code
that runs it: experts padded to their capacity (Megatron --moe-pad-expert-input-to-capacity: no
token-count gather, no host sync, equal splits, every expert at capacity) and the attention
backend (Megatron --attention-backend; NVTE_FUSED_ATTN=0 leaves the flash-attn package)."""

from __future__ import annotations

import pytest

from autopar.cost import comm
from autopar.cost.compute import attention_time_s
from autopar.cost.layer import _ep_comm, moe_count_gather_s, sequential_experts_host_wait_s
from autopar.cost.params import load_cost_model
from autopar.cost.step import moe_load, setup
from autopar.export import megatron_args, plan_from_megatron_args
from autopar.hardware import load_cluster
from autopar.model import load_model
from autopar.schema.plan import ParallelPlan, plan_violations
from autopar.validate.dataset import load_runs

_, H100 = load_cost_model("h100")
MIXTRAL = load_model("mixtral-8x7b")


def _moe_plan(**kw) -> ParallelPlan:
    return ParallelPlan(tp=2, ep=8, etp=2, global_batch=256, seq_len=4096, **kw)


def _moe_layer():
    return next(layer for layer in MIXTRAL.layers if layer.num_experts)


def test_padded_experts_run_exactly_at_capacity():
    """Megatron-Core's drop_and_pad preprocess (token_dispatcher.py, core_r0.9.0 to core_r0.12.0):
    num_tokens_per_local_expert = capacity · tp · ep, capacity = factor × the mean: the busiest
    rank's load is the capacity factor itself, not the balls-into-bins bound."""
    routed = 2048 * 2  # T·k copies a rank sends
    free = moe_load(_moe_plan(), routed, 8)
    assert free == pytest.approx(1 + (2 * 2.0794415 / routed) ** 0.5, rel=1e-6)  # 1 + sqrt(2 ln 8 / (T k))
    assert moe_load(_moe_plan(moe_capacity_factor=1.0), routed, 8) == 1.0  # dropped above capacity
    assert moe_load(_moe_plan(moe_capacity_factor=1.0, moe_pad_to_capacity=True), routed, 8) == 1.0
    assert moe_load(_moe_plan(moe_capacity_factor=1.25, moe_pad_to_capacity=True), routed, 8) == 1.25


def test_padding_skips_the_count_gather_and_uses_plain_collectives():
    """Dropless, the alltoall dispatcher all-gathers every rank's token counts over the etp·ep group
    and syncs the host before its variable all-to-all; padded, every split is the capacity: no
    gather, and the ETP gather/scatter of the received tokens are plain collectives."""
    cluster = load_cluster("dgx-h100", 64)
    layer = _moe_layer()
    free = setup(MIXTRAL, cluster, _moe_plan(), H100)
    padded = setup(MIXTRAL, cluster, _moe_plan(moe_capacity_factor=1.0, moe_pad_to_capacity=True), H100)
    spans = padded.spans
    assert moe_count_gather_s(layer, free.split, spans, cluster, H100) > 0.0
    assert moe_count_gather_s(layer, padded.split, spans, cluster, H100) == 0.0
    s = padded.split
    routed_bytes = s.tokens / s.tp * layer.top_k * s.hidden * 2 * 1.0
    expected = (2 * comm.all_to_all_s(routed_bytes, spans.ep, cluster, H100)
                + comm.all_gather_s(routed_bytes * s.etp, spans.etp, cluster, H100)
                + comm.reduce_scatter_s(routed_bytes * s.etp, spans.etp, cluster, H100))
    assert _ep_comm(layer, s, spans, cluster, H100) == pytest.approx(expected, rel=1e-12)
    # SequentialMLP's host waits on the dispatcher's sync; padded there is none
    seq = padded.split._replace(sequential_experts=True)
    assert sequential_experts_host_wait_s(layer, seq, 0.0, 0.0) == 0.0
    assert sequential_experts_host_wait_s(layer, free.split._replace(sequential_experts=True), 0.0, 0.0) > 0.0


def test_padding_needs_a_capacity_factor_and_exports_megatron_s_flag():
    bad = _moe_plan(moe_pad_to_capacity=True)
    out = plan_violations(bad, num_gpus=64, num_layers=32, num_heads=32, num_kv_heads=8, num_experts=8)
    assert any("moe_pad_to_capacity" in v and "moe_capacity_factor" in v for v in out)
    from autopar.schema.plan_file import PlanFile, PlanTarget
    from autopar.model import load_spec

    plan = _moe_plan(moe_capacity_factor=1.0, moe_pad_to_capacity=True, attention_backend="flash")
    pf = PlanFile(autopar_version="test", target=PlanTarget(model="mixtral-8x7b", model_spec=load_spec("mixtral-8x7b"),
                                                            cluster="dgx-h100", gpus=64), parallel=plan)
    args = megatron_args(pf)
    assert "--moe-pad-expert-input-to-capacity" in args and "--attention-backend" in args
    assert args[args.index("--attention-backend") + 1] == "flash"
    back, _ = plan_from_megatron_args(args, num_gpus=64)
    assert back.moe_pad_to_capacity and back.moe_capacity_factor == 1.0 and back.attention_backend == "flash"


def test_attention_backend_picks_the_kernel_priced():
    """auto: Transformer Engine's choice (cuDNN fused attention on Hopper, flash-attn on Ampere);
    flash: flash-attn 2, priced at the FlashAttention-3 paper's FlashAttention-2 rates (0.35 / 0.31
    of the H100 peak against cuDNN's 0.58 / 0.47): the same attention takes 0.58 / 0.35 = 1.66× as
    long forward."""
    llama = load_model("llama3-8b")
    h100, a100 = load_cluster("dgx-h100", 8), load_cluster("dgx-a100-80gb", 8)
    base = ParallelPlan(global_batch=8, seq_len=8192)
    assert setup(llama, h100, base, H100).split.attention_kernel == "cudnn"
    assert setup(llama, h100, base.model_copy(update={"attention_backend": "flash"}), H100).split.attention_kernel == "fa2"
    assert setup(llama, h100, base.model_copy(update={"attention_backend": "fused"}), H100).split.attention_kernel == "cudnn"
    _, a100_p = load_cost_model("a100")
    assert setup(llama, a100, base, a100_p).split.attention_kernel == "fa2"
    (fa2_f, _), (cudnn_f, _) = H100.attention_rate("fa2"), H100.attention_rate("cudnn")
    assert (fa2_f, cudnn_f) == (0.35, 0.58)
    flops, peak = 1e15, 989e12
    slow = attention_time_s(flops, 8192, peak, H100, False, fa2_f) - H100.kernel_overhead_s
    fast = attention_time_s(flops, 8192, peak, H100, False, cudnn_f) - H100.kernel_overhead_s
    assert slow / fast == pytest.approx(0.58 / 0.35, rel=1e-9)
    titan = base.model_copy(update={"framework": "torchtitan", "zero": 3, "attention_backend": "flash"})
    out = plan_violations(titan, num_gpus=8, num_layers=32, num_heads=32, num_kv_heads=8)
    assert any("attention_backend is Megatron's --attention-backend" in v for v in out)


def test_recipes_state_their_attention_backend_and_token_drop():
    """NVTE_FUSED_ATTN=0 in the recipe's environment: dgxc grok1 and the nemotron 340b branch
    (@ 143b90d), nemo_megatron @ 35a9aec, NeMo's Nemotron-H script, and NeMo-Framework-Launcher 24.07's
    config.yaml for every nemo-24.07 run; MegatronTokenDropCallback (capacity 1.0, padded) in every
    dgxc-nemo25 MoE script, and grok1_314b.yaml's own moe_pad_expert_input_to_capacity."""
    runs = load_runs({"dgxc-nemo24", "dgxc-nemo25", "nemo-24.07", "megascale-moe"})
    flash = {r.run_id for r in runs if r.attention_backend == "flash"}
    assert all(r.run_id in flash for r in runs if r.source == "nemo-24.07")
    assert all(r.run_id in flash for r in runs if r.source == "dgxc-nemo24"
               and any(m in r.run_id for m in ("grok1", "nemotron4_340b", "gpt3")))
    assert not any(r.run_id in flash for r in runs if "llama31" in r.run_id or "nemotron4_15b" in r.run_id)
    assert {r.run_id for r in runs if r.source == "dgxc-nemo25" and r.run_id in flash} == \
        {r.run_id for r in runs if r.source == "dgxc-nemo25" and "_nemotronh_56b_" in r.run_id}
    padded = {r.run_id for r in runs if r.moe_capacity_factor == 1.0}
    assert padded == {r.run_id for r in runs if r.arch.get("moe") and r.source != "megascale-moe"}
    assert any("grok1" in r for r in padded) and any("maverick" in r for r in padded)


def test_shared_expert_overlap_hides_the_dispatch_behind_the_shared_experts():
    """Megatron --moe-shared-expert-overlap (NeMo's DeepSeek-V3 and Llama 4 configs set it): the
    shared expert's GEMMs run beside the dispatch and combine all-to-alls, so each direction's
    exposed EP time drops by min(shared-expert GEMM time, EP time). Hand-worked on DeepSeek-V3's
    MoE layer, tp2 ep32 etp1 on 2,048 H800: the forward EP cost drops by exactly the shared expert's
    forward GEMM seconds (they are the smaller), and nothing changes with the switch off."""
    from autopar.cost.layer import _gemm_row_s, _gemm_rows, layer_cost, shared_expert_overlap_s

    graph, cluster = load_model("deepseek-v3"), load_cluster("hgx-h800", 2048)
    _, h800 = load_cost_model("h800")
    base = ParallelPlan(tp=2, pp=8, ep=32, etp=1, global_batch=4096, seq_len=4096)
    layer = next(x for x in graph.layers if x.num_experts)
    off = setup(graph, cluster, base, h800)
    on = setup(graph, cluster, base.model_copy(update={"moe_shared_expert_overlap": True}), h800)
    shared = [_gemm_row_s(r, on.split, cluster, h800, None) for r in _gemm_rows(layer) if r[5] == "shared_experts"]
    assert len(shared) == 2  # fc1 (gate and up) and fc2
    fwd, bwd = sum(t for t, _ in shared), sum(b for _, b in shared)
    ep = _ep_comm(layer, on.split, on.spans, cluster, h800)
    assert shared_expert_overlap_s(layer, on.split, cluster, h800, ep) == (min(fwd, ep), min(bwd, ep))
    assert shared_expert_overlap_s(layer, off.split, cluster, h800, ep) == (0.0, 0.0)
    c_off = layer_cost(layer, off.split, off.spans, cluster, h800, False)
    c_on = layer_cost(layer, on.split, on.spans, cluster, h800, False)
    assert c_off.ep_comm_fwd_s - c_on.ep_comm_fwd_s == pytest.approx(min(fwd, ep), rel=1e-12)
    assert c_off.ep_comm_bwd_s - c_on.ep_comm_bwd_s == pytest.approx(min(bwd, ep), rel=1e-12)
    assert c_on.fwd_compute_s == c_off.fwd_compute_s and c_on.bwd_compute_s == c_off.bwd_compute_s
    bad = base.model_copy(update={"moe_shared_expert_overlap": True, "moe_dispatcher": "allgather"})
    out = plan_violations(bad, num_gpus=2048, num_layers=61, num_heads=128, num_kv_heads=128, num_experts=256)
    assert any("moe_shared_expert_overlap needs the alltoall dispatcher" in v for v in out)
    titan = base.model_copy(update={"moe_shared_expert_overlap": True, "framework": "torchtitan", "zero": 3})
    out = plan_violations(titan, num_gpus=2048, num_layers=61, num_heads=128, num_kv_heads=128, num_experts=256)
    assert any("moe_shared_expert_overlap is Megatron's --moe-shared-expert-overlap" in v for v in out)
    runs = load_runs({"dgxc-nemo25"})
    assert {r.run_id for r in runs if r.moe_shared_expert_overlap} == \
        {r.run_id for r in runs if "_deepseek_v3_" in r.run_id or "_llama4_maverick_" in r.run_id}
