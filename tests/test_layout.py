"""The Layout (autopar.cost.layout): hand-worked group sizes, shards and spans, and the search's stage
memory equal to the estimate's rank memory on every candidate of a MoE search space."""

from __future__ import annotations

import pytest

from autopar.cost.layout import Layout, stage_layer_counts
from autopar.cost.memory import with_overheads
from autopar.cost.step import estimate
from autopar.inputs import load_cluster, load_inputs, resolve_cost_model
from autopar.model import ModelSpec, build_graph
from autopar.schema.model import MoESpec
from autopar.schema.plan import ParallelPlan
from autopar.search.costs import Pricer, stage_inputs, stage_memory_model
from autopar.search.ilp import recompute_problem, stage_memory_scaled
from autopar.search.partition import stage_cost
from autopar.search.space import candidates, space_spec_for
from autopar.units import GiB


def _mixtral_plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"tp": 4, "pp": 2, "ep": 2, "etp": 1, "zero": 1, "global_batch": 64, "seq_len": 4096,
                           "recompute": {"mode": "full"}, **kw})


@pytest.mark.parametrize("model, framework", [("mixtral-8x7b", "megatron"), ("llama3-8b", "torchtitan"),
                                              ("llama3-8b", "deepspeed")])
def test_layout_build_equals_the_dataclass_constructor(model, framework):
    """Layout.build fills the instance dict directly: the same fields and values (and equality,
    hash and cached properties) as the dataclass's own __init__, on every candidate of a MoE space."""
    from dataclasses import fields

    graph, cluster, _ = load_inputs(model, "dgx-h100", 32)
    plans = candidates(space_spec_for(graph, cluster, 4096, 256, framework=framework))[::37][:300]
    assert plans
    names = [f.name for f in fields(Layout)]
    for plan in plans + [plans[0].model_copy(update={"zero_shard_size": 2, "layers_per_stage": None})]:
        built = Layout.of(plan, cluster, graph)
        dp = plan.dp_for(cluster.num_gpus)
        reference = Layout(num_gpus=cluster.num_gpus, num_layers=graph.spec.num_layers,
                           gpus_per_node=cluster.gpus_per_node, tp=plan.tp, pp=plan.pp, cp=plan.cp, ep=plan.ep,
                           etp=plan.expert_tp, vpp=plan.vpp, dp=dp, num_microbatches=plan.num_microbatches(cluster.num_gpus),
                           dp_shard=plan.zero_shard_size or dp, zero=plan.zero, layers_per_stage=plan.layers_per_stage,
                           tied_embedding_copy=graph.spec.tie_embeddings and plan.pp > 1 and plan.framework == "megatron",
                           framework=plan.framework)
        assert list(built.__dict__) == names
        assert built == reference and hash(built) == hash(reference)
        assert (built.stage_counts, built.inflight, built.dp_span) == (reference.stage_counts, reference.inflight,
                                                                       reference.dp_span)


def test_layout_of_mixtral_on_32_h100_by_hand():
    # 32 GPUs = tp4 · pp2 · dp4; experts re-slice them as etp1 · ep2 · edp8 · pp2 (Megatron's expert
    # data-parallel group: 32 / (1·2·2) = 8).
    graph, cluster, _ = load_inputs("mixtral-8x7b", "dgx-h100", 32)
    lay = Layout.of(_mixtral_plan(), cluster, graph)
    assert (lay.dp, lay.edp, lay.num_microbatches) == (4, 8, 16)
    assert (lay.dense_shard, lay.expert_shard, lay.dp_shard, lay.dp_replicate) == (4, 8, 4, 1)
    # tp4 inside a node; dp·cp = 4 ranks at stride 4: 2 per node over 2 nodes; edp 8 at stride 2: 4 per node.
    assert (lay.tp_span.nodes, lay.dp_span.ranks_per_node, lay.dp_span.nodes) == (1, 2, 2)
    assert (lay.edp_span.size, lay.edp_span.ranks_per_node, lay.edp_span.nodes) == (8, 4, 2)
    assert lay.stage_counts == (16, 16) and lay.inflight == (2, 1) and lay.pp_crosses_nodes
    assert lay.rank_stages(1) == (1,) and not lay.tied_embedding_copy


