"""Issue 12, long context: what torchtitan's context parallelism (PyTorch's ring attention, torch
1963fc8 / torchtitan 9dec370, Dec 2024) costs beyond the SDPA kernels, against hand-worked values."""

from dataclasses import replace

import pytest

from autopar.cost import comm
from autopar.frameworks import framework_profile
from autopar.cost.layer import (Spans, Split, _compute, cp_kv_bytes, layer_cost, torch_ring_comm_s,
                                torch_ring_merge_bytes, torch_ring_merge_s)
from autopar.cost.params import load_cost_model
from autopar.cost.step import setup
from autopar.hardware import load_cluster
from autopar.model import load_model
from autopar.schema.plan import ParallelPlan

LLAMA8 = load_model("llama3-8b")
LAYER = LLAMA8.decoder_layers[0]  # 32 query heads, 8 K/V heads, head dim 128
TITAN = load_cluster("grandteton-h100-96gb", 8)
_, P = load_cost_model("h100")
MiB = 2**20


def _split(**kw) -> Split:
    base = dict(tp=1, sp=False, cp=8, ep=1, etp=1, tokens=32768, seq_len=262144, hidden=4096,
                peak_flops=886e12, attn_peak_flops=886e12, attention_kernel="fa2", cp_comm_type="allgather",
                cp_ring="torch", cp_repeats_kv_heads=True)
    return Split(**{**base, **kw})


def _spans(cp: int) -> Spans:
    one = comm.group_span(1, 1, 8)
    return Spans(tp=one, cp=comm.group_span(cp, 1, 8), ep=one, etp=one)


def test_torchtitan_profile_runs_torch_ring_with_repeated_kv_heads():
    titan, megatron = framework_profile("torchtitan"), framework_profile("megatron")
    assert (titan.cp_ring, titan.cp_repeats_kv_heads, titan.cp_comm_overlapped) == ("torch", True, False)
    assert (megatron.cp_ring, megatron.cp_repeats_kv_heads, megatron.cp_comm_overlapped) == ("te", False, True)
    plan = ParallelPlan(global_batch=1, seq_len=262144, cp=8, framework="torchtitan", cp_comm_type="allgather",
                        recompute={"mode": "full"})
    st = setup(LLAMA8, TITAN, plan, P)
    assert st.split.cp_ring == "torch" and st.split.cp_repeats_kv_heads and st.split.tokens == 32768
    assert not st.split.cp_comm_overlapped


def test_cp_moves_repeated_kv_heads_under_torchtitan():
    # 32768 local tokens · (128 + 128) K+V dims · 2 bytes: 8 K/V heads -> 128 MiB, repeated to 32 -> 512 MiB.
    assert cp_kv_bytes(LAYER, _split(cp_repeats_kv_heads=False)) == 8 * 32768 * 256 * 2 == 128 * MiB
    assert cp_kv_bytes(LAYER, _split()) == 32 * 32768 * 256 * 2 == 512 * MiB


def test_ring_merge_bytes_hand_count_cp8():
    # O = Q = 32768 tokens · 32 heads · 128 · 2 B = 256 MiB; KV = 512 MiB (repeated heads).
    # forward: (5·8 + 1)·O + 2·KV = 41·256 + 1024 MiB; backward: 41·(Q + KV) + 2·KV = 41·768 + 1024 MiB.
    fwd, bwd = torch_ring_merge_bytes(LAYER, _split())
    assert fwd == (41 * 256 + 1024) * MiB == 12_079_595_520
    assert bwd == (41 * 768 + 1024) * MiB == 34_091_302_912
    assert torch_ring_merge_bytes(LAYER, _split(cp=1)) == (0.0, 0.0)
    assert torch_ring_merge_bytes(LAYER, _split(cp_ring="te")) == (0.0, 0.0)


def test_ring_merge_time_is_charged_to_attention_and_recomputed():
    fwd_bytes, bwd_bytes = torch_ring_merge_bytes(LAYER, _split())
    hbm = TITAN.hbm_bytes_per_s * P.hbm_efficiency
    merge_fwd, merge_bwd = torch_ring_merge_s(LAYER, _split(), TITAN, P)
    assert merge_fwd == pytest.approx(fwd_bytes / hbm + 9 * P.kernel_overhead_s, rel=1e-12)
    assert merge_bwd == pytest.approx(bwd_bytes / hbm + 17 * P.kernel_overhead_s, rel=1e-12)
    # 2.4 TB/s at the file's efficiency: about 10 ms forward and 28 ms backward per layer at cp 8
    assert 0.005 < merge_fwd < 0.02 and 0.015 < merge_bwd < 0.06
    with_ring = _compute(LAYER, _split(), TITAN, P)
    te = _compute(LAYER, _split(cp_ring="te"), TITAN, P)
    assert with_ring[2]["core_attn"] - te[2]["core_attn"] == pytest.approx(merge_fwd, rel=1e-9)
    assert with_ring[0] - te[0] == pytest.approx(merge_fwd, rel=1e-9)
    assert with_ring[1] - te[1] == pytest.approx(merge_bwd, rel=1e-9)


