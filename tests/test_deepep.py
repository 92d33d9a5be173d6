"""Megatron's flex token dispatcher on DeepEP (moe_dispatcher "flex"): the routing expectation it rests
on, against exact enumeration; its transfer time against DeepEP's own published kernel benchmark
(deepseek-ai/DeepEP docs/legacy.md "Normal kernels with NVLink and RDMA forwarding", H800 with CX7
400 Gb/s, 4096 tokens, hidden 7168, top-4 of 8 groups, top-8 of 256 experts); its refusals, export and
import."""

from __future__ import annotations

import itertools
import math

import pytest

from autopar.cost import comm
from autopar.cost.layer import Spans, Split, _ep_comm, _etp_ep_span, deepep_transfer_s, expected_groups_hit
from autopar.cost.layout import layout_violations
from autopar.cost.params import load_cost_model
from autopar.errors import AutoparError
from autopar.export import megatron_args
from autopar.export.importers import plan_from_megatron_args
from autopar.export.megatron_rules import megatron_violations
from autopar.hardware import load_cluster
from autopar.model import load_model
from autopar.schema.plan import ParallelPlan
from test_export import MOE, ROUND_TRIP, with_args  # tests/ is on sys.path (rootdir)

DSV3 = load_model("deepseek-v3")
LAYER = next(layer for layer in DSV3.layers if layer.num_experts)
_, H800_P = load_cost_model("h800")
TOKEN_BYTES = 4096 * 7168 * 2  # DeepEP's benchmark batch, counted in bf16 bytes (rates are per byte)


