"""The search driver: enumerate, bound, score, refine, rank.

1. Enumerate the valid candidates (autopar.search.space.valid_bases): every valid combination of
   degrees, micro batch and ZeRO stage, each with its valid recompute modes, default layer split.
2. Bound: candidates nest as layouts (tp, cp, ep, etp, sp) ⊃ families (+ pp, ZeRO) ⊃ groups (all
   but the micro batch) ⊃ plans; each level has a lower bound on the step time of everything
   below it (autopar.search.costs: the estimate's own per-layer times), a family whose model
   states alone overflow is dropped whole, and a level is expanded (its Drafts built) only when
   popped; estimates share one StepMemo (autopar.cost.step: bit-identical numbers). Plans are
   visited best-first in ascending bound order (ties by the plan's axes) until a bound exceeds
   the best time of the top-th distinct family (autopar.search.rank.family): no later candidate
   can enter the raw top K or change a family's best among them.
3. Score: a visited candidate whose first/last pipeline rank already overflows memory is pruned;
   the rest are scored by `estimate`, the one model (a plan that can change neither the raw top K
   nor its family's best is deferred to step 5).
4. Refine: for the best visited candidates, the partition DP (partition.py; vpp = 1, pp · decoder
   layers² at most autopar.limits.MAX_PARTITION_STEPS, else the even split stays) moves layers
   between stages and the recompute program (ilp.py) picks per-stage recompute, mapped onto
   full(K); the refined plans are scored by `estimate` too, so a refinement is kept only when
   the estimate says it is faster and fits.
5. Rank: inside the equivalence band of the fastest, each family's simplest plan is priced
   (`_price_equivalents`), and autopar.search.rank lists the distinct alternatives.

Steps 2–3 are exact over the enumerated space: the best plan equals the minimum of `estimate`
over every candidate, and the distinct alternatives equal those of every candidate priced (tests
check both against brute force). Refinement can only improve on it.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from autopar.cost.params import CostParams
from autopar.cost.step import DEFAULT_MEMORY_MARGIN, Estimate, usable_memory_bytes
from autopar.errors import NoFeasiblePlanError
from autopar.hardware import Cluster
from autopar.inputs import load_cluster, load_model, resolve_cost_model
from autopar.limits import MAX_PARTITION_STEPS
from autopar.model.graph import ModelGraph
from autopar.frameworks import framework_spec
from autopar.schema.plan import Framework, ParallelPlan, Precision, Recompute, RecomputeMode
from autopar.search.costs import Pricer, stage_inputs, stage_memory_model
from autopar.search.ilp import recompute_problem, solve_recompute
from autopar.search.partition import partition_layers
from autopar.search.rank import Row, distinct_rows, equivalence_band, family, simplicity_key
from autopar.search.space import (DRAFT_MBS, Draft, SpaceSpec, as_plan, plan_problems, space_spec_for, valid_bases,
                                  with_recompute)
from autopar.units import GiB

Progress = Callable[[str, int, int], None]  # (phase, done, total); phases: score, refine
REFINE_POOL = 16  # candidates (at least `top`) handed to the DP and the ILP
_MODE_ORDER = {RecomputeMode.NONE: 0, RecomputeMode.SELECTIVE: 1, RecomputeMode.FULL: 2}
# Heap levels, each entry (bound, level, key, item). A provisional bound (from a table already
# built) is ≤ the exact one; popped, the entry comes back with its exact bound one level down.
LAYOUT, FAMILY, GROUP, PLAN_PROVISIONAL, PLAN = range(5)


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
    alternatives: list[Row] = field(default_factory=list)  # autopar.search.rank: distinct rows for reading
    band: float = 0.0  # relative step-time band of "equivalent within the model's error"

    @property
    def best(self) -> tuple[ParallelPlan, Estimate]:
        return self.plans[0]

    @property
    def chosen(self) -> tuple[ParallelPlan, Estimate]:
        """The plan to run: the first alternative (the simplest of those equivalent to the fastest)."""
        if self.alternatives:
            return self.alternatives[0].plan, self.alternatives[0].estimate
        return self.plans[0]

    def equivalent_to_best(self, est: Estimate) -> bool:
        return est.step_time_s <= self.plans[0][1].step_time_s * (1.0 + self.band)


def plan_key(plan: ParallelPlan) -> tuple:
    """Total order on plans used to break ties (same input → same plans, every run)."""
    r = plan.recompute
    return (plan.tp, plan.pp, plan.cp, plan.ep, plan.expert_tp, plan.vpp, plan.mbs, plan.zero,
            plan.sequence_parallel, _MODE_ORDER[r.mode], -1 if r.num_layers is None else r.num_layers,
            r.modules, plan.layers_per_stage or ())


@dataclass
class _Walk:
    """Mutable state of one branch-and-bound walk. `best` holds every fitting plan priced, fastest
    first; the walk may stop once a bound passes `kth_s`, the best time of the top-th distinct
    family (autopar.search.rank.family): every row of the listing outside the equivalence band,
    and the raw top K, are then known (the band is priced afterwards, `_price_equivalents`)."""

    top: int
    capacity_bytes: float
    band: float = 0.0
    best: list[tuple[float, tuple, ParallelPlan, Estimate]] = field(default_factory=list)
    family_to_s: dict[tuple, float] = field(default_factory=dict)
    family_to_members: dict[tuple, list[tuple[tuple, float]]] = field(default_factory=dict)  # (simplicity, s)
    visited: list[tuple[float, tuple, object]] = field(default_factory=list)  # (bound, key, Draft or plan)
    shortfalls: list[tuple[float, object, bool]] = field(default_factory=list)  # (bytes over, Draft or plan, exact)
    dropped: list[tuple[float, dict]] = field(default_factory=list)  # (bytes over, prefixes) of families dropped whole
    seen: set = field(default_factory=set)
    scored: int = 0
    feasible: int = 0
    refined: int = 0
    pruned_time: int = 0
    pruned_memory: int = 0
    pruned_memory_early: int = 0  # of pruned_memory: whole families dropped before any time bound
    kth_s: float = math.inf
    pushes: int = 0  # provisional entries pushed (their heap key)
    deferred: list[tuple] = field(default_factory=list)  # heap entries left for the band (can_defer)

    def add(self, plan: ParallelPlan, est: Estimate) -> None:
        key = plan_key(plan)
        if key in self.seen:
            return
        self.seen.add(key)
        bisect.insort(self.best, (est.step_time_s, key, plan, est), key=lambda x: (x[0], x[1]))
        fam = family(plan)
        self.family_to_s[fam] = min(self.family_to_s.get(fam, math.inf), est.step_time_s)
        self.family_to_members.setdefault(fam, []).append((simplicity_key(plan), est.step_time_s))
        times = sorted(self.family_to_s.values())
        self.kth_s = times[self.top - 1] if len(times) >= self.top else math.inf

    def all_shortfalls(self) -> list[tuple[float, object, bool]]:
        """`shortfalls` and every member of the families dropped whole (listed only when asked:
        the walk needs them only when nothing fits)."""
        return self.shortfalls + [(over, with_recompute(d, r), False) for over, prefixes in self.dropped
                                  for bases in prefixes.values() for d, recomputes in bases for r in recomputes]

    def can_defer(self, plan, bound: float) -> bool:
        """Pricing `plan` (time ≥ bound) now can change neither the raw top K (bound past its
        top-th time) nor its family's best time; only the equivalence band may still want it."""
        if len(self.best) < self.top or bound <= self.best[self.top - 1][0]:
            return False
        return bound >= self.family_to_s.get(family(plan), math.inf)


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
    with _cyclic_gc_paused():
        return _search_graph(graph, cluster, p, spec, top, memory_margin, progress, refine)


