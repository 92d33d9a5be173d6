"""Issue 12, MoE on Megatron-LM: what the alltoall dispatcher of Megatron-Core 0.9+ does (read at
commit f1f03922, the MegaScale-MoE baseline's), each against a hand-worked value."""

import pytest

from autopar.cost import comm, memory
from autopar.cost.layer import Spans, Split, _compute, layer_cost, moe_count_gather_s, moe_sort_chunks_s
from autopar.cost.params import load_cost_model
from autopar.hardware import load_cluster
from autopar.model import load_model

MIXTRAL = load_model("mixtral-8x7b")  # 8 experts, top-2, h 4096
MOE = next(layer for layer in MIXTRAL.layers if layer.num_experts)
H800 = load_cluster("hgx-h800", 16)
_, P = load_cost_model("h800")
NO_GROUP = comm.GroupSpan(1, 1, 1)


def _split(**kw) -> Split:
    base = dict(tp=8, sp=True, cp=1, ep=2, etp=8, tokens=4096, seq_len=4096, hidden=4096,
                peak_flops=989e12, attn_peak_flops=989e12, attention_kernel="cudnn")
    return Split(**{**base, **kw})


def _spans(ep: int = 2, etp: int = 8) -> Spans:
    """etp 8 fills a node, so ep ranks sit one per node (Megatron's expert order: etp fastest)."""
    return Spans(tp=comm.group_span(8, 1, 8), cp=NO_GROUP, ep=comm.group_span(ep, etp, 8), etp=comm.group_span(etp, 1, 8))


def test_sort_chunks_copies_the_etp_gathered_tokens_twice_per_pass():
    # tokens/tp · top-2 · etp · load · h · bf16 = 512 · 2 · 8 · 1.25 · 4096 · 2 bytes = 83,886,080 bytes.
    s = _split(moe_load=1.25)
    gathered = 512 * 2 * 8 * 1.25 * 4096 * 2
    assert gathered == 83_886_080
    want = 4 * gathered / (H800.hbm_bytes_per_s * P.hbm_efficiency) + 2 * P.kernel_overhead_s
    assert moe_sort_chunks_s(MOE, s, H800, P) == pytest.approx(want, rel=1e-12)
    # One local expert (ep = experts) or the allgather dispatcher: no second permutation.
    assert moe_sort_chunks_s(MOE, _split(ep=8), H800, P) == 0.0
    assert moe_sort_chunks_s(MOE, _split(moe_dispatcher="allgather"), H800, P) == 0.0
    # It is part of the MoE module's forward and of both passes.
    with_sort = _compute(MOE, s, H800, P)
    without = _compute(MOE, _split(moe_load=1.25, moe_dispatcher="allgather"), H800, P)
    sort_s = moe_sort_chunks_s(MOE, s, H800, P)
    assert with_sort[0] - without[0] == pytest.approx(sort_s, rel=1e-9)
    assert with_sort[1] - without[1] == pytest.approx(sort_s, rel=1e-9)


def test_token_count_gather_is_forward_only_and_latency_bound_over_etp_ep():
    s, spans = _split(), _spans()
    # Group of etp·ep = 16 ranks over 2 nodes; each gathers 8 experts · 4 B from 16 ranks = 512 B.
    out_bytes = 8 * 4 * 16
    inter = min(H800.intra_node_bytes_per_s * P.intra_node_efficiency,
                8 * H800.inter_node_bytes_per_s_per_gpu * P.inter_node_efficiency)
    want = (15 * H800.inter_node_latency_s + P.collective_overhead_s
            + (15 / 16 * out_bytes) / (inter * out_bytes / (out_bytes + P.half_message_bytes)))
    assert moe_count_gather_s(MOE, s, spans, H800, P) == pytest.approx(want, rel=1e-12)
    assert 15 * H800.inter_node_latency_s > 0.5 * want  # latency, not bandwidth, dominates
    cost = layer_cost(MOE, s, spans, H800, P, tp_overlap=False)
    assert cost.ep_comm_fwd_s - cost.ep_comm_bwd_s == pytest.approx(want, rel=1e-9)
    assert moe_count_gather_s(MOE, _split(ep=1, etp=1), _spans(1, 1), H800, P) == 0.0