def test_ring_comm_allgather_behind_one_step_and_last_dkv_exposed():
    s, spans, p = _split(), _spans(8), replace(P, cp_overlap=0.9)
    kv = 512 * MiB
    gather = comm.all_gather_s(8 * kv, spans.cp, TITAN, p)
    dkv = comm.send_recv_s(2 * kv, False, TITAN, p)  # running fp32 dK/dV
    # a long step hides all but (1 - cp_overlap) of each hidden transfer; the last dK/dV is waited on
    fwd, bwd = torch_ring_comm_s(LAYER, s, spans, TITAN, p, attn_fwd_s=8.0, attn_bwd_s=20.0)
    assert fwd == pytest.approx(0.1 * gather, rel=1e-12)
    assert bwd == pytest.approx(0.1 * gather + 7 * 0.1 * dkv + dkv, rel=1e-12)
    # no compute to hide behind: everything is exposed
    fwd0, bwd0 = torch_ring_comm_s(LAYER, s, spans, TITAN, p, attn_fwd_s=0.0, attn_bwd_s=0.0)
    assert fwd0 == pytest.approx(gather, rel=1e-12) and bwd0 == pytest.approx(gather + 8 * dkv, rel=1e-12)
    # compiled, each transfer is waited on where it is issued: a long step hides nothing
    compiled = _split(cp_comm_overlapped=False)
    fwd_c, bwd_c = torch_ring_comm_s(LAYER, compiled, spans, TITAN, p, attn_fwd_s=8.0, attn_bwd_s=20.0)
    assert fwd_c == pytest.approx(gather, rel=1e-12) and bwd_c == pytest.approx(gather + 8 * dkv, rel=1e-12)
    # the alltoall rotate method sends K/V cp - 1 times instead of one all-gather
    send = comm.send_recv_s(kv, False, TITAN, p)
    fwd_a2a, _ = torch_ring_comm_s(LAYER, _split(cp_comm_type="p2p"), spans, TITAN, p, 0.0, 0.0)
    assert fwd_a2a == pytest.approx(7 * send, rel=1e-12)


def test_megatron_cp_unchanged_by_the_torch_ring():
    s = _split(cp_ring="te", cp_repeats_kv_heads=False, cp_comm_type="p2p", peak_flops=989e12, attn_peak_flops=989e12)
    cost = layer_cost(LAYER, s, _spans(8), load_cluster("dgx-h100", 8), P, False)
    kv = 8 * 32768 * 256 * 2
    step = comm.send_recv_s(kv, False, load_cluster("dgx-h100", 8), P)
    attn = dict(cost.module_recompute_s)["core_attn"]
    assert cost.cp_comm_fwd_s == pytest.approx(max(7 * step * (1 - P.cp_overlap), 7 * step - attn), rel=1e-12)



def test_torchtitan_cp8_layer_pays_gather_dkv_and_merges():
    # Llama 3.1 8B at 256K on 8 GPUs, cp 8 (torchtitan Table 2's last row): per layer the forward pays
    # the K/V all-gather (8 × 512 MiB) and the merges; the backward the all-gather and 8 fp32 dK/dV sends.
    plan = ParallelPlan(global_batch=1, seq_len=262144, cp=8, framework="torchtitan", cp_comm_type="allgather",
                        recompute={"mode": "full"}, zero=3, precision="fp8")
    st = setup(LLAMA8, TITAN, plan, P)
    cost = layer_cost(LAYER, st.split, st.spans, TITAN, P, False)
    gather = comm.all_gather_s(8 * 512 * MiB, st.spans.cp, TITAN, P)
    dkv = comm.send_recv_s(1024 * MiB, False, TITAN, P)
    assert cost.cp_comm_fwd_s == pytest.approx(gather, rel=1e-12)
    assert cost.cp_comm_bwd_s == pytest.approx(gather + 8 * dkv, rel=1e-12)
    merge_fwd, _ = torch_ring_merge_s(LAYER, st.split, TITAN, P)
    te = layer_cost(LAYER, st.split._replace(cp_ring="te"), st.spans, TITAN, P, False)
    assert cost.fwd_compute_s - te.fwd_compute_s == pytest.approx(merge_fwd, rel=1e-9)