def _brute_force(experts: int, top_k: int, units: int, groups: int = 0, group_topk: int = 0) -> float:
    """Mean distinct units over every (group pick, expert subset), each pick equally likely."""
    picks = list(itertools.combinations(range(groups), group_topk)) if groups else [None]
    total = 0.0
    for pick in picks:
        pool = [e for g in pick for e in range(g * experts // groups, (g + 1) * experts // groups)] if pick \
            else list(range(experts))
        subsets = list(itertools.combinations(pool, top_k))
        total += sum(len({e * units // experts for e in sub}) for sub in subsets) / len(subsets)
    return total / len(picks)


def test_units_hit_by_a_balanced_router_match_the_closed_form_and_enumeration():
    # Hand-worked: 256 experts over 8 hosts, top-8: 8 · (1 − C(224, 8) / C(256, 8)) = 5.2947.
    want = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert expected_groups_hit(256, 8, 8) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(5.2947, abs=1e-4)
    # DeepSeek-V3's 4 of 8 groups, one group a host: 8 · 4/8 · (1 − C(96, 8) / C(128, 8)) = 3.6290.
    grouped = 8 * 0.5 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert expected_groups_hit(256, 8, 8, 8, 4) == pytest.approx(grouped, rel=1e-12)
    assert grouped == pytest.approx(3.6290, abs=1e-4)
    # Every layout the formula covers (a unit holds whole groups, or a group whole units), exactly.
    for units, groups, group_topk in [(4, 0, 0), (2, 4, 2), (4, 4, 2), (8, 4, 2), (4, 4, 3), (2, 4, 1)]:
        assert expected_groups_hit(16, 3, units, groups, group_topk) == pytest.approx(
            _brute_force(16, 3, units, groups, group_topk), rel=1e-12), (units, groups, group_topk)


def _deepep(ep: int) -> float:
    cluster = load_cluster("hgx-h800", ep)
    s = Split(tp=1, sp=False, cp=1, ep=ep, etp=1, tokens=4096, seq_len=4096, hidden=7168, peak_flops=989e12,
              moe_dispatcher="flex")
    return deepep_transfer_s(LAYER, s, comm.group_span(ep, 1, 8), cluster, H800_P)


def test_intranode_dispatch_runs_at_deepeps_measured_nvlink_rate():
    # docs/legacy.md: intranode EP 8, dispatch 153 GB/s, combine 158 GB/s "bottleneck bandwidth" (NVLink bytes
    # each GPU sends / time). Each token reaches 5.339 of the 8 GPUs under 4-of-8 group routing, 7/8 of them others.
    nvl_bytes = TOKEN_BYTES * expected_groups_hit(256, 8, 8, 8, 4) * 7 / 8
    assert nvl_bytes / _deepep(8) / 1e9 == pytest.approx(153, rel=0.05)


def test_internode_dispatch_within_deepeps_measured_rdma_rates():
    # DeepEP counts "logical" RDMA bandwidth: the token bytes times every host a token reaches (its own
    # included, as the V2 table's notes say) over the time. V1 measured 58 GB/s at EP 32 and 51 at EP 64; at
    # EP 16, 43 (V1's untuned two-host case) to 90 (V2, EP 8 x 2). Ours: NVLink-bound at EP 16, RDMA-bound after.
    def logical(ep: int) -> float:
        return TOKEN_BYTES * expected_groups_hit(256, 8, ep // 8, 8, 4) / _deepep(ep) / 1e9
    assert logical(32) == pytest.approx(58, rel=0.15)
    assert logical(64) == pytest.approx(51, rel=0.15)
    assert 43 <= logical(16) <= 90


def test_flex_sends_fewer_bytes_between_hosts_than_alltoall():
    """DeepSeek-V3 on 2,048 H100, ep 64 (8 hosts): alltoall sends each token's 8 expert copies, 7/8 of
    them to other hosts (7 copies); DeepEP sends it once to each other host it reaches, 3.629 · 7/8 = 3.175
    (4-of-8 group routing). Both RDMA-bound, so the dispatch time falls about that much."""
    cluster = load_cluster("dgx-h100", 2048)
    _, p = load_cost_model("h100")
    base = dict(tp=1, sp=False, cp=1, ep=64, etp=1, tokens=4096, seq_len=4096, hidden=7168, peak_flops=989e12)
    spans = Spans(comm.group_span(1, 1, 8), comm.GroupSpan(1, 1, 1), comm.group_span(64, 1, 8), comm.GroupSpan(1, 1, 1))
    flex = _ep_comm(LAYER, Split(**base, moe_dispatcher="flex"), spans, cluster, p)
    a2a = _ep_comm(LAYER, Split(**base), spans, cluster, p)
    remote = expected_groups_hit(256, 8, 8, 8, 4) * 7 / 8
    assert remote == pytest.approx(3.175, abs=1e-3)
    assert flex / a2a == pytest.approx(remote / 7, rel=0.1)
    assert _etp_ep_span(spans) == comm.GroupSpan(64, 8, 8)


def _violations(plan: ParallelPlan, cluster: str, gpus: int) -> list[str]:
    return layout_violations(plan, load_cluster(cluster, gpus), DSV3)


def test_flex_refused_where_megatron_or_deepep_cannot_run_it():
    ok = ParallelPlan(tp=2, pp=8, ep=64, etp=1, global_batch=4096, seq_len=4096, moe_dispatcher="flex")
    assert _violations(ok, "dgx-h100", 2048) == []
    cases = [
        (ok.changed(framework="torchtitan", zero=3, etp=None, ep=16, pp=1, tp=1), "dgx-h100", 2048, "has no DeepEP"),
        (ok.changed(ep=1, etp=1), "dgx-h100", 2048, "requires TPxEP > 1"),
        (ok.changed(moe_capacity_factor=1.0, moe_pad_to_capacity=True), "dgx-h100", 2048,
         "does not support moe_pad_expert_input_to_capacity"),
        (ok.changed(moe_shared_expert_overlap=True), "dgx-h100", 2048, "needs the alltoall dispatcher"),
        (ok, "gb200-nvl72", 2016, "4 per host"),
        (ok.changed(ep=32), "mi300x", 2048, "needs NVIDIA GPUs"),
    ]
    for plan, cluster, gpus, reason in cases:
        found = _violations(plan, cluster, gpus)
        assert any(reason in v for v in found), (reason, found)
    # An etp·ep group of 12 on 8-GPU hosts: neither inside one host nor whole hosts.
    odd = ParallelPlan(tp=1, pp=1, ep=4, etp=3, global_batch=96, seq_len=4096, moe_dispatcher="flex")
    qwen = load_model("qwen3-30b-a3b")
    found = layout_violations(odd, load_cluster("dgx-h100", 96), qwen)
    assert any("inside one host or a multiple of 8" in v for v in found), found


def test_flex_exports_deepep_and_imports_back():
    pf = ROUND_TRIP["deepseek-v3 deepep"]()
    args = megatron_args(pf)
    i = args.index("--moe-token-dispatcher-type")
    assert args[i + 1] == "flex" and args[args.index("--moe-flex-dispatcher-backend") + 1] == "deepep"
    assert megatron_violations(args, 2048) == []
    assert plan_from_megatron_args(args, 2048)[0].moe_dispatcher == "flex"
    hybrid = [a if a != "deepep" else "hybridep" for a in args]
    with pytest.raises(AutoparError, match="hybridep is not modelled"):
        plan_from_megatron_args(hybrid, 2048)
    legacy = [a for a in args if a not in ("--moe-flex-dispatcher-backend", "deepep")] + ["--moe-enable-deepep"]
    assert plan_from_megatron_args(legacy, 2048)[0].moe_dispatcher == "flex"


@pytest.mark.parametrize("changes,reason", [
    ({"moe_enable_deepep": ""}, "DeepEP backend is only supported with flex token dispatcher"),
    ({"moe_token_dispatcher_type": "flex", "moe_pad_expert_input_to_capacity": "",
      "moe_expert_capacity_factor": "1.0"}, "does not support moe_pad_expert_input_to_capacity"),
    ({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "nccl"}, "is not one of deepep, hybridep"),
    ({"moe_token_dispatcher_type": "flex", "expert_model_parallel_size": "1", "expert_tensor_parallel_size": "1"},
     "requires TPxEP > 1"),
])
def test_megatron_flex_dispatcher_rules(changes, reason):
    args = with_args(MOE, **changes)
    assert megatron_violations(MOE, 64) == []
    assert any(reason in v for v in megatron_violations(args, 64)), megatron_violations(args, 64)
