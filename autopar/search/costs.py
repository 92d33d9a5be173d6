"""The search's view of the cost model: per-layer tables and cheap bounds, built from the very
functions `autopar.cost.step.estimate` uses, so search and evaluation cannot disagree.

Nothing here is a second cost model. Per-layer time comes from `layer_cost`; per-layer saved
activations, recompute working bytes and parameters come from the estimate's private
`stage_activation_bytes` / `stage_params` applied to a one-layer stage; rank memory is the
estimate's own `rank_memory` (private names imported on purpose: the search must price a plan
exactly as `estimate` does).

  time_lower_bound_s: the estimate's pipeline closed form (`pipeline_step_s`, Narayanan et al.
    SC'21 §2.2 generalized to unequal ranks) over the exact per-rank forward + backward + recompute
    sums of the plan's layer split, plus the p2p term; the DP sync and the optimizer step (both ≥ 0)
    are left out, so it is a lower bound. Full recompute of the first K layers is charged the
    cheapest decoder's recompute time.
  memory_lower_bound_bytes: the exact peak of the first and the last pipeline rank (the estimate's
    own `rank_memory`); the plan's peak is the maximum over all ranks, so this is a lower bound.
  rank_memory_lower_bound_bytes: the same two ranks from the tables (states, in-flight saved
    activations, recompute working bytes; no graph walk), ≤ memory_lower_bound_bytes (tested).
  layout_bound_s ≤ family_bound_s ≤ group_bound_s ≤ time_lower_bound_s: one table's time sum
    bounds every plan of a layout (tp, cp, ep, etp, sp); a family (+ pp, ZeRO) and a micro-batch
    group are bounded by the slowest rank's time per sequence at their largest micro batch; a
    plan below a group starts with a provisional bound from the group's table (member_bounds_s).
    From the family down, ZeRO 2's per-microbatch gradient reduce-scatters add their floor
    (dp_floor_s, step.dp_sync_lower_bound_s): without it such plans look 5-10x cheaper than priced.
  states_lower_bound_bytes: the mean rank's model states, a bound for a whole family.

Candidates may be search.space.Drafts (NamedTuples with ParallelPlan's own properties); a
validated ParallelPlan is built (`as_plan`) only where the estimate's functions need one.

Tables are tuples of floats, one entry per layer (30 to 130 of them), summed in the fixed orders of
autopar.search.summation (NumPy's, so the bounds did not move by a bit when NumPy left): at these
sizes plain Python costs about what NumPy's per-call overhead did, and the plan command no longer
imports NumPy (a tenth of a second of its start-up, issue 15).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from itertools import compress
from operator import add, itemgetter, sub

from autopar import caching
from autopar.caching import cached_property
from autopar.cost import memory
from autopar.cost.layer import layer_cost
from autopar.frameworks import framework_profile
from autopar.cost.layout import Layout
from autopar.cost.params import CostParams, for_framework
from autopar.cost.pipeline import pipeline_step_s
from autopar.cost.step import (
    Estimate,
    StepMemo,
    assign_layers,
    dp_sync_floor_per_microbatch_s,
    with_dp_floor_s,
    estimate,
    peak_memory_bytes,
    pipeline_send_s,
    rank_chunks,
    rank_memory,
    setup,
    stage_activation_bytes,
    stage_params,
    usable_memory_bytes,
)
from autopar.hardware import Cluster
from autopar.model.graph import ModelGraph
from autopar.schema.plan import ParallelPlan, Recompute, RecomputeMode
from autopar.search.space import Draft, as_plan
from autopar.search.summation import pairwise_sum, prefix_sums

MODES = tuple(RecomputeMode)
NO_RECOMPUTE = Recompute.trusted(RecomputeMode.NONE)


def _with(plan, **fields):
    """`plan` with `fields` replaced: a search.space.Draft (NamedTuple) or a ParallelPlan."""
    return plan._replace(**fields) if hasattr(plan, "_replace") else plan.model_copy(update=fields)


@dataclass(frozen=True)
class MemoryColumns:
    """The memory half of a LayerTable (bytes and parameters on one GPU, per layer)."""

    params_dense: tuple[float, ...]  # parameters on one GPU outside the routed experts
    params_expert: tuple[float, ...]  # routed-expert parameters on one GPU
    saved_bytes: dict[str, tuple[float, ...]]  # mode -> bytes kept for backward, one microbatch
    work_bytes: dict[str, tuple[float, ...]]  # mode -> transient bytes while recomputing the layer


@dataclass(frozen=True)
class LayerTable:
    """Per-layer costs of one split (tp, sp, cp, ep, etp, mbs, precision), in graph order
    (embedding, decoders, MTP, head). Seconds per microbatch on one GPU; bytes on one GPU. The
    memory columns are built on first use: most tables only ever bound time."""

    is_decoder: tuple[bool, ...]
    fb_s: tuple[float, ...]  # forward + backward, no recompute
    recompute_s: dict[str, tuple[float, ...]]  # mode -> extra backward seconds (0 off the decoders)
    p2p_s: tuple[float, float]  # send of one microbatch's stage boundary (inside a node, across)
    memory_columns: Callable[[], MemoryColumns] = field(repr=False, compare=False)

    @cached_property
    def memory(self) -> MemoryColumns:
        return self.memory_columns()

    @property
    def params_dense(self) -> tuple[float, ...]:
        return self.memory.params_dense

    @property
    def params_expert(self) -> tuple[float, ...]:
        return self.memory.params_expert

    @property
    def saved_bytes(self) -> dict[str, tuple[float, ...]]:
        return self.memory.saved_bytes

    @property
    def work_bytes(self) -> dict[str, tuple[float, ...]]:
        return self.memory.work_bytes

    @cached_property
    def num_decoders(self) -> int:
        return sum(self.is_decoder)

    @cached_property
    def first_decoder(self) -> int:
        """Index of the first decoder layer (the items before it are the embedding)."""
        return self.is_decoder.index(True)

    @cached_property
    def time_sums(self) -> dict[str, float]:
        """"fb": forward + backward of every layer; "full_per_layer": the cheapest decoder's full recompute."""
        return {"fb": pairwise_sum(self.fb_s), "full_per_layer": min(compress(self.recompute_s["full"], self.is_decoder))}

    @cached_property
    def param_totals(self) -> tuple[float, float]:
        """(dense, routed-expert) parameters on one GPU over every layer."""
        return pairwise_sum(self.params_dense), pairwise_sum(self.params_expert)

    @cached_property
    def saved_totals(self) -> dict[str, float]:
        """Recompute mode -> bytes every layer keeps for backward, one microbatch."""
        return {m: pairwise_sum(v) for m, v in self.saved_bytes.items()}