def test_expert_input_is_saved_at_its_etp_gathered_size():
    # The experts' first GEMM input after the ETP all-gather: tokens/tp · top-2 · etp rows of h.
    tokens = 4096
    one = memory.saved_activation_bytes(MOE, tokens, 4096, 8, True, "none", etp=1)
    eight = memory.saved_activation_bytes(MOE, tokens, 4096, 8, True, "none", etp=8)
    assert eight - one == pytest.approx(7 * 2 * 4096 * 2 * tokens / 8)  # 7 more copies of 2·h·k bytes/token
    # Full recompute keeps only the layer input: etp changes nothing there.
    assert memory.saved_activation_bytes(MOE, tokens, 4096, 8, True, "full", etp=8) == \
        memory.saved_activation_bytes(MOE, tokens, 4096, 8, True, "full", etp=1)


def test_allgather_dispatcher_gathers_tokens_once_over_the_etp_ep_group():
    # MoEAllGatherTokenDispatcher: all-gather of the [tokens/tp, h] hidden states over etp·ep = 16
    # ranks (2 nodes) and a reduce-scatter back; no top-k copies, no second ETP gather.
    s, spans = _split(moe_dispatcher="allgather"), _spans()
    out_bytes = 512 * 4096 * 2 * 16  # 16 ranks' 512 tokens of h bf16
    span = comm.GroupSpan(16, 8, 2)
    bw = min(H800.intra_node_bytes_per_s * P.intra_node_efficiency,
             8 * H800.inter_node_bytes_per_s_per_gpu * P.inter_node_efficiency)
    one = (15 * H800.inter_node_latency_s + P.collective_overhead_s
           + (15 / 16 * out_bytes) / (bw * out_bytes / (out_bytes + P.half_message_bytes)))
    assert comm.all_gather_s(out_bytes, span, H800, P) == pytest.approx(one, rel=1e-12)
    cost = layer_cost(MOE, s, spans, H800, P, tp_overlap=False)
    assert cost.ep_comm_fwd_s == pytest.approx(2 * one, rel=1e-12)
    assert cost.ep_comm_bwd_s == cost.ep_comm_fwd_s  # no count gather, no host sync


def test_skinny_expert_gemms_are_held_to_the_hbm_roofline():
    from autopar.cost.compute import GEMM_STREAM_HBM_EFFICIENCY, gemm_efficiency, gemm_pass_bytes, gemm_time_s

    # A DeepSeek-V3 expert fc1 with 128 tokens: m 128, n 4096 (gate + up), k 7168, bf16.
    m, n, k = 128, 4096, 7168
    fwd_b, dgrad_b, wgrad_b = gemm_pass_bytes(m, n, k, 2)
    assert fwd_b == 2 * (128 * 7168 + 7168 * 4096) + 2 * 128 * 4096 == 61_603_840
    assert dgrad_b == 2 * (128 * 4096 + 4096 * 7168) + 2 * 128 * 7168 == 61_603_840
    assert wgrad_b == 2 * (128 * 7168 + 128 * 4096) + 8 * 7168 * 4096 == 237_764_608  # fp32 main grad r+w
    hbm = H800.hbm_bytes_per_s * GEMM_STREAM_HBM_EFFICIENCY  # 3.35 TB/s · 0.83
    compute = 2 * m * n * k / (989e12 * gemm_efficiency(m, n, k, P))
    assert fwd_b / hbm > compute  # memory-bound: 22 us of weight traffic vs 14 us of FLOPs
    assert gemm_time_s(m, n, k, 989e12, P, 32, fwd_b, H800.hbm_bytes_per_s) == \
        pytest.approx(32 * (fwd_b / hbm + P.kernel_overhead_s), rel=1e-12)
    assert gemm_time_s(m, n, k, 989e12, P, 1, wgrad_b, H800.hbm_bytes_per_s) == \
        pytest.approx(wgrad_b / hbm + P.kernel_overhead_s, rel=1e-12)
    # A dense GEMM with 8192 tokens stays compute-bound: the floor changes nothing.
    big = gemm_pass_bytes(8192, 4096, 4096, 2)
    for b in big:
        assert gemm_time_s(8192, 4096, 4096, 989e12, P, 1, b, H800.hbm_bytes_per_s) == gemm_time_s(8192, 4096, 4096, 989e12, P)