@contextmanager
def _cyclic_gc_paused():
    """The search holds ~10^5 small candidate tuples until it returns and makes no reference
    cycles: Python's cyclic collector would re-scan them again and again (a fifth of the search's
    time on the MoE cases) and free nothing, so it is paused for the search (reference counting
    still frees everything as usual)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _search_graph(graph: ModelGraph, cluster: Cluster, p: CostParams, spec: SpaceSpec, top: int,
                  memory_margin: float, progress: Progress | None, refine: bool) -> SearchResult:
    start = time.perf_counter()
    bases = valid_bases(spec)
    pricer = Pricer(graph, cluster, p)
    band = equivalence_band()
    walk = _Walk(top=top, capacity_bytes=usable_memory_bytes(cluster.hbm_bytes, memory_margin), band=band)
    count, heap = _branch_and_bound(bases, pricer, walk, memory_margin, progress)
    if refine:
        _refine(spec, pricer, walk, memory_margin, progress)
    _price_equivalents(heap, pricer, walk, memory_margin)
    walk.pruned_time = count - walk.pruned_memory_early - len(walk.visited)
    if not walk.best:
        raise NoFeasiblePlanError(_nothing_fits_message(spec, pricer, walk, memory_margin))
    found = [(plan, est) for _, _, plan, est in walk.best]
    return SearchResult(
        plans=found[:top], alternatives=distinct_rows(found, top, band), band=band, candidates=count,
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
    return [(x, est) for _, _, x, est in walk.best][:8]


def _branch_and_bound(bases: list, pricer: Pricer, walk: _Walk, memory_margin: float,
                      progress: Progress | None) -> tuple[int, list]:
    """Best-first over candidates by ascending time bound; stop when the bound passes the K-th best.
    Returns the candidate count and the heap left (what the equivalence band may still need).

    Candidates are nested: a layout (tp, cp, ep, etp, sp) holds families (+ pp, ZeRO), which hold
    groups (their plans that differ only in micro batch), which hold plans. Layouts and families
    are bounded by one summed cost table each (Pricer.layout_bound_s, family_bound_s), and a family
    is dropped whole when its model states alone overflow memory; each level is expanded into the
    bounds of the next (down to Pricer.time_lower_bound_s per plan) only when popped, i.e. when it
    could still beat the K-th best. Each level's bound is ≤ those below it, so the plans visited,
    and their order, are those of bounding every plan up front."""
    heap: list[tuple[float, int, tuple, object]] = []
    layouts, total = _nest(bases, pricer)
    for lkey, families in layouts.items():
        largest = max((largest for _, largest in families.values()), key=lambda x: x[0].mbs)
        heap.append((pricer.layout_bound_s(_largest_mbs(largest)), LAYOUT, lkey, families))
    heapq.heapify(heap)
    while heap and heap[0][0] <= walk.kth_s:
        entry = heapq.heappop(heap)
        if entry[1] < PLAN:
            _expand(heap, entry, pricer, walk)
            continue
        bound, _, key, draft = entry
        if walk.can_defer(draft, bound):
            walk.deferred.append(entry)
            continue
        if progress and len(walk.visited) % 64 == 63:
            progress("score", len(walk.visited) + 1, total)
        _visit(draft, bound, key, pricer, walk, memory_margin)
    if progress:
        progress("score", total, total)  # every candidate is now scored or pruned
    return total, heap


def _expand(heap: list, entry: tuple, pricer: Pricer, walk: _Walk) -> None:
    """Push the children of a popped layout (0), family (1) or group (2) with their bounds, or a
    plan's exact bound in place of its provisional one (Pricer.member_bounds_s ≤ the exact
    time_lower_bound_s, so the plans still reach _visit in the order of their exact bounds)."""
    _, level, key, item = entry
    if level == LAYOUT:
        for fkey, family in item.items():
            _push_family(heap, fkey, family, pricer, walk)
    elif level == FAMILY:
        for gkey, members in _groups(item).items():
            if len(members) == 1:
                heapq.heappush(heap, (pricer.time_lower_bound_s(members[0]), PLAN, plan_key(members[0]), members[0]))
            else:
                heapq.heappush(heap, (pricer.group_bound_s(max(members, key=lambda x: x.mbs)), GROUP, gkey, members))
    elif level == GROUP:
        largest = max(item, key=lambda x: x.mbs)
        heapq.heappush(heap, (pricer.time_lower_bound_s(largest), PLAN, plan_key(largest), largest))
        others = [plan for plan in item if plan is not largest]
        for plan, bound in zip(others, pricer.member_bounds_s(others, largest)):
            # a provisional entry's key only orders provisional entries (a number, in push order); the
            # plan's exact entry carries its plan_key, computed for the fraction ever popped
            walk.pushes += 1
            heapq.heappush(heap, (bound, PLAN_PROVISIONAL, walk.pushes, plan))
    else:
        heapq.heappush(heap, (pricer.time_lower_bound_s(item), PLAN, plan_key(item), item))


def _price_equivalents(heap: list, pricer: Pricer, walk: _Walk, memory_margin: float) -> None:
    """Price what the listing needs inside the equivalence band: each family's simplest plan within
    (1 + band) of the fastest (autopar.search.rank.distinct_rows). Candidates deferred by the walk
    or left on the heap with a bound inside the band are taken family by family in SIMPLICITY order; a family stops at its
    first plan that fits inside the band (after its equally simple ones, which may be faster), or
    at a plan less simple than one it already has inside the band. The fastest is final here: the
    heap's bounds are past the K-th family's time, so nothing left can beat it.
    Families go in order of the simplest row they can still reach; once `top` rows are known
    (autopar.search.rank.distinct_rows lists `top`, in simplicity order, then time) a family that
    can reach no row as simple as the top-th is not priced, nor is any after it: the listing is
    that of pricing them all (tests/test_rank.py checks it against brute force)."""
    if not walk.best:
        return
    edge = walk.best[0][0] * (1.0 + walk.band)
    fam_to_pending: dict[tuple, list] = {}
    for bound, _, key, draft in walk.deferred:
        if bound <= edge:
            fam_to_pending.setdefault(family(draft), []).append((simplicity_key(draft), bound, key, draft))
    while heap and heap[0][0] <= edge:
        entry = heapq.heappop(heap)
        if entry[1] < PLAN:
            _expand(heap, entry, pricer, walk)
        else:
            bound, _, key, draft = entry
            fam_to_pending.setdefault(family(draft), []).append((simplicity_key(draft), bound, key, draft))
    def row(fam: tuple) -> tuple | None:  # the family's listing row so far: its least (simplicity, time) in the band
        inside = [(k, s) for k, s in walk.family_to_members.get(fam, ()) if s <= edge]
        return min(inside) if inside else None

    def reach(fam: tuple) -> tuple:  # the least simplicity its row can still take
        now = row(fam)
        pending = min(x[0] for x in fam_to_pending[fam])
        return min(pending, now[0]) if now else pending

    rows = sorted(r for fam in walk.family_to_members if fam not in fam_to_pending and (r := row(fam)) is not None)
    fam_to_reach = {fam: reach(fam) for fam in fam_to_pending}  # pricing one family changes no other's
    for fam in sorted(fam_to_pending, key=lambda f: (fam_to_reach[f], f)):
        if _after_listed_rows(fam_to_reach[fam], rows, walk.top):
            break  # this family's row, and every later one's, would come after the top rows listed
        now = row(fam)
        limit = now[0] if now else None  # simplest member already inside the band
        for simple, bound, key, draft in sorted(fam_to_pending[fam], key=lambda x: (x[0], x[1], x[2])):
            if limit is not None and simple > limit:
                break
            est = _visit(draft, bound, key, pricer, walk, memory_margin)
            if est is not None and est.fits and est.step_time_s <= edge:
                limit = simple if limit is None else min(limit, simple)
        if (r := row(fam)) is not None:
            bisect.insort(rows, r)


def _after_listed_rows(reach: tuple, rows: list[tuple], top: int) -> bool:
    """Whether a family whose listing row can be no simpler than `reach` (a simplicity key) comes
    after the `top` rows listed, given the known rows (sorted (simplicity key, time)): only when it
    is strictly less simple than the top-th; an equally simple row is ordered by its time, which is
    not known before it is priced (autopar.search.rank.distinct_rows)."""
    return len(rows) >= top and reach > rows[top - 1][0]


def _push_family(heap: list, fkey: tuple, family: tuple[dict, list], pricer: Pricer, walk: _Walk) -> None:
    """A family's bound onto the heap, or the whole family dropped when its states overflow.
    `family`: its prefixes and its first base with the largest micro batch (see _nest)."""
    prefixes, largest = family
    low = pricer.states_lower_bound_bytes(_largest_mbs(largest))  # ≤ every member's (fewest microbatches)
    if low > walk.capacity_bytes:  # no micro batch, vpp, recompute or split makes it fit
        count = sum(len(recomputes) for bases in prefixes.values() for _, recomputes in bases)
        walk.pruned_memory += count
        walk.pruned_memory_early += count
        walk.dropped.append((low - walk.capacity_bytes, prefixes))
        return
    plan = _largest_mbs(largest)
    heapq.heappush(heap, (pricer.family_bound_s(plan, [prefix[-1] for prefix in prefixes]), FAMILY, fkey, prefixes))


def _largest_mbs(largest: list) -> object:
    """The candidate of a [base, recompute choices] pair (its first choice)."""
    return with_recompute(largest[0], largest[1][0])


def _nest(bases: list, pricer: Pricer) -> tuple[dict[tuple, dict[tuple, tuple[dict, list]]], int]:
    """Valid bases (space.valid_bases: all axes but recompute, with their recompute choices) by
    layout (tp, cp, ep, etp, sp), family (+ pp, ZeRO; with its first base of the largest micro
    batch, whose bounds are the family's) and prefix (+ vpp), and the candidate count.
    A family's groups (every axis but the micro batch) and their Drafts are built only when the
    family is expanded (`_groups`). With a profiled GEMM table (whose efficiency need not grow with
    m) the micro batch joins every key, so that every bound stays a true lower bound."""
    out: dict[tuple, dict[tuple, tuple[dict, list]]] = {}
    per_mbs = bool(pricer.p.gemm_table)
    total = 0
    key_to_family: dict[tuple, tuple[dict, list]] = {}  # every layout's families in one dict
    for entry in bases:  # hot loop: fields unpacked, keys built once
        d, recomputes = entry
        tp, pp, cp, ep, etp, vpp, mbs, zero, sp = d[:9]
        if etp is None:
            etp = tp
        if sp is None:
            sp = tp > 1
        fkey = (tp, cp, ep, etp, sp, mbs, pp, zero) if per_mbs else (tp, cp, ep, etp, sp, pp, zero)
        family = key_to_family.get(fkey)
        if family is None:
            lkey = fkey[:-2]
            families = out.get(lkey)
            if families is None:
                families = out[lkey] = {}
            family = families[fkey] = key_to_family[fkey] = ({}, [d, recomputes])  # (prefixes, largest-mbs base)
        elif mbs > family[1][0][DRAFT_MBS]:
            family[1][:] = entry
        prefixes = family[0]
        prefix = fkey + (vpp,)
        members = prefixes.get(prefix)
        if members is None:
            prefixes[prefix] = [entry]
        else:
            members.append(entry)
        total += len(recomputes)
    return out, total


def _groups(prefixes: dict) -> dict[tuple, list]:
    """A family's groups: its candidates that differ only in the micro batch, keyed by every other
    axis (prefix + recompute order)."""
    rec_order: dict[int, tuple] = {}
    groups: dict[tuple, list] = {}
    for prefix, bases in prefixes.items():
        for d, recomputes in bases:
            for r in recomputes:
                order = rec_order.get(id(r))
                if order is None:
                    order = rec_order[id(r)] = (_MODE_ORDER[r.mode], -1 if r.num_layers is None else r.num_layers,
                                                r.modules)
                groups.setdefault(prefix + order, []).append(with_recompute(d, r))
    return groups


def _visit(draft, bound: float, key: tuple, pricer: Pricer, walk: _Walk, memory_margin: float) -> Estimate | None:
    """Memory bounds (on the draft: most visits end here), then `estimate` of the validated plan;
    the estimate when the plan was priced."""
    walk.visited.append((bound, key, draft))
    low = pricer.quick_memory_lower_bound_bytes(draft)
    if low <= walk.capacity_bytes:  # (the table bound nearly always equals the exact rank memory: no graph walk)
        low = pricer.rank_memory_lower_bound_bytes(draft)
    if low > walk.capacity_bytes:
        walk.pruned_memory += 1
        walk.shortfalls.append((low - walk.capacity_bytes, draft, False))
        return None
    plan = as_plan(draft)
    est = pricer.estimate(plan, memory_margin)
    walk.scored += 1
    if est.fits:
        walk.feasible += 1
        walk.add(plan, est)
    else:
        walk.shortfalls.append((est.peak_memory_bytes - walk.capacity_bytes, plan, True))
    return est


def _refine(spec: SpaceSpec, pricer: Pricer, walk: _Walk, memory_margin: float, progress: Progress | None) -> None:
    """DP partition (vpp = 1, pp > 1) and ILP recompute on the best visited candidates (by bound)
    that could fit with full recompute and whose no-recompute bound can still beat the K-th best."""
    if walk.best:
        pool = [x for _, _, x in walk.visited if x.recompute.mode != RecomputeMode.FULL]  # drafts or plans
    else:  # nothing fits yet: try the candidates closest to fitting
        pool = [x for _, x, _ in sorted(walk.all_shortfalls(), key=lambda t: (t[0], plan_key(t[1])))]
    limit, done = max(REFINE_POOL, walk.top), 0
    rejected: set[tuple] = set()  # _worth_refining reads everything but the recompute choice, and kth_s only falls
    for draft in pool:
        if done >= limit:
            break
        key = _without_recompute(draft)
        if key in rejected:
            continue
        plan = as_plan(draft)
        if not _worth_refining(plan, pricer, walk):
            rejected.add(key)
            continue
        done += 1
        if progress:
            progress("refine", done, limit)
        for variant in _variants(spec, pricer, plan, memory_margin):
            _score_refined(spec, pricer, walk, variant, memory_margin)


def _without_recompute(x: Draft | ParallelPlan) -> tuple:
    """A key of everything but the recompute choice (a Draft's recompute is field 9; a plan's,
    plan_key's entries 9-11)."""
    if isinstance(x, Draft):
        return ("draft", *x[:9], *x[10:])
    key = plan_key(x)
    return ("plan", *key[:9], *key[12:])


def _worth_refining(plan: ParallelPlan, pricer: Pricer, walk: _Walk) -> bool:
    """Its bound without recompute beats the K-th best, and its first and last ranks fit with full
    recompute of every layer (the least memory any recompute choice reaches)."""
    none = plan.model_copy(update={"recompute": Recompute.trusted(RecomputeMode.NONE)})
    if pricer.time_lower_bound_s(none) > walk.kth_s:
        return False
    full = plan.model_copy(update={"recompute": Recompute.trusted(RecomputeMode.FULL)})
    return (pricer.quick_memory_lower_bound_bytes(full) <= walk.capacity_bytes
            and pricer.rank_memory_lower_bound_bytes(full) <= walk.capacity_bytes
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
    if plan.vpp == 1 and plan.pp > 1 and plan.pp * graph.spec.num_layers ** 2 <= MAX_PARTITION_STEPS:
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
        recompute = _uniform_if_whole(solution.to_recompute(), counts)
        out.append(plan.model_copy(update={"recompute": recompute, "layers_per_stage": lps}))
    return out


def _uniform_if_whole(r: Recompute, counts: tuple[int, ...]) -> Recompute:
    """full(K) with K at least every virtual stage's layer count recomputes every layer: the same
    run as plain full (Megatron's --recompute-num-layers covers the whole stage), so one plan."""
    if r.mode == RecomputeMode.FULL and r.num_layers is not None and r.num_layers >= max(counts):
        return Recompute.trusted(RecomputeMode.FULL, r.modules)
    return r


def _score_refined(spec: SpaceSpec, pricer: Pricer, walk: _Walk, plan: ParallelPlan, memory_margin: float) -> None:
    """Price a refined plan; a mapped full(K) that the estimate finds over memory gets K raised."""
    if plan_problems(spec, plan) or plan_key(plan) in walk.seen:
        return
    max_k = max(pricer.layout(plan).stage_counts)
    while True:
        est = pricer.estimate(plan, memory_margin)
        walk.refined += 1
        if est.fits:
            walk.add(plan, est)
            return
        r = plan.recompute
        if r.mode != RecomputeMode.FULL or r.num_layers is None or r.num_layers >= max_k:
            return
        more = _uniform_if_whole(r.model_copy(update={"num_layers": r.num_layers + 1}), pricer.layout(plan).stage_counts)
        plan = plan.model_copy(update={"recompute": more})
        if plan_key(plan) in walk.seen:
            return


def _nothing_fits_message(spec: SpaceSpec, pricer: Pricer, walk: _Walk, memory_margin: float) -> str:
    """The smallest shortfall (exact: bounds are re-priced by `estimate`) and what would fix it."""
    # Best-first over lower bounds: a bound is re-priced exactly only while it could still beat the
    # best exact shortfall found, so the plan named is the true closest among those visited.
    best: tuple[float, tuple, ParallelPlan] | None = None
    for short, plan, is_exact in sorted(walk.all_shortfalls(), key=lambda t: (t[0], plan_key(t[1]))):
        key = plan_key(plan)
        if best is not None and (short, key) >= best[:2]:
            break
        if not is_exact:
            short = pricer.peak_memory_bytes(as_plan(plan)) - walk.capacity_bytes
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
    higher = [z for z in framework_spec(spec.framework).zero_stages if z > plan.zero]
    fixes.append(f"ZeRO {higher[-1]}" if higher else "")
    if memory_margin > 0:
        fixes.append(f"a memory margin below {memory_margin:g}")
    return (f"no plan fits: with {cap_gib:.1f} GiB usable on each of {spec.num_gpus} GPUs ({memory_margin:.0%} "
            f"of HBM kept free), the closest plan ({plan.layout()}, mbs {plan.mbs}, recompute "
            f"{plan.recompute.label(plan.framework)}, zero {plan.zero}) is {short / GiB:.1f} GiB over; "
            + ", ".join(f for f in fixes if f))


def min_gpus_for_memory(num_gpus: int, peak_bytes: float, capacity_bytes: float, fixed_bytes: float,
                        gpus_per_node: int) -> int | None:
    """The fewest GPUs on which a plan whose peak on `num_gpus` GPUs is `peak_bytes` could fit, or
    None when even infinitely many cannot (the per-GPU fixed buffers exceed the capacity).

    Peak = states + cycled·(1 + fragmentation) + fixed buffers (cost.memory.peak_reserved_bytes); model states
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