def split_key(plan: ParallelPlan) -> tuple:
    """What a layer's cost depends on; pp, vpp, zero and the recompute mode do not enter (the key of
    Pricer.table, checked under caching.CHECK_KEYS). The selective modules are its last entry."""
    if type(plan) is Draft:  # the same key from the tuple's fields (~2·10^4 per MoE search)
        tp, _, cp, ep, etp, _, mbs, _, sp, r, _, seq_len, precision, framework, cp_comm_type = plan
        return (tp, tp > 1 if sp is None else sp, cp, ep, tp if etp is None else etp, mbs, seq_len, precision,
                plan.tp_comm_overlap, framework, plan.framework_release, cp_comm_type, plan.attention_backend,
                plan.moe_dispatcher, plan.moe_grouped_gemm, plan.moe_load_imbalance, plan.moe_capacity_factor,
                plan.moe_pad_to_capacity, plan.moe_shared_expert_overlap, plan.torch_compile,
                plan.cross_entropy_fusion, r.modules if r.mode == RecomputeMode.SELECTIVE else ("core_attn",))
    modules = plan.recompute.modules if plan.recompute.mode == RecomputeMode.SELECTIVE else ("core_attn",)
    return (plan.tp, plan.sequence_parallel, plan.cp, plan.ep, plan.expert_tp, plan.mbs, plan.seq_len,
            plan.precision, plan.tp_comm_overlap, plan.framework, plan.framework_release, plan.cp_comm_type,
            plan.attention_backend, plan.moe_dispatcher, plan.moe_grouped_gemm, plan.moe_load_imbalance,
            plan.moe_capacity_factor, plan.moe_pad_to_capacity, plan.moe_shared_expert_overlap, plan.torch_compile,
            plan.cross_entropy_fusion, modules)


def _bound_key(plan: ParallelPlan, split: tuple) -> tuple:
    """What Pricer._time_lower_bound_s reads beyond the split: recompute, the pipeline and batch."""
    r = plan.recompute
    return (split, r.mode, r.num_layers, plan.pp, plan.vpp, plan.layers_per_stage, plan.global_batch)


def _ranks_key(plan: ParallelPlan, split: tuple) -> tuple:
    """What Pricer._rank_times reads beyond the split (the batch only through the Layout's split)."""
    r = plan.recompute
    return (split, r.mode, r.num_layers, plan.pp, plan.vpp, plan.layers_per_stage)


def _floor_key(plan: ParallelPlan) -> tuple:
    """What Pricer._dp_floor reads: the degrees, batch, ZeRO sharding and the gradients' bytes."""
    return (plan.tp, plan.cp, plan.pp, plan.ep, plan.expert_tp, plan.global_batch, plan.zero, plan.zero_shard_size,
            plan.framework, plan.framework_release, plan.grad_reduce_in_bf16)


def _states_key(plan: ParallelPlan, layout: Layout) -> tuple:
    """What state_bytes_per_param reads: the shards (degrees), ZeRO, the framework's state bytes and
    gradient policy, and the microbatch count (FSDP2 frees gradients at one)."""
    return (plan.tp, plan.cp, plan.pp, plan.ep, plan.expert_tp, plan.zero, plan.zero_shard_size, plan.framework,
            plan.framework_release, plan.grad_reduce_in_bf16, layout.num_microbatches)


