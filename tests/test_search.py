"""Plan search: the DP partition and the CP-SAT recompute model equal brute force on seeded random
instances; the driver's best equals the minimum of `estimate` over every enumerated candidate;
the pruning bounds are bounds; fix= is respected; infeasible inputs raise domain errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

from autopar.api import load_cluster, load_model, resolve_cost_model
from autopar.cost.memory import with_overheads
from autopar.cost.step import estimate
from autopar.errors import InvalidPlanError, NoFeasiblePlanError
from autopar.model import ModelSpec, build_graph
from autopar.schema.model import MoESpec
from autopar.schema.plan import ParallelPlan, Recompute, plan_violations
from autopar.search import plan_key, search, search_graph, space_spec_for
from autopar.search.brute import brute_force, score_all
from autopar.search.costs import Pricer, stage_inputs, stage_memory_model
from autopar.search.ilp import RecomputeProblem, brute_force_recompute, recompute_problem, solve_recompute
from autopar.search.partition import StageInputs, brute_force_partition, partition_layers, stage_cost
from autopar.search.space import candidates

SEEDS = range(8)


def _random_spec(seed: int, moe: bool = False) -> ModelSpec:
    rng = np.random.default_rng(seed)
    heads = int(rng.choice([32, 64, 96]))
    kv = int(rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    hidden = heads * 128
    return ModelSpec(
        name=f"rand{seed}", num_layers=int(rng.integers(4, 13)), hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=kv, ffn_hidden_size=int(hidden * rng.choice([3, 4])), vocab_size=int(rng.choice([32000, 128256])),
        tie_embeddings=bool(rng.integers(0, 2)),
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=hidden * 2) if moe else None)


def _instance(seed: int, moe: bool = False):
    rng = np.random.default_rng(1000 + seed)
    graph = build_graph(_random_spec(seed, moe))
    cluster = load_cluster(str(rng.choice(["dgx-a100-40gb", "dgx-h100"])), int(rng.choice([8, 16, 32])))
    p = resolve_cost_model(cluster, None)
    seq = int(rng.choice([2048, 4096]))
    gbs = int(rng.choice([16, 32, 64]))
    return graph, cluster, p, seq, gbs


# ----------------------------------------------------------------------------- partition DP


def _random_stage_inputs(rng, n: int, stages: int) -> StageInputs:
    is_dec = np.array([False] + [True] * n + [False, False])
    items = len(is_dec)
    return StageInputs(time_s=rng.uniform(0.5, 2.0, items), state_bytes=rng.uniform(1, 3, items),
                       saved_bytes=rng.uniform(0, 1, items), work_bytes=rng.uniform(0, 0.5, items) * is_dec,
                       is_decoder=is_dec, inflight=tuple(range(stages, 0, -1)),
                       usable_bytes=float(rng.uniform(3, 3 * n)), extra_last_bytes=float(rng.uniform(0, 1)))


@pytest.mark.parametrize("seed", range(60))
def test_partition_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 11))
    stages = int(rng.integers(1, min(n, 5) + 1))
    inputs = _random_stage_inputs(rng, n, stages)
    dp, brute = partition_layers(inputs), brute_force_partition(inputs)
    assert (dp is None) == (brute is None)
    if dp is not None:
        assert dp.bottleneck_s == pytest.approx(brute.bottleneck_s, rel=1e-12)
        assert sum(dp.counts) == n and min(dp.counts) >= 1
        for r, (lo, hi) in enumerate(zip(np.cumsum((0,) + dp.counts), np.cumsum(dp.counts))):
            t, mem = stage_cost(inputs, r, int(lo), int(hi))
            assert t <= dp.bottleneck_s * (1 + 1e-12) and mem <= inputs.usable_bytes


def test_partition_moves_layers_off_the_embedding_and_head_stages():
    """Hand-worked: 6 unit decoders on 3 stages, embedding and head 1 each: 8 units over 3 stages
    need a bottleneck ≥ 3, which (2, 2, 2) reaches (1+2, 2, 2+1). With an embedding of 3 the total
    is 10, so ≥ 4, and stage 0 can then hold one decoder only (3 + 2 = 5 > 4)."""
    is_dec = np.array([False] + [True] * 6 + [False])
    t = np.ones(8)
    inputs = StageInputs(time_s=t, state_bytes=np.zeros(8), saved_bytes=np.zeros(8), work_bytes=np.zeros(8),
                         is_decoder=is_dec, inflight=(3, 2, 1), usable_bytes=1.0)
    assert partition_layers(inputs).bottleneck_s == 3.0
    t[0] = 3.0  # a heavy embedding: stage 0 should take one decoder only
    part = partition_layers(inputs)
    assert part.counts[0] == 1 and part.bottleneck_s == 4.0


# ----------------------------------------------------------------------------- recompute ILP


def _random_recompute_problem(rng) -> RecomputeProblem:
    stages = int(rng.integers(1, 4))

    def ints(lo, hi):
        return tuple(int(x) for x in rng.integers(lo, hi, stages))

    none = ints(50, 100)
    sel = tuple(int(x * rng.uniform(0.4, 0.8)) for x in none)
    full = tuple(int(x * 0.1) for x in none)
    return RecomputeProblem(
        layers=ints(1, 5), base_ns=ints(1000, 5000), full_ns=ints(100, 300), sel_ns=ints(10, 80),
        state_bytes=ints(100, 500), fixed_saved_bytes=ints(0, 30), none_bytes=none, sel_bytes=sel, full_bytes=full,
        work_full_bytes=tuple(a - b for a, b in zip(none, full)),
        work_sel_bytes=tuple(a - b for a, b in zip(none, sel)),
        inflight=tuple(range(stages, 0, -1)), usable_bytes=int(rng.integers(300, 1500)),
        num_microbatches=int(rng.integers(1, 9)), vpp=int(rng.choice([1, 1, 2, 3])))


@pytest.mark.parametrize("method", ["stagewise", "cp-sat"])
@pytest.mark.parametrize("seed", range(60))
def test_recompute_ilp_equals_brute_force(seed, method):
    pb = _random_recompute_problem(np.random.default_rng(seed))
    brute = brute_force_recompute(pb)
    if brute is None:
        with pytest.raises(NoFeasiblePlanError, match="full recompute"):
            solve_recompute(pb, method)
        return
    sol = solve_recompute(pb, method)
    assert sol.status == "OPTIMAL"
    assert sol.objective_ns == brute


@pytest.mark.parametrize("seed", range(4))
def test_recompute_ilp_on_real_tables_equals_brute_force_and_maps_to_a_fitting_plan(seed):
    graph, cluster, p, seq, gbs = _instance(seed)
    spec = space_spec_for(graph, cluster, seq, gbs)
    pricer = Pricer(graph, cluster, p)
    def choices(plan):  # brute-force size: Π_r (L_r + 1)(L_r + 2)/2
        per_rank = -(-graph.spec.num_layers // plan.pp)
        return ((per_rank + 1) * (per_rank + 2) // 2) ** plan.pp

    plans = [x for x in candidates(spec) if x.pp > 1 and x.recompute.mode == "none" and choices(x) <= 20000][::5][:6]
    assert plans
    for plan in plans:
        mem = stage_memory_model(graph, cluster, plan, p, 0.1)
        stages = estimate(graph, cluster, plan, p).stages
        counts = tuple(stages[r].layers[c] for c in range(plan.vpp) for r in range(plan.pp))
        pb = recompute_problem(pricer.table(plan), mem, counts, plan.pp, plan.vpp,
                               plan.num_microbatches(cluster.num_gpus))
        brute = brute_force_recompute(pb)
        if brute is None:
            continue
        sol = solve_recompute(pb)
        assert sol.objective_ns == brute == solve_recompute(pb, "cp-sat").objective_ns
        mapped = plan.model_copy(update={"recompute": sol.to_recompute()})
        assert not plan_violations(mapped, **spec.validator_kwargs())


def test_ilp_solution_maps_onto_the_cost_models_uniform_recompute():
    from autopar.search.ilp import RecomputeSolution

    assert RecomputeSolution((0, 0), (0, 0), 0, "OPTIMAL").to_recompute().mode == "none"
    assert RecomputeSolution((0, 0), (1, 2), 0, "OPTIMAL").to_recompute().mode == "selective"
    r = RecomputeSolution((1, 0), (1, 2), 0, "OPTIMAL").to_recompute()
    assert (r.mode, r.num_layers) == ("full", 2)


# ----------------------------------------------------------------------------- cost views


@pytest.mark.parametrize("seed", range(8))
def test_bounds_never_exceed_the_estimate(seed):
    graph, cluster, p, seq, gbs = _instance(seed, moe=seed % 2 == 1)
    pricer = Pricer(graph, cluster, p)
    for plan in candidates(space_spec_for(graph, cluster, seq, gbs))[::7]:
        e = estimate(graph, cluster, plan, p)
        assert pricer.time_lower_bound_s(plan) <= e.step_time_s * (1 + 1e-9)
        assert pricer.quick_memory_lower_bound_bytes(plan) <= e.peak_memory_bytes * (1 + 1e-9)
        assert pricer.memory_lower_bound_bytes(plan) <= e.peak_memory_bytes * (1 + 1e-9)
        assert pricer.rank_memory_lower_bound_bytes(plan) <= pricer.memory_lower_bound_bytes(plan) * (1 + 1e-9)
        full_k = plan.model_copy(update={"recompute": Recompute(mode="full", num_layers=1)})
        assert pricer.time_lower_bound_s(full_k) <= estimate(graph, cluster, full_k, p).step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_nested_bounds_hold_for_every_member_with_the_zero2_floor(seed):
    """family_bound_s of a family's largest micro batch (over the family's vpps) ≤ group_bound_s of
    the group's largest ≤ time_lower_bound_s ≤ estimate for every candidate; ZeRO 2 candidates
    carry a positive DP floor."""
    graph, cluster, p, seq, gbs = _instance(seed, moe=seed % 2 == 1)
    pricer = Pricer(graph, cluster, p)
    plans = candidates(space_spec_for(graph, cluster, seq, gbs))
    fam_largest, group_largest, fam_vpps = {}, {}, {}
    for x in plans:
        fam = (x.tp, x.cp, x.ep, x.expert_tp, x.sequence_parallel, x.pp, x.zero)
        group = fam + (x.vpp, x.recompute)
        if x.mbs > fam_largest.get(fam, x).mbs or fam not in fam_largest:
            fam_largest[fam] = x
        if x.mbs > group_largest.get(group, x).mbs or group not in group_largest:
            group_largest[group] = x
        fam_vpps.setdefault(fam, set()).add(x.vpp)
    floors = 0
    for x in plans[::3]:
        fam = (x.tp, x.cp, x.ep, x.expert_tp, x.sequence_parallel, x.pp, x.zero)
        step_s = estimate(graph, cluster, x, p).step_time_s
        assert pricer.family_bound_s(fam_largest[fam], sorted(fam_vpps[fam])) <= pricer.group_bound_s(group_largest[fam + (x.vpp, x.recompute)]) * (1 + 1e-12)
        assert pricer.group_bound_s(group_largest[fam + (x.vpp, x.recompute)]) <= pricer.time_lower_bound_s(x) * (1 + 1e-12)
        assert pricer.time_lower_bound_s(x) <= step_s
        floors += x.zero == 2 and x.dp_for(cluster.num_gpus) > 1 and pricer.dp_floor_s(x) > 0
    assert floors > 0
    groups: dict[tuple, list] = {}
    for x in plans:
        groups.setdefault((x.tp, x.cp, x.ep, x.expert_tp, x.sequence_parallel, x.pp, x.zero, x.vpp, x.recompute), []).append(x)
    provisional = 0
    for members in list(groups.values())[::2]:  # provisional member bounds ≤ each member's exact bound
        largest = max(members, key=lambda x: x.mbs)
        others = [x for x in members if x is not largest]
        for x, bound in zip(others, pricer.member_bounds_s(others, largest)):
            assert bound <= pricer.time_lower_bound_s(x)
            provisional += 1
    assert provisional > 0


def test_zero2_floor_by_hand_and_below_the_charged_dp_time():
    """Llama-3-8B, tp2 pp2 dp16 on 64 H100, ZeRO 2, gbs 128 (m = 8): every microbatch
    reduce-scatters the rank's fp32 gradients over dp 16 (stride tp = 2: 4 ranks per node, 4 nodes).
    Floor by hand: m · (15/16 · mean params · 4 B) / (4 rails · NIC rate · inter-node efficiency)."""
    from autopar.cost import comm
    from autopar.cost.params import for_framework
    from autopar.cost.step import GRAD_BUCKETS, dp_sync_lower_bound_s

    graph = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", 64)
    p = resolve_cost_model(cluster, None)
    plan = ParallelPlan(tp=2, pp=2, zero=2, mbs=1, global_batch=128, seq_len=8192)
    pricer = Pricer(graph, cluster, p)
    layout = pricer.layout(plan)
    assert (layout.dp, layout.num_microbatches) == (16, 8)
    assert (layout.dp_span.size, layout.dp_span.ranks_per_node, layout.dp_span.nodes) == (16, 4, 4)
    dense, expert = pricer.param_sums(plan)
    assert expert == 0
    q = for_framework(p, plan.framework)
    bw = min(cluster.intra_node_bytes_per_s * q.intra_node_efficiency,
             4 * cluster.inter_node_bytes_per_s_per_gpu * q.inter_node_efficiency)
    by_hand = 8 * (15 / 16 * dense / 2 * 4) / bw
    floor = dp_sync_lower_bound_s(dense / 2, 0.0, layout, cluster, p, plan)
    assert floor == pytest.approx(by_hand, rel=1e-12)
    e = estimate(graph, cluster, plan, p)
    assert 0 < floor / GRAD_BUCKETS < e.time_breakdown_s["dp_comm"]
    assert floor < e.step_time_s and pricer.time_lower_bound_s(plan) <= e.step_time_s
    assert pricer.dp_floor_s(plan.model_copy(update={"zero": 1})) == 0.0
    for size in (1.0, 1e3, 1e6, 1e9, 1e11):  # the linear floor stays below the collective it bounds
        assert comm.reduce_scatter_floor_s(size, layout.dp_span, cluster, p) <= comm.reduce_scatter_s(
            size, layout.dp_span, cluster, p)


@pytest.mark.parametrize("seed", range(4))
def test_peak_memory_equals_the_estimates_peak(seed):
    """The memory-only peak the "no plan fits" message ranks by (Pricer.peak_memory_bytes) is the
    estimate's peak, exactly, on every framework (a Pricer's memo shared across the plans)."""
    graph, cluster, p, seq, gbs = _instance(seed, moe=seed % 2 == 1)
    cases = [(graph, cluster, p, seq, gbs, "megatron"), (graph, cluster, p, seq, gbs, "deepspeed")]
    if seed == 0:  # torchtitan builds its registry's models only
        titan = load_cluster("dgx-h100", 16)
        cases.append((load_model("llama3-8b"), titan, resolve_cost_model(titan, None), 8192, 32, "torchtitan"))
    for graph, cluster, p, seq, gbs, framework in cases:
        pricer = Pricer(graph, cluster, p)
        for plan in candidates(space_spec_for(graph, cluster, seq, gbs, framework=framework))[::13]:
            assert pricer.peak_memory_bytes(plan) == estimate(graph, cluster, plan, p).peak_memory_bytes


@pytest.mark.parametrize("seed", range(4))
def test_stage_memory_model_matches_the_estimate(seed):
    """The DP/ILP's linear stage memory equals the estimate's rank memory (vpp 1, ZeRO < 3)."""
    graph, cluster, p, seq, gbs = _instance(seed, moe=seed == 3)
    pricer = Pricer(graph, cluster, p)
    for plan in [x for x in candidates(space_spec_for(graph, cluster, seq, gbs)) if x.vpp == 1 and x.zero < 3][::11]:
        e = estimate(graph, cluster, plan, p)
        mem = stage_memory_model(graph, cluster, plan, p, 0.0)
        inputs = stage_inputs(pricer.table(plan), mem, plan)
        start = 0
        for r, stage in enumerate(e.stages):
            count = stage.layers[0]
            _, allocated = stage_cost(inputs, r, start, start + count)
            start += count
            assert with_overheads(allocated, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation) == \
                pytest.approx(stage.memory_bytes, rel=1e-9)


# ----------------------------------------------------------------------------- driver vs brute force


@pytest.mark.parametrize("seed", SEEDS)
def test_search_best_equals_brute_force_minimum(seed):
    graph, cluster, p, seq, gbs = _instance(seed, moe=seed == 5)
    spec = space_spec_for(graph, cluster, seq, gbs)
    brute = brute_force(graph, cluster, p, spec, top=3)
    if not brute:
        with pytest.raises(NoFeasiblePlanError):
            search_graph(graph, cluster, p, spec, top=3, refine=False)
        return
    result = search_graph(graph, cluster, p, spec, top=3, refine=False)
    assert [plan_key(x) for x, _ in result.plans] == [plan_key(x) for x, _ in brute]
    assert [e.step_time_s for _, e in result.plans] == [e.step_time_s for _, e in brute]
    assert result.candidates == len(candidates(spec))
    assert result.scored + result.pruned <= result.candidates
    assert result.feasible <= result.scored
    refined = search_graph(graph, cluster, p, spec, top=3)
    assert refined.plans[0][1].step_time_s <= brute[0][1].step_time_s
    for plan, e in refined.plans:  # search and evaluation agree
        assert e.fits and estimate(graph, cluster, plan, p, 0.1).step_time_s == e.step_time_s
        assert not plan_violations(plan, **spec.validator_kwargs())


def test_search_prunes_most_candidates_on_a_large_cluster():
    result = search("llama3-70b", "dgx-h100", 64, 8192, 128)
    assert result.scored < result.candidates / 10
    assert result.pruned + result.scored <= result.candidates
    best = result.plans[0][1].step_time_s
    assert all(e.step_time_s >= best for _, e in result.plans)


def test_optimum_beats_every_scored_alternative_on_a_small_cluster():
    graph, cluster, p, seq, gbs = _instance(0)
    spec = space_spec_for(graph, cluster, seq, gbs)
    best = search_graph(graph, cluster, p, spec, top=1).plans[0][1].step_time_s
    for _, e in score_all(graph, cluster, p, spec):
        if e.fits:
            assert best <= e.step_time_s


# ----------------------------------------------------------------------------- user constraints


def test_fix_pins_axes():
    fix = {"tp": 2, "pp": 2, "recompute": "full", "zero": 1}
    result = search("llama3-8b", "dgx-h100", 16, 4096, 64, fix=fix)
    for plan, _ in result.plans:
        assert (plan.tp, plan.pp, plan.recompute.mode, plan.zero) == (2, 2, "full", 1)
    result = search("llama3-8b", "dgx-h100", 16, 4096, 64, fix={"dp": 4, "mbs": 2})
    assert all(plan.dp_for(16) == 4 and plan.mbs == 2 for plan, _ in result.plans)


def test_max_tp_and_framework_restrict_the_space():
    result = search("llama3-8b", "dgx-h100", 16, 4096, 64, max_tp=2, framework="deepspeed")
    for plan, _ in result.plans:
        assert plan.tp <= 2 and plan.framework == "deepspeed" and plan.vpp == 1 and plan.cp == 1


def test_impossible_fix_raises_naming_the_problem():
    with pytest.raises(InvalidPlanError, match="tp 3 must divide"):
        search("llama3-8b", "dgx-h100", 24, 4096, 48, fix={"tp": 3})
    with pytest.raises(InvalidPlanError, match="unknown axis"):
        search("llama3-8b", "dgx-h100", 16, 4096, 64, fix={"tensor": 2})


def test_nothing_fits_raises_with_the_smallest_shortfall():
    spec = ModelSpec(name="too-big", num_layers=4, hidden_size=32768, num_attention_heads=64, num_kv_heads=8,
                     ffn_hidden_size=131072, vocab_size=32000)
    graph = build_graph(spec)
    cluster = load_cluster("dgx-a100-40gb", 8)
    p = resolve_cost_model(cluster, None)
    space = space_spec_for(graph, cluster, 2048, 8)
    shortfall = min(e.peak_memory_bytes - cluster.hbm_bytes * 0.9 for _, e in score_all(graph, cluster, p, space))
    assert shortfall > 0
    with pytest.raises(NoFeasiblePlanError, match=r"GiB over; use more GPUs") as info:
        search_graph(graph, cluster, p, space)
    assert f"{shortfall / 2**30:.1f} GiB over" in str(info.value)
    # the advice is the count the shortfall allows, not "double it"
    from autopar.search.driver import min_gpus_for_memory

    usable = cluster.hbm_bytes * 0.9
    need = min_gpus_for_memory(8, usable + shortfall, usable, p.cuda_context_bytes + p.comm_buffer_bytes, 8)
    assert need > 16 and f"at least {need:,} " in str(info.value)


def test_memory_margin_is_applied():
    loose = search("llama3-70b", "dgx-h100", 64, 8192, 128, memory_margin=0.0, top=1).plans[0][1]
    tight = search("llama3-70b", "dgx-h100", 64, 8192, 128, memory_margin=0.3, top=1).plans[0][1]
    assert tight.peak_memory_bytes <= tight.memory_capacity_bytes * 0.7
    assert loose.step_time_s <= tight.step_time_s


def test_search_is_deterministic():
    a = search("mixtral-8x7b", "dgx-h100", 32, 4096, 64)
    b = search("mixtral-8x7b", "dgx-h100", 32, 4096, 64)
    assert [plan_key(x) for x, _ in a.plans] == [plan_key(x) for x, _ in b.plans]
    assert [e.step_time_s for _, e in a.plans] == [e.step_time_s for _, e in b.plans]
    assert (a.candidates, a.pruned, a.scored, a.feasible) == (b.candidates, b.pruned, b.scored, b.feasible)


def test_405b_on_16k_gpus_is_fast_and_beats_the_published_layout():
    """Llama 3 405B on 16,384 H100s (Dubey et al. 2024 §3.3.2: tp8 pp16 dp128, seq 8192, 2048
    sequences). The search must finish in seconds and find nothing slower than that layout."""
    load_model("llama3.1-405b")
    start = time.perf_counter()
    result = search("llama3.1-405b", "dgx-h100", 16384, 8192, 2048)
    assert time.perf_counter() - start < 5.0
    g, c = load_model("llama3.1-405b"), load_cluster("dgx-h100", 16384)
    plan = ParallelPlan(tp=8, pp=16, global_batch=2048, seq_len=8192)
    published = estimate(g, c, plan, resolve_cost_model(c, None), 0.1)
    assert result.plans[0][1].step_time_s <= published.step_time_s


@pytest.mark.parametrize("seed", range(3))
def test_ilp_memory_matches_the_estimate_with_interleaving(seed):
    """With no recompute, the ILP's rank memory (interleaved: chunks in flight × mean chunk) is the
    estimate's rank memory, up to integer rounding."""
    graph, cluster, p, seq, gbs = _instance(seed)
    pricer = Pricer(graph, cluster, p)
    plans = [x for x in candidates(space_spec_for(graph, cluster, seq, gbs))
             if x.pp > 1 and x.recompute.mode == "none" and x.zero < 3]
    for plan in plans[::9]:
        stages = estimate(graph, cluster, plan, p).stages
        counts = tuple(stages[r].layers[c] for c in range(plan.vpp) for r in range(plan.pp))
        pb = recompute_problem(pricer.table(plan), stage_memory_model(graph, cluster, plan, p, 0.0), counts,
                               plan.pp, plan.vpp, plan.num_microbatches(cluster.num_gpus))
        for r, stage in enumerate(stages):
            allocated = pb.state_bytes[r] + pb.inflight[r] * (pb.fixed_saved_bytes[r]
                                                              + pb.layers[r] * pb.none_bytes[r]) / plan.vpp
            assert with_overheads(allocated, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation) == \
                pytest.approx(stage.memory_bytes, rel=1e-6)


def test_progress_is_reported_and_refine_plan_balances_a_published_layout():
    calls = []
    search("llama3-8b", "dgx-h100", 16, 4096, 64, progress=lambda phase, done, total: calls.append(phase))
    assert "score" in calls
    from autopar.search import refine_plan

    g, c = load_model("llama3.1-405b"), load_cluster("dgx-h100", 16384)
    p = resolve_cost_model(c, None)
    published = ParallelPlan(tp=8, pp=16, global_batch=2048, seq_len=8192)
    assert not estimate(g, c, published, p, 0.1).fits  # the even split overflows the first stage
    variants = refine_plan(g, c, p, published)
    assert variants and all(e.fits for _, e in variants)
    assert any(x.layers_per_stage and x.layers_per_stage[0] < x.layers_per_stage[8] for x, _ in variants)
