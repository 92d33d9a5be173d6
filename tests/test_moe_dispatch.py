"""Expert-parallel token exchange: the all-to-all's network messages under NCCL's PXN, and the
measured MoE runs that pin the expert layout (Grok-1's proxies have no shared expert)."""

from __future__ import annotations

import math

import pytest

from autopar.cost import comm
from autopar.cost.params import load_cost_model, params_from_file
from autopar.hardware import load_cluster


def test_all_to_all_sends_one_network_message_per_remote_gpu_per_node_by_hand() -> None:
    # 16 ranks on 2 DGX H100 nodes, 16 MB per rank: 1 MB to each peer. NCCL >= 2.12 (PXN) forwards a
    # GPU's data for a remote GPU through the local GPU on that rail, which sends the 8 local GPUs'
    # shares as one 8 MB message; NVLink carries the 7/16 for local peers at the same time.
    p = params_from_file(load_cost_model("h100")[0])
    c = load_cluster("dgx-h100", 16)
    span = comm.GroupSpan(16, 8, 2)
    send = 16e6
    half = p.half_message_bytes
    inter = (send * 8 / 16) / (c.inter_node_bytes_per_s_per_gpu * p.inter_node_efficiency * (8e6 / (8e6 + half)))
    intra = (send * 7 / 16) / (c.intra_node_bytes_per_s * p.intra_node_efficiency * c.mesh_link_share(8)
                               * (1e6 / (1e6 + half)))
    expected = c.inter_node_latency_s * math.ceil(math.log2(16)) + p.collective_overhead_s + max(inter, intra)
    assert comm.all_to_all_s(send, span, c, p) == pytest.approx(expected, rel=1e-12)
    # One GPU per node (tp 8 puts each EP rank on its own node): nothing to aggregate.
    one = comm.GroupSpan(16, 1, 16)
    inter_one = (send * 15 / 16) / (c.inter_node_bytes_per_s_per_gpu * p.inter_node_efficiency * (1e6 / (1e6 + half)))
    assert comm.all_to_all_s(send, one, c, p) == pytest.approx(
        c.inter_node_latency_s * 4 + p.collective_overhead_s + inter_one, rel=1e-12)


def test_grok1_proxy_rows_have_no_shared_expert() -> None:
    from autopar.validate.dataset import load_runs
    from autopar.validate.runner import _graph_for

    runs = [r for r in load_runs({"dgxc-nemo24"}) if "grok1" in r.run_id]
    assert len(runs) == 18
    for r in runs:
        assert r.arch["moe"]["shared_experts"] == 0 and "moe.shared_experts" in r.arch["inferred"]
        assert _graph_for(r).spec.moe.num_shared_experts == 0
    # 64 layers of 8 experts (32768 wide, GeGLU), attention 6144 with 8 KV heads, vocab 128256 (the
    # Llama-3 tokenizer the recipe runs): 2*6144*128256 + 64*(8*3*6144*32768 + 6144*(6144+2*768+6144)
    # + 6144*8 + 2*6144) + 6144 = 316.5B, the public Grok-1's 314B with a larger vocabulary.
    full = next(r for r in runs if r.num_gpus == 512)
    attn = 6144 * (6144 + 2 * 8 * 128) + 6144 * 6144
    per_layer = 8 * 3 * 6144 * 32768 + attn + 6144 * 8 + 2 * 6144
    expected = 2 * 6144 * 128256 + 64 * per_layer + 6144
    assert _graph_for(full).total_params == pytest.approx(expected, rel=2e-3)