def _params_key(plan: ParallelPlan) -> tuple:
    """What stage_params reads of the plan: the dense and expert TP and EP degrees."""
    return (plan.tp, plan.ep, plan.expert_tp)


def _columns_key(plan: ParallelPlan, modules: tuple[str, ...], tokens: float) -> tuple:
    """What stage_activation_bytes reads of the plan under each recompute mode (the modules given),
    and the tokens per microbatch: splits that differ only in ep share their memory columns."""
    return (plan.seq_len, plan.tp, plan.sequence_parallel, plan.expert_tp, plan.precision, plan.framework,
            plan.framework_release, plan.attention_backend, modules, tokens)


def _activation_columns(kinds: list, plan: ParallelPlan, modules: tuple[str, ...], tokens: float) -> dict:
    """(saved, work) bytes of each layer kind, one microbatch, under every recompute mode."""
    mode_plans = {m: _with(plan, recompute=Recompute.trusted(m, modules)) for m in MODES}
    return {m: [stage_activation_bytes([layer], mp, tokens) for layer in kinds] for m, mp in mode_plans.items()}


def _table_reads(table: "LayerTable") -> "LayerTable":
    """A table with its lazily built memory columns built (for CHECK_KEYS: their reads are the table's)."""
    table.memory_columns()
    return table


def layer_table(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, p: CostParams,
                memo: StepMemo | None = None, columns_memo: dict | None = None) -> LayerTable:
    """The table of `plan`'s split (a ParallelPlan, or a search Draft: it reads as its plan), from
    the estimate's per-layer functions (one row per layer kind, spread over the graph's layers).
    `memo`: the StepMemo of (graph, cluster, p) whose layer costs the estimates of this split then
    reuse. `columns_memo`: a dict kept for `graph`, holding each kind's memory entries by every plan
    field they read (splits that differ only in ep share them: no activation depends on it)."""
    base_p = p
    p = for_framework(p, plan.framework)
    policy = framework_profile(plan.framework, plan.framework_release).selective_policy
    st = setup(graph, cluster, plan, p)
    modules = split_key(plan)[-1]
    kinds, index = graph.cost_kinds  # one representative layer per kind; each layer's kind
    dec = [layer.kind in ("dense", "moe") for layer in kinds]

    at_layers = itemgetter(*index) if len(index) > 1 else (lambda per_kind: (per_kind[index[0]],))

    def spread(per_kind: list) -> tuple:  # one value per kind -> one per layer
        return at_layers(per_kind)

    if memo is not None and memo.bound_to(graph, cluster, base_p):
        _, key_to_cost = memo.costs(memo.stages(st.layout), st, plan, p)
        costs = [key_to_cost[layer.cost_key] for layer in kinds]
    else:
        costs = [layer_cost(layer, st.split, st.spans, cluster, p, plan.tp_comm_overlap) for layer in kinds]

    def memory_columns() -> MemoryColumns:
        key = _columns_key(plan, modules, st.split.tokens)
        hit = columns_memo.get(key) if columns_memo is not None else None
        if hit is None:
            hit = _activation_columns(kinds, plan, modules, st.split.tokens)
            if columns_memo is not None:
                columns_memo[key] = hit
                if caching.CHECK_KEYS:
                    caching.check_key("layer_table columns", lambda q: _columns_key(q, modules, st.split.tokens),
                                      lambda q: _activation_columns(kinds, q, modules, st.split.tokens), plan)
        acts = hit
        params = [stage_params([layer], plan, False, graph.layers[0])[:2] for layer in kinds]
        return MemoryColumns(params_dense=spread([float(d) for d, _ in params]),
                             params_expert=spread([float(e) for _, e in params]),
                             saved_bytes={m: spread([float(s) for s, _ in a]) for m, a in acts.items()},
                             work_bytes={m: spread([float(w) for _, w in a]) for m, a in acts.items()})

    return LayerTable(
        is_decoder=spread(dec), fb_s=spread([float(c.fwd_s + c.bwd_s) for c in costs]),
        recompute_s={m: spread([float(c.recompute_s(m, modules, policy)) if d else 0.0 for c, d in zip(costs, dec)])
                     for m in MODES},
        p2p_s=(pipeline_send_s(graph.spec.hidden_size, st, plan, cluster, p, False),
               pipeline_send_s(graph.spec.hidden_size, st, plan, cluster, p, True)),
        memory_columns=memory_columns)