def test_layout_interleaved_chunks_and_default_split():
    graph, cluster, _ = load_inputs("llama3-70b", "dgx-h100", 64)
    lay = Layout.of(ParallelPlan(tp=8, pp=4, vpp=5, global_batch=128, seq_len=8192), cluster, graph)
    assert lay.rank_stages(1) == (1, 5, 9, 13, 17)  # chunk c of rank r is virtual stage c·pp + r
    assert lay.stage_counts == lay.default_stage_counts == stage_layer_counts(80, 20) == (4,) * 20
    # Megatron's interleaved warm-up (pp − r − 1)·2 + (vpp − 1)·pp, plus one: 6 + 16 + 1 on rank 0.
    assert lay.inflight == (23, 21, 19, 17)
    assert lay.launch_shape == (8, 8)


def test_hybrid_shard_with_cp_shards_over_k_times_cp():
    # zero_shard_size 2 of dp 4 = two optimizer instances (Megatron --num-distributed-optimizer-instances 2);
    # each shards over 2 dp ranks × cp 2. Experts: edp 16 / 2 instances = 8.
    graph, cluster, _ = load_inputs("mixtral-8x7b", "dgx-h100", 32)
    lay = Layout.of(ParallelPlan(tp=2, cp=2, pp=2, ep=2, etp=1, zero_shard_size=2, global_batch=64, seq_len=8192),
                    cluster, graph)
    assert (lay.dp, lay.edp, lay.dp_shard, lay.dp_replicate) == (4, 8, 2, 2)
    assert (lay.dense_shard, lay.expert_shard) == (4, 4)


def test_issue_example_search_memory_model_equals_the_estimate():
    """Mixtral-8x7B on 32 H100, tp4 pp2 ep2 etp1 zero1: the partition DP's model of rank 0 used to
    shard expert optimizer state over min(dp·cp, edp) = 4 ranks (the estimate: edp = 8): 111.3 GiB
    against the estimate's 94.7 GiB at seq 4096 without recompute. Now they are one number."""
    graph, cluster, p = load_inputs("mixtral-8x7b", "dgx-h100", 32)
    plan = _mixtral_plan(recompute={"mode": "none"})
    est = estimate(graph, cluster, plan, p, 0.0)
    mem = stage_memory_model(graph, cluster, plan, p, 0.0)
    inputs = stage_inputs(Pricer(graph, cluster, p).table(plan), mem, plan)
    _, allocated = stage_cost(inputs, 0, 0, est.stages[0].layers[0])
    search_bytes = with_overheads(allocated, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation)
    assert search_bytes == pytest.approx(est.stages[0].memory_bytes, rel=1e-12)
    # Adam state of a local expert parameter: 6 B (bf16 weight + fp32 grad) + 12 B / edp 8, held in
    # the linear model over (1 + fragmentation): model states do not fragment (peak_reserved_bytes).
    assert mem.state_per_expert * (1 + p.fragmentation) == pytest.approx(6 + 12 / 8)


def _moe_case():
    """A small MoE model (a dense first layer, tied embeddings) on two 8-GPU nodes: every split of
    every axis the space generates, 2,484 candidates, all scored."""
    spec = ModelSpec(name="moe-small", num_layers=4, hidden_size=1024, num_attention_heads=8, num_kv_heads=4,
                     ffn_hidden_size=2816, vocab_size=32000, tie_embeddings=True,
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1408, first_k_dense=1))
    graph = build_graph(spec)
    cluster = load_cluster("dgx-h100", 16)
    p = resolve_cost_model(cluster, None)
    return graph, cluster, p, candidates(space_spec_for(graph, cluster, 4096, 8))


_CASE = {}


