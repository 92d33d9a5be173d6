"""The search driver: enumerate, bound, score, refine.

1. Enumerate the flat candidate list (autopar.search.space): every valid combination of degrees,
   micro batch, ZeRO stage and recompute mode, with the default layer split.
2. Bound: each candidate gets a cheap lower bound on its step time (autopar.search.costs: the
   estimate's pipeline closed form over exact per-rank times). Candidates are visited best-first
   in ascending bound order (ties by the plan's axes), and the walk stops as soon as a bound
   exceeds the K-th best step time found so far — no later candidate can enter the top K. Plans
   differing only in micro batch share one group bound until the group could still win.
3. Score: a visited candidate whose first/last pipeline rank already overflows memory (the
   estimate's own rank memory) is pruned; the rest are scored by `estimate`, the one model.
4. Refine: for the best visited candidates, the partition DP (partition.py; vpp = 1) moves layers
   between stages and the CP-SAT model (ilp.py) picks per-stage recompute, mapped onto full(K); the
   refined plans are scored by `estimate` too, so a refinement is kept only when the estimate says
   it is faster and fits.

Step 2–3 is exact over the enumerated space: the best plan equals the minimum of `estimate` over
every candidate (tests check this against brute force). Refinement can only improve on it.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autopar.cost.params import CostParams
from autopar.cost.step import DEFAULT_MEMORY_MARGIN, Estimate, estimate, usable_memory_bytes
from autopar.errors import NoFeasiblePlanError
from autopar.hardware import Cluster
from autopar.inputs import load_cluster, load_model, resolve_cost_model
from autopar.model.graph import ModelGraph
from autopar.schema.plan import FRAMEWORK_ZERO_STAGES, Framework, ParallelPlan, Precision, Recompute, RecomputeMode
from autopar.search.costs import Pricer, stage_inputs, stage_memory_model
from autopar.search.ilp import recompute_problem, solve_recompute
from autopar.search.partition import partition_layers
from autopar.search.space import SpaceSpec, candidates, plan_problems, space_spec_for
from autopar.units import GiB

Progress = Callable[[str, int, int], None]  # (phase, done, total); phases: score, refine
REFINE_POOL = 16  # candidates (at least `top`) handed to the DP and the ILP
_MODE_ORDER = {RecomputeMode.NONE: 0, RecomputeMode.SELECTIVE: 1, RecomputeMode.FULL: 2}


@dataclass
class SearchResult:
    """Best plans first (by estimated step time, then by their axes), only plans that fit.

    candidates: plans enumerated; pruned: skipped by a bound (pruned_time + pruned_memory);
    scored: enumerated plans priced by `estimate`; feasible: scored plans that fit; refined: plans
    the DP/ILP proposed and `estimate` priced; time_s: wall time of the search."""

    plans: list[tuple[ParallelPlan, Estimate]]
    candidates: int
    pruned: int
    scored: int
    feasible: int
    time_s: float
    pruned_time: int = 0
    pruned_memory: int = 0
    refined: int = 0
    num_gpus: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> tuple[ParallelPlan, Estimate]:
        return self.plans[0]


def plan_key(plan: ParallelPlan) -> tuple:
    """Total order on plans used to break ties (same input → same plans, every run)."""
    r = plan.recompute
    return (plan.tp, plan.pp, plan.cp, plan.ep, plan.expert_tp, plan.vpp, plan.mbs, plan.zero,
            plan.sequence_parallel, _MODE_ORDER[r.mode], -1 if r.num_layers is None else r.num_layers,
            r.modules, plan.layers_per_stage or ())


@dataclass
class _Walk:
    """Mutable state of one branch-and-bound walk."""

    top: int
    capacity_bytes: float
    best: list[tuple[float, tuple, ParallelPlan, Estimate]] = field(default_factory=list)
    visited: list[tuple[float, tuple, ParallelPlan]] = field(default_factory=list)
    shortfalls: list[tuple[float, tuple, ParallelPlan, bool]] = field(default_factory=list)  # (bytes, key, plan, exact)
    seen: set = field(default_factory=set)
    scored: int = 0
    feasible: int = 0
    refined: int = 0
    pruned_time: int = 0
    pruned_memory: int = 0

    @property
    def kth_s(self) -> float:
        return self.best[self.top - 1][0] if len(self.best) >= self.top else math.inf

    def add(self, plan: ParallelPlan, est: Estimate) -> None:
        key = plan_key(plan)
        if key in self.seen:
            return
        self.seen.add(key)
        bisect.insort(self.best, (est.step_time_s, key, plan, est), key=lambda x: (x[0], x[1]))
        del self.best[self.top:]


def search(model: str, cluster: str, gpus: int, seq_len: int, global_batch: int, *, top: int = 5,
           framework: Framework = Framework.MEGATRON, fix: dict | None = None, max_tp: int | None = None,
           memory_margin: float = DEFAULT_MEMORY_MARGIN, precision: Precision = Precision.BF16,
           cost_model: str | None = None,
           progress: Progress | None = None, refine: bool = True) -> SearchResult:
    """The `top` fastest plans of `model` on `gpus` GPUs of `cluster` that fit in memory with
    `memory_margin` of HBM kept free (default 0.1: allocator spikes and NCCL growth no model sees).

    fix pins axes by the CLI's names (tp pp dp cp ep etp vpp mbs zero sp recompute); max_tp caps tp;
    precision and framework are the user's choice, not searched. Raises NoFeasiblePlanError, with
    the smallest memory shortfall and the fixes, when no plan fits, and when `fix` leaves no valid
    plan (quoting the validator)."""
    graph = load_model(model)
    c = load_cluster(cluster, gpus)
    p = resolve_cost_model(c, cost_model)
    spec = space_spec_for(graph, c, seq_len, global_batch, framework=framework, precision=precision, fix=fix,
                          max_tp=max_tp)
    return search_graph(graph, c, p, spec, top=top, memory_margin=memory_margin, progress=progress, refine=refine)


def search_graph(graph: ModelGraph, cluster: Cluster, p: CostParams, spec: SpaceSpec, *, top: int = 5,
                 memory_margin: float = DEFAULT_MEMORY_MARGIN, progress: Progress | None = None,
                 refine: bool = True) -> SearchResult:
    """`search` on loaded inputs (the form tests and notebooks with custom graphs use)."""
    start = time.perf_counter()
    plans = candidates(spec)
    pricer = Pricer(graph, cluster, p)
    walk = _Walk(top=top, capacity_bytes=usable_memory_bytes(cluster.hbm_bytes, memory_margin))
    _branch_and_bound(plans, pricer, walk, memory_margin, progress)
    if refine:
        _refine(spec, pricer, walk, memory_margin, progress)
    if not walk.best:
        raise NoFeasiblePlanError(_nothing_fits_message(spec, pricer, walk, memory_margin))
    return SearchResult(
        plans=[(plan, est) for _, _, plan, est in walk.best], candidates=len(plans),
        pruned=walk.pruned_time + walk.pruned_memory, scored=walk.scored, feasible=walk.feasible,
        time_s=time.perf_counter() - start, pruned_time=walk.pruned_time, pruned_memory=walk.pruned_memory,
        refined=walk.refined, num_gpus=cluster.num_gpus)


def refine_plan(graph: ModelGraph, cluster: Cluster, p: CostParams, plan: ParallelPlan, *,
                memory_margin: float = DEFAULT_MEMORY_MARGIN, fix: dict | None = None) -> list[tuple[ParallelPlan, Estimate]]:
    """The DP-balanced split and the ILP's recompute applied to one given plan (e.g. a published
    layout), each priced by `estimate`; only variants that fit, fastest first."""
    spec = space_spec_for(graph, cluster, plan.seq_len, plan.global_batch, framework=plan.framework,
                          precision=plan.precision, fix=fix)
    pricer = Pricer(graph, cluster, p)
    walk = _Walk(top=8, capacity_bytes=usable_memory_bytes(cluster.hbm_bytes, memory_margin))
    for variant in _variants(spec, pricer, plan, memory_margin):
        _score_refined(spec, pricer, walk, variant, memory_margin)
    return [(x, est) for _, _, x, est in walk.best]


def _branch_and_bound(plans: list[ParallelPlan], pricer: Pricer, walk: _Walk, memory_margin: float,
                      progress: Progress | None) -> None:
    """Best-first over candidates by ascending time bound; stop when the bound passes the K-th best.

    Plans that differ only in micro batch form a group whose bound needs one cost table (that of
    its largest micro batch, see Pricer.group_bound_s); a group is expanded into per-plan bounds
    only when it is popped, i.e. when it could still beat the K-th best. The plans visited, and
    their order, are those of bounding every plan up front."""
    heap: list[tuple[float, int, tuple, object]] = []
    for key, members in _mbs_groups(plans, pricer).items():
        if len(members) == 1:
            heap.append((pricer.time_lower_bound_s(members[0]), 1, plan_key(members[0]), members[0]))
        else:
            heap.append((pricer.group_bound_s(max(members, key=lambda x: x.mbs)), 0, key, members))
    heapq.heapify(heap)
    done = 0
    while heap:
        bound, is_plan, key, item = heapq.heappop(heap)
        if bound > walk.kth_s:
            break
        if not is_plan:
            for plan in item:
                heapq.heappush(heap, (pricer.time_lower_bound_s(plan), 1, plan_key(plan), plan))
            continue
        done += 1
        if progress and done % 64 == 0:
            progress("score", done, len(plans))
        _visit(item, bound, key, pricer, walk, memory_margin)
    if progress:
        progress("score", done, len(plans))
    walk.pruned_time = len(plans) - done


def _mbs_groups(plans: list[ParallelPlan], pricer: Pricer) -> dict[tuple, list[ParallelPlan]]:
    """Plans keyed by every axis but the micro batch; with a profiled GEMM table (whose efficiency
    need not grow with m) every plan is its own group, so every bound stays a true lower bound."""
    groups: dict[tuple, list[ParallelPlan]] = {}
    for plan in plans:
        full = plan_key(plan)
        key = full[:6] + full[7:] if not pricer.p.gemm_table else full  # plan_key()[6] is mbs
        groups.setdefault(key, []).append(plan)
    return groups


def _visit(plan: ParallelPlan, bound: float, key: tuple, pricer: Pricer, walk: _Walk, memory_margin: float) -> None:
    walk.visited.append((bound, key, plan))
    low = pricer.quick_memory_lower_bound_bytes(plan)
    if low <= walk.capacity_bytes:
        low = pricer.memory_lower_bound_bytes(plan)
    if low > walk.capacity_bytes:
        walk.pruned_memory += 1
        walk.shortfalls.append((low - walk.capacity_bytes, key, plan, False))
        return
    est = estimate(pricer.graph, pricer.cluster, plan, pricer.p, memory_margin)
    walk.scored += 1
    if est.fits:
        walk.feasible += 1
        walk.add(plan, est)
    else:
        walk.shortfalls.append((est.peak_memory_bytes - walk.capacity_bytes, key, plan, True))


def _refine(spec: SpaceSpec, pricer: Pricer, walk: _Walk, memory_margin: float, progress: Progress | None) -> None:
    """DP partition (vpp = 1, pp > 1) and ILP recompute on the best visited candidates (by bound)
    that could fit with full recompute and whose no-recompute bound can still beat the K-th best."""
    if walk.best:
        pool = [x for _, _, x in walk.visited if x.recompute.mode != RecomputeMode.FULL]
    else:  # nothing fits yet: try the candidates closest to fitting
        pool = [x for _, _, x, _ in sorted(walk.shortfalls, key=lambda t: (t[0], t[1]))]
    limit, done = max(REFINE_POOL, walk.top), 0
    for plan in pool:
        if done >= limit:
            break
        if not _worth_refining(plan, pricer, walk):
            continue
        done += 1
        if progress:
            progress("refine", done, limit)
        for variant in _variants(spec, pricer, plan, memory_margin):
            _score_refined(spec, pricer, walk, variant, memory_margin)


def _worth_refining(plan: ParallelPlan, pricer: Pricer, walk: _Walk) -> bool:
    """Its bound without recompute beats the K-th best, and its first and last ranks fit with full
    recompute of every layer (the least memory any recompute choice reaches)."""
    none = plan.model_copy(update={"recompute": Recompute(mode=RecomputeMode.NONE)})
    if pricer.time_lower_bound_s(none) > walk.kth_s:
        return False
    full = plan.model_copy(update={"recompute": Recompute(mode=RecomputeMode.FULL)})
    return (pricer.quick_memory_lower_bound_bytes(full) <= walk.capacity_bytes
            and pricer.memory_lower_bound_bytes(full) <= walk.capacity_bytes)


def _variants(spec: SpaceSpec, pricer: Pricer, plan: ParallelPlan, memory_margin: float) -> list[ParallelPlan]:
    """Plans the DP and the ILP propose from one candidate."""
    graph, cluster, p = pricer.graph, pricer.cluster, pricer.p
    table = pricer.table(plan)
    mem = stage_memory_model(graph, cluster, plan, p, memory_margin)
    out = []
    layout = pricer.layout(plan)
    default = layout.default_stage_counts
    counts = default
    if plan.vpp == 1 and plan.pp > 1:
        part = partition_layers(stage_inputs(table, mem, plan))
        if part is not None and part.counts != counts:
            counts = part.counts
            out.append(plan.model_copy(update={"layers_per_stage": counts}))
    if "recompute" not in spec.fix:
        problem = recompute_problem(table, mem, counts, plan.pp, plan.vpp, layout.num_microbatches)
        try:
            solution = solve_recompute(problem)
        except NoFeasiblePlanError:
            return out
        lps = counts if counts != default else None
        out.append(plan.model_copy(update={"recompute": solution.to_recompute(), "layers_per_stage": lps}))
    return out


def _score_refined(spec: SpaceSpec, pricer: Pricer, walk: _Walk, plan: ParallelPlan, memory_margin: float) -> None:
    """Price a refined plan; a mapped full(K) that the estimate finds over memory gets K raised."""
    if plan_problems(spec, plan) or plan_key(plan) in walk.seen:
        return
    max_k = max(pricer.layout(plan).stage_counts)
    while True:
        est = estimate(pricer.graph, pricer.cluster, plan, pricer.p, memory_margin)
        walk.refined += 1
        if est.fits:
            walk.add(plan, est)
            return
        r = plan.recompute
        if r.mode != RecomputeMode.FULL or r.num_layers is None or r.num_layers >= max_k:
            return
        plan = plan.model_copy(update={"recompute": r.model_copy(update={"num_layers": r.num_layers + 1})})


def _nothing_fits_message(spec: SpaceSpec, pricer: Pricer, walk: _Walk, memory_margin: float) -> str:
    """The smallest shortfall (exact: bounds are re-priced by `estimate`) and what would fix it."""
    # Best-first over lower bounds: a bound is re-priced exactly only while it could still beat the
    # best exact shortfall found, so the plan named is the true closest among those visited.
    best: tuple[float, tuple, ParallelPlan] | None = None
    for short, key, plan, is_exact in sorted(walk.shortfalls, key=lambda t: (t[0], t[1])):
        if best is not None and (short, key) >= best[:2]:
            break
        if not is_exact:
            est = estimate(pricer.graph, pricer.cluster, plan, pricer.p, memory_margin)
            short = est.peak_memory_bytes - walk.capacity_bytes
        if best is None or (short, key) < best[:2]:
            best = (short, key, plan)
    short, _, plan = best
    cap_gib = walk.capacity_bytes / GiB
    fixed = pricer.p.cuda_context_bytes + pricer.p.comm_buffer_bytes
    need = min_gpus_for_memory(spec.num_gpus, walk.capacity_bytes + short, walk.capacity_bytes, fixed,
                               spec.gpus_per_node)
    more = (f"use more GPUs: at least {need:,} (memory per GPU falls at best in proportion to the GPU count)" if need else
            "a GPU with more memory (the per-GPU buffers alone exceed the usable memory)")
    fixes = [more, "a shorter sequence or smaller global batch"]
    if plan.recompute.mode != RecomputeMode.FULL or plan.recompute.num_layers is not None:
        fixes.append("full recompute (fix recompute=full)")
    higher = [z for z in FRAMEWORK_ZERO_STAGES[spec.framework] if z > plan.zero]
    fixes.append(f"ZeRO {higher[-1]}" if higher else
                 "a framework with ZeRO 3 (deepspeed, torchtitan)" if spec.framework == Framework.MEGATRON else "")
    if memory_margin > 0:
        fixes.append(f"a memory margin below {memory_margin:g}")
    return (f"no plan fits: with {cap_gib:.1f} GiB usable on each of {spec.num_gpus} GPUs ({memory_margin:.0%} "
            f"of HBM kept free), the closest plan ({plan.layout()}, mbs {plan.mbs}, recompute "
            f"{plan.recompute.label()}, zero {plan.zero}) is {short / GiB:.1f} GiB over; "
            + ", ".join(f for f in fixes if f))


def min_gpus_for_memory(num_gpus: int, peak_bytes: float, capacity_bytes: float, fixed_bytes: float,
                        gpus_per_node: int) -> int | None:
    """The fewest GPUs on which a plan whose peak on `num_gpus` GPUs is `peak_bytes` could fit, or
    None when even infinitely many cannot (the per-GPU fixed buffers exceed the capacity).

    Peak = allocated·(1 + fragmentation) + fixed buffers (cost.memory.with_overheads); model states
    and activations shard at best as 1/GPU count (ZeRO over dp, tp, pp, cp), so k-fold GPUs need
    (peak − fixed)/k + fixed ≤ capacity: k ≥ (peak − fixed)/(capacity − fixed). Fewer GPUs cannot
    fit; the count is rounded up to whole nodes (or one partial node)."""
    if capacity_bytes <= fixed_bytes:
        return None
    k = max(1.0, (peak_bytes - fixed_bytes) / (capacity_bytes - fixed_bytes))
    need = math.ceil(num_gpus * k - 1e-9)
    if need <= gpus_per_node:
        return max(need, num_gpus + 1) if peak_bytes > capacity_bytes else need
    return -(-need // gpus_per_node) * gpus_per_node