class Pricer:
    """Tables and bounds for one (model, cluster, cost model); candidates that share a split share
    a table, and Layouts are shared per degrees, batch and ZeRO stage."""

    def __init__(self, graph: ModelGraph, cluster: Cluster, p: CostParams) -> None:
        self.graph, self.cluster, self.p = graph, cluster, p
        self._key_to_table: dict[tuple, LayerTable] = {}
        self._key_to_states: dict[tuple, tuple[float, float]] = {}
        self._key_to_extremes: dict[tuple, list[float]] = {}
        self._key_to_params: dict[tuple, tuple[float, float]] = {}
        self._key_to_bound: dict[tuple, float] = {}
        self._key_to_prefixes: dict[tuple, object] = {}  # keyed by id(table): tables live as long as the Pricer
        self._key_to_cuts: dict[tuple, tuple[tuple[int, ...], itemgetter]] = {}
        self._key_to_columns: dict[tuple, tuple] = {}
        self._key_to_columns_memo: dict[tuple, dict] = {}  # layer_table's memory entries, shared across ep
        self._key_to_floor: dict[tuple, float] = {}
        self.memo = StepMemo(graph, cluster, p)  # the estimates of this search share it

    def layout(self, plan: ParallelPlan) -> Layout:
        """The plan's Layout on this cluster (the one source of dp, shards, spans and the split),
        cached by what a Layout depends on (StepMemo.layout: cost.layout.layout_key)."""
        return self.memo.layout(plan)

    def estimate(self, plan: ParallelPlan, memory_margin: float) -> Estimate:
        """`autopar.cost.step.estimate` of `plan`, sharing this search's StepMemo."""
        return estimate(self.graph, self.cluster, plan, self.p, memory_margin, self.memo)

    def peak_memory_bytes(self, plan: ParallelPlan) -> float:
        """`autopar.cost.step.peak_memory_bytes` of `plan` (the estimate's peak, without its times)."""
        return peak_memory_bytes(self.graph, self.cluster, plan, self.p, self.memo)

    def table(self, plan: ParallelPlan, key: tuple | None = None) -> LayerTable:
        """The LayerTable of the plan's split (`key`: its split_key, when the caller has it)."""
        if caching.RECORDING:
            return layer_table(self.graph, self.cluster, plan, self.p)
        key = key or split_key(plan)
        hit = self._key_to_table.get(key)
        if hit is None:
            hit = self._key_to_table[key] = layer_table(self.graph, self.cluster, plan, self.p, self.memo,
                                                        self._key_to_columns_memo)  # a Draft reads as its plan
            if caching.CHECK_KEYS:
                caching.check_key("Pricer.table", split_key, lambda q: _table_reads(
                    layer_table(self.graph, self.cluster, q, self.p)), plan)
        return hit

    def time_lower_bound_s(self, plan: ParallelPlan) -> float:
        """≤ estimate(plan).step_time_s: the estimate's own pipeline closed form over the exact
        per-rank forward + backward (+ recompute) sums, plus p2p; DP sync and optimizer left out.
        The same for every ZeRO stage (it prices no DP or optimizer term), so cached without it."""
        if caching.RECORDING:
            return self._time_lower_bound_s(plan, split_key(plan))
        split = split_key(plan)
        key = _bound_key(plan, split)
        hit = self._key_to_bound.get(key)
        if hit is None:
            hit = self._key_to_bound[key] = self._time_lower_bound_s(plan, split)
            if caching.CHECK_KEYS:
                caching.check_key("Pricer.time_lower_bound_s", lambda q: _bound_key(q, split_key(q)),
                                  lambda q: self._time_lower_bound_s(q, split_key(q)), plan)
        return with_dp_floor_s(hit, self.dp_floor_s(plan)) if plan.zero == 2 else hit

    def _time_lower_bound_s(self, plan: ParallelPlan, split: tuple) -> float:
        ranks = self._rank_times(plan, split)
        layout = self.layout(plan)
        p2p_s = self.table(plan, split).p2p_s[layout.pp_crosses_nodes] if plan.pp > 1 else 0.0
        pipe, p2p = pipeline_step_s(ranks, [0.0] * len(ranks), layout.num_microbatches, plan.vpp, p2p_s)
        return pipe + p2p

    def group_bound_s(self, plan: ParallelPlan) -> float:
        """≤ time_lower_bound_s of every plan that differs from `plan` only by a smaller micro batch:
        the pipeline's steady state alone, m · max_r t_r(b) = (B/dp) · max_r t_r(b)/b, and a rank's
        time per sequence t_r(b)/b never rises with b here (GEMM, message-size and attention
        efficiencies saturate upward; fixed overheads and the launch floor amortize), so the
        largest micro batch gives the bound for the group."""
        per_seq = max(self._rank_times(plan)) / plan.mbs
        bound = per_seq * plan.global_batch / self.layout(plan).dp
        return with_dp_floor_s(bound, self.dp_floor_s(plan)) if plan.zero == 2 else bound

    def member_bounds_s(self, members: list, largest: ParallelPlan) -> list[float]:
        """≤ time_lower_bound_s of each plan in `members`, plans that differ from `largest` only by a
        smaller micro batch, from `largest`'s table alone: its ranks' times scaled by
        mbs / largest.mbs (time per sequence never rises with the micro batch, as in
        group_bound_s) in the same closed form with each plan's microbatch count and no p2p, plus
        its DP floor. The walk builds a plan's own table (time_lower_bound_s) only when this
        provisional bound is reached."""
        ranks = self._rank_times(largest)
        dp = self.layout(largest).dp
        slowest = max(ranks)
        rest = sum(ranks) - slowest
        zero2 = largest.zero == 2  # members share the ZeRO stage
        out = []
        for plan in members:
            m = plan.global_batch // (dp * plan.mbs)  # = the plan's Layout.num_microbatches
            # pipeline_step_s of the scaled ranks, m · max + (Σ − max) / vpp, scaled after the sums
            pipe = (m * slowest + rest / plan.vpp) * (plan.mbs / largest.mbs)
            if zero2:  # (the floor is 0 otherwise, and with_dp_floor_s(pipe, 0) is pipe)
                pipe = with_dp_floor_s(pipe, self.dp_floor_s(plan))
            out.append(pipe * (1.0 - 1e-12))  # rounding: below the exact
        return out

    def family_bound_s(self, plan: ParallelPlan, vpps) -> float:
        """≤ group_bound_s of every plan sharing `plan`'s tp, pp, cp, ep, etp, ZeRO and sp with a vpp
        in `vpps` and a micro batch ≤ plan.mbs, whatever its recompute or layer split: the least
        over the vpps of group_bound_s without recompute (recompute only adds time, and the largest
        micro batch has the least time per sequence). All from the table of plan's micro batch."""
        return min(self.group_bound_s(_with(plan, vpp=v, recompute=NO_RECOMPUTE)) for v in vpps)

    def dp_floor_s(self, plan: ParallelPlan) -> float:
        """F of step.dp_sync_lower_bound_s (bounds combine with it by step.with_dp_floor_s) for every
        plan sharing `plan`'s degrees and ZeRO stage with a micro batch ≤ plan.mbs: the mean pipeline
        rank's (the graph's parameters on one GPU over pp), whatever the vpp, recompute or layer
        split; more microbatches (a smaller micro batch) only add to it. Non-zero for ZeRO 2 only."""
        if plan.zero != 2:
            return 0.0
        if caching.RECORDING:
            dp, x = self._dp_floor(plan)
            return plan.global_batch // (dp * plan.mbs) * x * (1.0 - 1e-9)
        key = _floor_key(plan)
        hit = self._key_to_floor.get(key)  # (dp, one microbatch's floor): no Layout per micro batch
        if hit is None:
            hit = self._key_to_floor[key] = self._dp_floor(plan)
            if caching.CHECK_KEYS:
                caching.check_key("Pricer.dp_floor_s", _floor_key,
                                  self._dp_floor, plan)
        dp, x = hit
        m = plan.global_batch // (dp * plan.mbs)  # the plan's Layout.num_microbatches
        return m * x * (1.0 - 1e-9)  # as step.dp_sync_lower_bound_s; rounding: stays below the estimate's sum

    def _dp_floor(self, plan: ParallelPlan) -> tuple[int, float]:
        """(dp, one microbatch's DP floor) of dp_floor_s."""
        dense, expert = self.param_sums(plan)
        layout = self.layout(plan)
        return layout.dp, dp_sync_floor_per_microbatch_s(dense / plan.pp, expert / plan.pp, layout, self.cluster,
                                                         self.p, plan)

    def layout_bound_s(self, plan: ParallelPlan) -> float:
        """≤ family_bound_s of every plan sharing `plan`'s tp, cp, ep, etp and sp with a micro batch
        ≤ plan.mbs, whatever its pp, ZeRO, vpp or recompute: dp · pp = gpus / (tp · cp), so the
        family bound (B/dp) · Σ t(b) / (pp · b) = B · tp · cp / gpus · Σ t(b) / b."""
        total = self.table(plan).time_sums["fb"]
        return total / plan.mbs * plan.global_batch * plan.tp * plan.cp / self.layout(plan).num_gpus

    def _rank_times(self, plan: ParallelPlan, split: tuple | None = None) -> list[float]:
        """Forward + backward + recompute per microbatch of each pipeline rank (_rank_times_of),
        kept per _ranks_key."""
        split = split or split_key(plan)
        if caching.RECORDING:
            return self._rank_times_of(plan, split)
        key = _ranks_key(plan, split)
        hit = self._key_to_extremes.get(key)
        if hit is None:
            hit = self._key_to_extremes[key] = self._rank_times_of(plan, split)
            if caching.CHECK_KEYS:
                caching.check_key("Pricer._rank_times", lambda q: _ranks_key(q, split_key(q)),
                                  lambda q: self._rank_times_of(q, split_key(q)), plan)
        return hit

    def _rank_times_of(self, plan: ParallelPlan, split: tuple) -> list[float]:
        """A full(K) plan is charged the cheapest decoder's recompute for min(K, layers) layers of
        each stage."""
        r = plan.recompute
        t = self.table(plan, split)
        uniform = r.mode != RecomputeMode.FULL or r.num_layers is None
        prefix = self._time_prefix(t, r.mode if uniform else None)
        counts = self.layout(plan).stage_counts
        stage = stage_totals(self._stage_cuts(t, counts)[1](prefix))
        if not uniform:
            per_layer_s = t.time_sums["full_per_layer"]
            stage = [s + per_layer_s * min(c, r.num_layers) for s, c in zip(stage, counts)]
        return rank_sums(stage, plan.pp)

    def _time_prefix(self, t: LayerTable, mode: str | None) -> list[float]:
        """[0, cumulative forward + backward (+ `mode`'s recompute; None: none)] over the table's layers."""
        key = (id(t), mode)
        hit = self._key_to_prefixes.get(key)
        if hit is None:
            per_layer_s = t.fb_s if mode is None else map(add, t.fb_s, t.recompute_s[mode])
            hit = self._key_to_prefixes[key] = prefix_sums(per_layer_s)
        return hit

    def _stage_cuts(self, t: LayerTable, counts: tuple[int, ...]) -> tuple[tuple[int, ...], itemgetter]:
        """The table's layer indices where the virtual stages of a split start, then its number of
        layers (stage v = [cuts[v], cuts[v + 1]), in execution order), and their itemgetter."""
        key = (len(t.fb_s), counts)
        hit = self._key_to_cuts.get(key)
        if hit is None:
            bounds = stage_bounds(len(t.fb_s), counts, t.first_decoder)
            cuts = (*(lo for lo, _ in bounds), bounds[-1][1])
            hit = self._key_to_cuts[key] = (cuts, itemgetter(*cuts))
        return hit

    def quick_memory_lower_bound_bytes(self, plan: ParallelPlan) -> float:
        """O(1) bound: the mean rank's model states plus one microbatch of its saved activations,
        with the estimate's overheads (the peak rank holds at least the mean of each)."""
        t = self.table(plan)
        per_dense, per_expert = self._state_bytes_per_param(plan)
        dense, expert = t.param_totals
        states = (per_dense * dense + per_expert * expert) / plan.pp
        saved = t.saved_totals[plan.recompute.mode] / plan.pp  # full(K) saves at least full's bytes
        p = self.p
        return memory.peak_reserved_bytes(states, saved, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation)

    def _state_bytes_per_param(self, plan: ParallelPlan) -> tuple[float, float]:
        """Bytes of weights + grads + optimizer per local dense / expert parameter, sharded over the
        layout's dense and expert ZeRO groups. Keyed by the microbatch count too: FSDP2 keeps its
        gradients at the peak only when several microbatches accumulate (memory.resident_state_bytes)."""
        layout = self.layout(plan)
        if caching.RECORDING:
            return state_bytes_per_param(layout, plan)
        key = _states_key(plan, layout)
        hit = self._key_to_states.get(key)
        if hit is None:
            hit = self._key_to_states[key] = state_bytes_per_param(layout, plan)
            if caching.CHECK_KEYS:
                caching.check_key("Pricer._state_bytes_per_param", lambda q: _states_key(q, self.layout(q)),
                                  lambda q: state_bytes_per_param(self.layout(q), q), plan)
        return hit

    def param_sums(self, plan: ParallelPlan) -> tuple[float, float]:
        """(dense, routed-expert) parameters on one GPU summed over the whole graph, by the
        estimate's `stage_params`; they depend on tp, ep and etp only (= LayerTable.param_totals)."""
        if caching.RECORDING:
            return self._param_sums(plan)
        key = _params_key(plan)
        if key not in self._key_to_params:
            self._key_to_params[key] = self._param_sums(plan)
            if caching.CHECK_KEYS:
                caching.check_key("Pricer.param_sums", _params_key, self._param_sums, plan)
        return self._key_to_params[key]

    def _param_sums(self, plan: ParallelPlan) -> tuple[float, float]:
        layers = self.graph.layers
        parts = [stage_params([layer], plan, False, layers[0])[:2] for layer in layers]
        return pairwise_sum([float(d) for d, _ in parts]), pairwise_sum([float(e) for _, e in parts])

    def states_lower_bound_bytes(self, plan: ParallelPlan) -> float:
        """The mean rank's model states (weights, grads, optimizer after ZeRO) with the estimate's
        overheads, no activations: ≤ quick_memory_lower_bound_bytes, and the same for every vpp,
        recompute and layer split of the plan's degrees and ZeRO stage; with the family's largest
        micro batch (fewest microbatches: FSDP2's gradients may then be freed) ≤ every member's."""
        per_dense, per_expert = self._state_bytes_per_param(plan)
        dense, expert = self.param_sums(plan)
        p = self.p
        return memory.peak_reserved_bytes((per_dense * dense + per_expert * expert) / plan.pp, 0.0, p.cuda_context_bytes,
                                          p.comm_buffer_bytes, p.fragmentation)

    def rank_memory_lower_bound_bytes(self, plan: ParallelPlan) -> float:
        """≤ memory_lower_bound_bytes without walking the graph: for ranks 0 and pp − 1, the model
        states of their layers (table parameters × the bytes per parameter after ZeRO) plus the
        activations the schedule keeps in flight (the estimate's own in-flight counts × the
        table's saved bytes per microbatch) and the largest recomputing layer's working bytes,
        with the estimate's overheads. Left out (both ≥ 0): FSDP gather buffers and the
        tied-embedding copy. A full(K) plan, whose recompute is not uniform, gets the O(1) bound."""
        r = plan.recompute
        if r.mode == "full" and r.num_layers is not None:
            return self.quick_memory_lower_bound_bytes(plan)
        t = self.table(plan)
        layout = self.layout(plan)
        per_dense, per_expert = self._state_bytes_per_param(plan)
        out = 0.0
        p = self.p
        for rank, (dense, expert, saved, work) in self._chunk_columns(t, r.mode, layout.stage_counts, plan.pp).items():
            states = pairwise_sum([per_dense * d + per_expert * e for d, e in zip(dense, expert)])
            acts = layout.inflight[rank] * saved / plan.vpp  # in-flight count (Layout.inflight) × its mean chunk
            out = max(out, memory.peak_reserved_bytes(states, acts + work, p.cuda_context_bytes, p.comm_buffer_bytes,
                                                      p.fragmentation))
        return out

    def _chunk_columns(self, t: LayerTable, mode: str, counts: tuple[int, ...], pp: int) -> dict[int, tuple]:
        """For ranks 0 and pp − 1: the dense and the expert parameters of each of their chunks, the
        saved bytes of their chunks summed and their largest working bytes (the columns of
        rank_memory_lower_bound_bytes). Virtual stage v = c · pp + r is chunk c of rank r."""
        key = (id(t), mode, counts, pp)
        hit = self._key_to_columns.get(key)
        if hit is None:
            cuts, at_cuts = self._stage_cuts(t, counts)
            dense, expert, saved = (at_cuts(prefix) for prefix in self._prefixes(t, mode))
            work = t.work_bytes[mode]
            hit = self._key_to_columns[key] = {
                rank: (chunk_totals(dense, rank, pp), chunk_totals(expert, rank, pp),
                       pairwise_sum(chunk_totals(saved, rank, pp)), chunk_max(work, cuts, rank, pp))
                for rank in {0, pp - 1}}
        return hit

    def _prefixes(self, t: LayerTable, mode: str) -> tuple[list[float], list[float], list[float]]:
        """prefix_sums of the table's dense and expert parameters and of `mode`'s saved bytes."""
        key = (id(t), mode, "memory")
        if key not in self._key_to_prefixes:
            params_key = (id(t), "params")
            if params_key not in self._key_to_prefixes:
                self._key_to_prefixes[params_key] = (prefix_sums(t.params_dense), prefix_sums(t.params_expert))
            self._key_to_prefixes[key] = (*self._key_to_prefixes[params_key], prefix_sums(t.saved_bytes[mode]))
        return self._key_to_prefixes[key]

    def memory_lower_bound_bytes(self, plan: ParallelPlan) -> float:
        """Peak of ranks 0 and pp − 1 by the estimate's own `rank_memory`: ≤ estimate's peak."""
        st = setup(self.graph, self.cluster, plan, self.p)
        chunks = rank_chunks(assign_layers(self.graph, st.layout), st.layout)
        return max(rank_memory(r, chunks[r], self.graph, plan, st, self.p)[0] for r in {0, plan.pp - 1})