@pytest.mark.parametrize("etp", ["1", "tp"])
def test_search_stage_memory_equals_estimate_on_every_moe_candidate(etp):
    """For EVERY candidate (etp 1, or etp = tp): the ILP's stage memory (every plan) and the
    partition DP's (vpp 1) with the cost model's overheads equal the estimate's rank memory."""
    if not _CASE:
        _CASE["moe"] = _moe_case()
    graph, cluster, p, plans = _CASE["moe"]
    pricer = Pricer(graph, cluster, p)
    # ZeRO < 3: the linear stage model leaves out FSDP's gathered weights (stage_memory_model's contract)
    chosen = [x for x in plans if x.expert_tp == (1 if etp == "1" else x.tp) and x.zero < 3]
    assert len(chosen) > 1000 and any(x.tp > 1 for x in chosen)  # not a sample; etp ≠ tp or etp = tp > 1
    over = lambda a: with_overheads(a, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation)  # noqa: E731
    for plan in chosen:
        est = estimate(graph, cluster, plan, p, 0.0)
        lay = pricer.layout(plan)
        table, mem = pricer.table(plan), stage_memory_model(graph, cluster, plan, p, 0.0)
        pb = recompute_problem(table, mem, lay.stage_counts, plan.pp, plan.vpp, lay.num_microbatches)
        mode = plan.recompute.mode
        for r, row in enumerate(est.stages):
            n = pb.layers[r]
            full, sel = (n, 0) if mode == "full" else (0, n) if mode == "selective" else (0, 0)
            ilp_bytes = over(stage_memory_scaled(pb, r, full, sel) / plan.vpp)
            assert ilp_bytes == pytest.approx(row.memory_bytes, rel=1e-9, abs=64), (plan, r)
        if plan.vpp == 1:
            inputs = stage_inputs(table, mem, plan)
            start = 0
            for r, row in enumerate(est.stages):
                _, allocated = stage_cost(inputs, r, start, start + row.layers[0])
                start += row.layers[0]
                assert over(allocated) == pytest.approx(row.memory_bytes, rel=1e-12), (plan, r)
    assert max(e for e in (pricer.layout(x).edp for x in chosen)) > min(pricer.layout(x).dp for x in chosen)


def test_optimizer_step_shards_expert_params_over_edp():
    """Megatron's distributed optimizer updates expert parameters over the expert data-parallel
    group: tp2 pp4 ep8 etp1 on 64 GPUs has dp 8 but edp 2, so a rank steps 1/8 of its dense and
    1/2 of its expert parameters (34 B of traffic each, four kernels)."""
    from autopar.cost.compute import memory_bound_time_s
    from autopar.cost.step import OPTIMIZER_BYTES_PER_PARAM, assign_layers, rank_chunks, stage_params

    graph, cluster, p = load_inputs("mixtral-8x7b", "dgx-h100", 64)
    plan = ParallelPlan(tp=2, pp=4, ep=8, etp=1, global_batch=256, seq_len=4096)
    lay = Layout.of(plan, cluster, graph)
    assert (lay.dp, lay.edp, lay.dense_shard, lay.expert_shard) == (8, 2, 8, 2)
    per_rank = []
    for chunks in rank_chunks(assign_layers(graph, lay), lay):
        dense = sum(stage_params(c, plan, False, graph.layers[0])[0] for c in chunks)
        expert = sum(stage_params(c, plan, False, graph.layers[0])[1] for c in chunks)
        per_rank.append(dense / 8 + expert / 2)
    want = memory_bound_time_s(max(per_rank) * OPTIMIZER_BYTES_PER_PARAM, cluster.hbm_bytes_per_s, p, kernels=4)
    assert estimate(graph, cluster, plan, p).time_breakdown_s["optimizer"] == pytest.approx(want, rel=1e-12)


def test_hybrid_shard_with_cp_in_the_estimate():
    # llama3-8b on 16 GPUs, cp2: dp 8; zero_shard_size 2 = 4 optimizer instances, each sharding the
    # 12 B/param of fp32 master + moments over 2 dp ranks × cp 2 = 4 GPUs.
    graph, cluster, p = load_inputs("llama3-8b", "dgx-h100", 16)
    plan = ParallelPlan(cp=2, pp=2, zero_shard_size=2, global_batch=64, seq_len=8192)
    rank0 = estimate(graph, cluster, plan, p).stages[0]
    assert rank0.memory_breakdown_bytes["optimizer"] == pytest.approx(12 * rank0.params / 4, rel=1e-12)