def state_bytes_per_param(layout: Layout, plan: ParallelPlan) -> tuple[float, float]:
    """(dense, expert) bytes of weights + grads + optimizer per local parameter: the estimate's
    `memory.model_state_bytes` over the layout's dense and expert ZeRO shard sizes."""
    # Only the states resident at the forward/backward peak (memory.resident_state_bytes): FSDP2
    # frees its gradients between steps, so with one microbatch they are not counted (the estimate's
    # peak is the larger phase, so this stays a lower bound of it).
    fw = framework_profile(plan.framework, plan.framework_release)
    persistent = fw.persistent_gradients
    m = layout.num_microbatches
    g = memory.main_grad_bytes(plan.framework, plan.grad_reduce_in_bf16)
    o = fw.optimizer_bytes_per_param
    dense = memory.model_state_bytes(1.0, plan.framework, plan.zero, layout.dense_shard, g, o)
    expert = memory.model_state_bytes(1.0, plan.framework, plan.zero, layout.expert_shard, g, o)
    # A stage kept unsharded through the step (torchtitan's ZeRO-3 under pp) holds its weights and
    # gradients per parameter: exactly the estimate's memory.fsdp_transient_bytes, linear in the params.
    held = memory.pipelined_held_bytes_per_param(plan.framework, plan.zero, plan.pp)
    return (memory.resident_state_bytes(dense, persistent, m) + held,
            memory.resident_state_bytes(expert, persistent, m) + held)


@dataclass(frozen=True)
class StageMemoryModel:
    """Bytes of pipeline rank r holding layers L, as the DP and the ILP see it:
        with_overheads(state_per_param · Σ_L params + inflight_r / vpp · Σ_L saved + max_L work + extra_r)
    inflight_r: microbatches in flight under 1F1B, model chunks in flight under interleaving (whose
    activations the cost model takes as the rank's mean chunk, Σ_L saved / vpp).
    `state_per_dense`/`state_per_expert` are the bytes of weights + grads + optimizer per local
    parameter after ZeRO sharding, divided by (1 + fragmentation): model states do not fragment
    (memory.peak_reserved_bytes), so with_overheads of the sum gives them back exactly; extra_r is
    the tied-embedding copy on the last stage, scaled alike. `usable_bytes` inverts the overheads:
    a stage fits when its allocated bytes so counted ≤ usable_bytes."""

    state_per_dense: float
    state_per_expert: float
    inflight: tuple[int, ...]
    usable_bytes: float
    extra_last_bytes: float


def stage_memory_model(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, p: CostParams,
                       memory_margin: float) -> StageMemoryModel:
    """The linear memory model of a plan's ranks (equals `rank_memory` for ZeRO < 3, tested on every
    candidate of MoE spaces); shards, in-flight counts and the tied copy are the plan's Layout."""
    layout = Layout.of(plan, cluster, graph)
    unfragmented = 1.0 / (1.0 + p.fragmentation)
    per_dense, per_expert = (unfragmented * b for b in state_bytes_per_param(layout, plan))
    cap = usable_memory_bytes(cluster.hbm_bytes, memory_margin)
    usable = (cap - p.cuda_context_bytes - p.comm_buffer_bytes) / (1.0 + p.fragmentation)
    extra = per_dense * graph.layers[0].params_tp / plan.tp if layout.tied_embedding_copy else 0.0
    return StageMemoryModel(per_dense, per_expert, layout.inflight, usable, extra)


def stage_inputs(table: LayerTable, mem: StageMemoryModel, plan: ParallelPlan):
    """The DP's per-layer columns for a vpp = 1 plan whose recompute mode applies to every decoder."""
    from autopar.search.partition import StageInputs

    mode = plan.recompute.mode
    return StageInputs(
        time_s=tuple(map(add, table.fb_s, table.recompute_s[mode])),
        state_bytes=state_bytes_per_layer(table, mem),
        saved_bytes=table.saved_bytes[mode], work_bytes=table.work_bytes[mode], is_decoder=table.is_decoder,
        inflight=mem.inflight, usable_bytes=mem.usable_bytes, extra_last_bytes=mem.extra_last_bytes)


def state_bytes_per_layer(table: LayerTable, mem: StageMemoryModel) -> tuple[float, ...]:
    """Bytes of weights + grads + optimizer of each layer on one GPU, after ZeRO sharding."""
    return tuple(mem.state_per_dense * d + mem.state_per_expert * e
                 for d, e in zip(table.params_dense, table.params_expert))


# Virtual stage v = c · pp + r is chunk c of pipeline rank r. `at_cut`: a running sum (prefix_sums)
# read at the stage cuts (Pricer._stage_cuts: each stage's first layer, then the layer count), so
# stage v's total is at_cut[v + 1] − at_cut[v].

def stage_totals(at_cut: Sequence[float]) -> list[float]:
    """Each virtual stage's total."""
    return list(map(sub, at_cut[1:], at_cut))


def chunk_totals(at_cut: Sequence[float], rank: int, pp: int) -> list[float]:
    """The totals of pipeline rank `rank`'s chunks, in order."""
    return list(map(sub, at_cut[rank + 1::pp], at_cut[rank:-1:pp]))


def chunk_max(values: Sequence[float], cuts: tuple[int, ...], rank: int, pp: int) -> float:
    """The largest of `values` over pipeline rank `rank`'s layers (its chunks: contiguous, non-empty)."""
    chunks = map(slice, cuts[rank:-1:pp], cuts[rank + 1::pp])
    return max(map(max, map(values.__getitem__, chunks)))


def rank_sums(stage_values: list[float], pp: int) -> list[float]:
    """Per pipeline rank, the sum of its chunks' values, chunk after chunk (with NumPy,
    stage_values.reshape(vpp, pp).sum(axis=0)); the loop runs over the shorter of ranks and chunks."""
    vpp = len(stage_values) // pp
    if vpp == 1:
        return list(stage_values)
    if pp <= vpp:
        return [reduce(add, stage_values[rank::pp]) for rank in range(pp)]
    out = stage_values[:pp]
    for start in range(pp, len(stage_values), pp):
        out = list(map(add, out, stage_values[start:start + pp]))
    return out


def stage_bounds(num_items: int, counts: tuple[int, ...], first_decoder: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each stage in graph order: the items before the first decoder (embedding)
    join the first stage, the items after the last decoder (MTP, head) the last stage, as
    autopar.cost.step.assign_layers places them."""
    out, start = [], first_decoder
    for c in counts:
        out.append((start, start + c))
        start += c
    out[0] = (0, out[0][1])
    out[-1] = (out[-1][0], num_items)
    return out
