"""One training step of a plan: per-stage time and memory, the pipeline schedule, data-parallel
synchronization and the optimizer, summed into an Estimate.

step = pipeline(per-rank forward/backward per microbatch) + exposed DP sync + optimizer step.
The pipeline uses the 1F1B closed form generalized to interleaving and unequal ranks
(autopar.cost.pipeline.pipeline_step_s, checked against its event simulation in tests). Every
group size, shard size, span and microbatch count comes from the plan's Layout
(autopar.cost.layout); a plan fits when its peak rank is within the usable HBM, HBM · (1 − margin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autopar.choices import DEFAULT_MEMORY_MARGIN  # noqa: F401 (the one margin; re-exported for its users)
from autopar.cost import comm, fsdp, memory
from autopar.cost.compute import gemm_peak_flops, memory_bound_time_s
from autopar.cost.layer import BF16_BYTES, LayerCost, Spans, Split, expert_blind, layer_cost
from autopar.frameworks import framework_profile
from autopar import caching
from autopar.cost.layout import Layout, layout_key, stage_layer_counts  # noqa: F401 (stage_layer_counts re-exported)
from autopar.cost.params import CostParams, for_framework
from autopar.cost.pipeline import pipeline_step_s
from autopar.hardware import Cluster, gpu_arch
from autopar.model.graph import Layer, ModelGraph
from autopar.schema.plan import Framework, ParallelPlan, Precision, RecomputeMode

# Adam step traffic per locally owned parameter: read fp32 master, grad, two moments (16 B),
# write master and moments (12 B) and the bf16 weight (2 B); clipping reads the grad again (4 B).
OPTIMIZER_BYTES_PER_PARAM = 34.0
# Megatron's default DDP bucket is max(40M, 1M·dp) parameters; the last bucket's reduction cannot
# overlap with backward. We expose at least 1/GRAD_BUCKETS of the reduction.
GRAD_BUCKETS = 8
MFU_NOTE = "MFU = (6·N_active + causal attention) FLOPs per token × tokens/s ÷ dense bf16 peak (fp8 plans too)"
MAIN_GRAD_BYTES = {fw: memory.main_grad_bytes(fw, False) for fw in Framework}  # bytes reduced per grad


def usable_memory_bytes(capacity_bytes: float, memory_margin: float) -> float:
    """HBM a plan may fill: capacity · (1 − margin). The one definition of "fits"."""
    return capacity_bytes * (1.0 - memory_margin)


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One pipeline rank (all its virtual stages)."""

    rank: int
    layers: tuple[int, ...]  # decoder layers per virtual stage on this rank
    fwd_s: float  # per microbatch, all chunks, incl. exposed TP/CP/EP comm
    bwd_s: float  # per microbatch, incl. recompute
    recompute_s: float
    params: float
    memory_bytes: float
    memory_breakdown_bytes: dict[str, float]


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    usable_memory_bytes: float  # capacity · (1 − memory_margin): fits ⇔ peak ≤ usable
    memory_margin: float
    fits: bool
    time_breakdown_s: dict[str, float]
    memory_breakdown_bytes: dict[str, float]
    stages: tuple[StageEstimate, ...]
    num_microbatches: int
    dp: int
    moe: bool  # the model routes tokens to experts (its error band's regime depends on it)
    notes: tuple[str, ...] = field(default=())

    @property
    def bubble_fraction(self) -> float:
        return self.time_breakdown_s["bubble"] / self.step_time_s

    @property
    def exposed_comm_fraction(self) -> float:
        keys = ("tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_comm")
        return sum(self.time_breakdown_s[k] for k in keys) / self.step_time_s


def assign_layers(graph: ModelGraph, layout: Layout) -> list[list[Layer]]:
    """Layers of each virtual stage (the layout's split): embedding on the first, MTP and head on the last."""
    counts = layout.stage_counts
    decoders = list(graph.decoder_layers)
    stages, start = [], 0
    for c in counts:
        stages.append(decoders[start:start + c])
        start += c
    stages[0].insert(0, graph.layers[0])
    stages[-1].extend(layer for layer in graph.layers if layer.kind in ("mtp", "head"))
    return stages


# Megatron --attention-backend -> the kernel family priced (cost-model attention_kernels): flash runs the
# flash-attn package Transformer Engine imports (2.x in the NeMo containers of 2024-25), fused cuDNN's
# fused attention; auto leaves Transformer Engine's choice (FrameworkProfile.attention_kernel_by_arch);
# unfused prices Transformer Engine's UnfusedDotProductAttention instead of a flash kernel
# (autopar.cost.layer.te_unfused_attention).
ATTENTION_BACKEND_KERNELS = {"flash": "fa2", "fused": "cudnn"}


def moe_load(plan: ParallelPlan, routed_tokens_per_rank: float, ep: int) -> float:
    """Busiest expert rank's routed tokens over the mean. Each of the ep ranks sends its T·k token
    copies (T tokens, top-k) to the expert ranks; with balanced routing that is m = T·k·ep balls in
    ep bins, whose expected maximum is m/ep + sqrt(2·(m/ep)·ln ep) in the heavy-load regime (Raab &
    Steger 1998, "Balls into bins: a simple and tight analysis"), i.e. a load of
    1 + sqrt(2·ln(ep) / (T·k)). Capped by the capacity factor when tokens beyond it are dropped; a
    plan's stated imbalance replaces the bound. Ignores router skew beyond random placement. Padded
    to capacity (moe_pad_to_capacity), every expert receives exactly its capacity, capacity factor ×
    the mean (Megatron-Core token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess, drop_and_pad:
    num_tokens_per_local_expert = capacity · tp · ep, core_r0.9.0 to core_r0.12.0)."""
    if plan.moe_pad_to_capacity and plan.moe_capacity_factor is not None:
        return float(plan.moe_capacity_factor)
    if plan.moe_load_imbalance is not None:
        load = plan.moe_load_imbalance
    elif ep <= 1 or routed_tokens_per_rank <= 0:
        load = 1.0
    else:
        load = 1.0 + math.sqrt(2.0 * math.log(ep) / routed_tokens_per_rank)
    return load if plan.moe_capacity_factor is None else min(load, plan.moe_capacity_factor)


@dataclass(frozen=True, slots=True)
class StepSetup:
    """A plan's Layout and the per-microbatch Split its layers are costed on. The group sizes and
    spans are the layout's (these properties only name them for the cost terms)."""

    layout: Layout
    split: Split

    @property
    def spans(self) -> Spans:
        return self.layout.layer_spans

    @property
    def dp_span(self) -> comm.GroupSpan:
        return self.layout.dp_span

    @property
    def edp_span(self) -> comm.GroupSpan:
        return self.layout.edp_span

    @property
    def pp_crosses_nodes(self) -> bool:
        return self.layout.pp_crosses_nodes

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def edp(self) -> int:
        return self.layout.edp

    @property
    def m(self) -> int:
        return self.layout.num_microbatches


def setup(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, p: CostParams,
          layout: Layout | None = None) -> StepSetup:
    """The plan's layout (built here unless given) and the split its layers are costed on: GEMMs at
    the precision's peak (fp8: the bf16 peak times the fitted fp8 gain), attention always at the
    bf16 peak, with the framework's attention kernel family on this GPU and the MoE load bound."""
    p = for_framework(p, plan.framework)
    layout = layout or Layout.of(plan, cluster, graph)
    bf16_peak = cluster.peak_flops(Precision.BF16)
    peak = gemm_peak_flops(plan.precision, cluster.peak_flops_by_dtype, p)  # fp8 / mxfp8 / nvfp4 gains
    tokens = plan.mbs * plan.seq_len / plan.cp
    load = 1.0
    if graph.spec.moe:
        routed = tokens / (plan.tp if plan.sequence_parallel else 1) * graph.spec.moe.top_k
        load = moe_load(plan, routed, plan.ep)
    fw = framework_profile(plan.framework, plan.framework_release)
    eager = fw.elementwise == "eager" or (fw.elementwise == "compile" and plan.torch_compile is False)
    loss_fwd, loss_bwd = fw.loss_bytes(unfused=eager or plan.cross_entropy_fusion is False)
    split = Split(tp=plan.tp, sp=plan.sequence_parallel, cp=plan.cp, ep=plan.ep, etp=layout.etp,
                  tokens=tokens, seq_len=plan.seq_len, hidden=graph.spec.hidden_size,
                  peak_flops=peak, moe_load=load, cp_comm_type=plan.cp_comm_type, moe_dispatcher=plan.moe_dispatcher,
                  attn_peak_flops=bf16_peak,
                  attention_kernel=ATTENTION_BACKEND_KERNELS.get(plan.attention_backend)
                  or fw.attention_kernel(gpu_arch(cluster.gpu_name), graph.attention_head_dims),
                  unfused_attention=plan.attention_backend == "unfused",
                  cp_ring=fw.cp_ring, cp_repeats_kv_heads=fw.cp_repeats_kv_heads,
                  cp_comm_overlapped=fw.cp_comm_overlapped, tp_backward_overlap=fw.tp_backward_overlap,
                  eager=eager,
                  sequential_experts=not plan.moe_grouped_gemm, fp8_casts=fw.fp8_casts,
                  moe_padded=plan.moe_pad_to_capacity and plan.moe_capacity_factor is not None,
                  shared_expert_overlap=plan.moe_shared_expert_overlap, loss_fwd_bytes=loss_fwd, loss_bwd_bytes=loss_bwd)
    return StepSetup(layout=layout, split=split)


class StepMemo:
    """What `estimate` works out per layer and per virtual stage, kept across the estimates of one
    (graph, cluster, cost model) — the search prices hundreds of plans that share splits and
    stages. Layers equal in everything but index and name share a class; a virtual stage is keyed
    by its layers' classes and by every plan field its terms read, so a kept result is exactly the
    one `estimate` would compute afresh (same inputs, same order of additions: bit-identical).
    Not a second model: the entries are the very functions below, called once per key. A key
    lists every plan field its function reads: a cost term that reads a new field must add it.
    reuse=False computes every entry afresh (the reference the tests compare a shared memo with)."""

    def __init__(self, graph: ModelGraph, cluster: Cluster, p: CostParams, reuse: bool = True) -> None:
        self.graph, self.cluster, self.p, self.reuse = graph, cluster, p, reuse
        self._layer_class = {id(x): c for x, c in zip(graph.layers, graph.layer_classes)}
        self._key_to_layout: dict[tuple, Layout] = {}
        self._key_to_stages: dict[tuple, list[list[Layer]]] = {}
        self._key_to_ranks: dict[tuple, list[list[list[Layer]]]] = {}
        self._id_to_signature: dict[int, tuple[list, tuple]] = {}
        self._key_to_costs: dict[tuple, tuple[int, dict[str, LayerCost]]] = {}
        self._id_to_firsts: dict[int, tuple[list, list[Layer]]] = {}
        self._key_to_stage: dict[tuple, object] = {}
        self._key_to_flops: dict[tuple, float] = {}
        self._id_to_layer_memos: dict[int, tuple[CostParams, tuple[dict, dict]]] = {}
        self._last_fields: tuple | None = None

    def bound_to(self, graph: ModelGraph, cluster: Cluster, p: CostParams) -> bool:
        return graph is self.graph and cluster is self.cluster and p is self.p

    def plan_fields(self, plan: ParallelPlan) -> tuple:
        """Every field of `plan` but the pipeline shape, batch and ZeRO sharding (STAGE_BLIND):
        the plan part of the key of a per-stage entry, so that a cost term that starts reading
        another plan field stays keyed by it."""
        if caching.RECORDING:
            return ()  # no table is looked up while recording (caching.check_key)
        last = self._last_fields
        if last is not None and last[0] is plan:
            return last[1]
        fields = tuple((v.mode, v.num_layers, v.modules) if k == "recompute" else v  # (hashing a model is slower)
                       for k, v in plan.__dict__.items() if k not in STAGE_BLIND)
        self._last_fields = (plan, fields)
        return fields

    def layout(self, plan: ParallelPlan) -> Layout:
        """The plan's Layout, cached by every plan field a Layout reads (layout_key)."""
        if caching.RECORDING:
            return Layout.of(plan, self.cluster, self.graph)
        key = layout_key(plan)
        layout = self._key_to_layout.get(key)
        if layout is None:
            layout = self._key_to_layout[key] = Layout.of(plan, self.cluster, self.graph)
            if caching.CHECK_KEYS:
                caching.check_key("StepMemo.layout", layout_key, lambda q: Layout.of(q, self.cluster, self.graph), plan)
        return layout

    def stages(self, layout: Layout) -> list[list[Layer]]:
        """assign_layers of the layout's split, kept per split (callers only read the lists)."""
        key = layout.stage_counts
        hit = self._key_to_stages.get(key)
        if hit is None:
            hit = self._key_to_stages[key] = assign_layers(self.graph, layout)
            for stage in hit:
                self.signature(stage)
        return hit

    def ranks(self, layout: Layout) -> list[list[list[Layer]]]:
        """rank_chunks of the layout's split, kept per split and pipeline shape."""
        key = (layout.stage_counts, layout.pp, layout.vpp)
        hit = self._key_to_ranks.get(key)
        if hit is None:
            hit = self._key_to_ranks[key] = rank_chunks(self.stages(layout), layout)
        return hit

    def rank_signature(self, chunks: list[list[Layer]]) -> tuple[tuple[int, ...], ...]:
        """The signatures of a pipeline rank's chunks (kept for the lists `ranks` returns)."""
        hit = self._id_to_signature.get(id(chunks))
        if hit is not None and hit[0] is chunks:
            return hit[1]
        sig = tuple(map(self.signature, chunks))
        self._id_to_signature[id(chunks)] = (chunks, sig)
        return sig

    def signature(self, stage: list[Layer]) -> tuple[int, ...]:
        """The classes of a stage's layers, in order (kept for the stage lists `stages` returns)."""
        hit = self._id_to_signature.get(id(stage))
        if hit is not None and hit[0] is stage:
            return hit[1]
        classes = self._layer_class
        sig = tuple(classes[id(x)] for x in stage)
        self._id_to_signature[id(stage)] = (stage, sig)  # holds the list: its id stays its own
        return sig

    def costs(self, stages: list[list[Layer]], st: StepSetup, plan: ParallelPlan, p: CostParams
              ) -> tuple[int, dict[str, LayerCost]]:
        """(number, layer_costs) of a split: the same for every plan with this split and spans."""
        if caching.RECORDING:
            return -1, layer_costs([self._firsts(stages)], st, self.cluster, p, plan, None)
        key = _costs_key(plan, st)
        hit = self._key_to_costs.get(key) if self.reuse else None
        if hit is None:  # the key stands in later keys as a small number (hashing a Split is not free)
            memos = self._layer_memos(p) if self.reuse else None
            firsts = self._firsts(stages)
            hit = self._key_to_costs[key] = (len(self._key_to_costs), layer_costs([firsts], st,
                                                                                  self.cluster, p, plan, memos))
            if caching.CHECK_KEYS:
                caching.check_key("StepMemo.costs", lambda q: _costs_key(q, st),
                                  lambda q: layer_costs([firsts], st, self.cluster, p, q, None), plan)
        return hit

    def _firsts(self, stages: list[list[Layer]]) -> list[Layer]:
        """The first layer of each _layer_key in the stages, in order: all layer_costs reads of
        them (kept for the stage lists `stages` returns; a search prices ~10^3 splits of one)."""
        hit = self._id_to_firsts.get(id(stages))
        if hit is None or hit[0] is not stages:
            firsts: dict[str, Layer] = {}
            for stage in stages:
                for layer in stage:
                    firsts.setdefault(_layer_key(layer), layer)
            hit = self._id_to_firsts[id(stages)] = (stages, list(firsts.values()))
        return hit[1]

    def _layer_memos(self, p: CostParams) -> tuple[dict, dict]:
        """The (GEMM times, expert-blind layer costs) dicts of one cost-model view (for_framework
        gives one per framework; the view is held so that its id stays its own)."""
        hit = self._id_to_layer_memos.get(id(p))
        if hit is None or hit[0] is not p:
            hit = self._id_to_layer_memos[id(p)] = (p, ({}, {}))
        return hit[1]

    def stage(self, kind: str, key: tuple, compute, plan: ParallelPlan):
        """`compute(plan)` once per (kind, key); the plan part of `key` is plan_fields(plan), so
        `compute` may read any plan field but the STAGE_BLIND ones (checked under CHECK_KEYS)."""
        if not self.reuse or caching.RECORDING:
            return compute(plan)
        key = (kind, *key)
        hit = self._key_to_stage.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._key_to_stage[key] = compute(plan)
            if caching.CHECK_KEYS:
                caching.check_key(f"StepMemo.stage {kind}", _stage_fields, compute, plan)
        return hit

    def flops(self, name: str, key, compute, plan: ParallelPlan) -> float:
        """`compute(plan)` once per (name, key(plan))."""
        if caching.RECORDING:
            return compute(plan)
        k = (name, *key(plan))
        hit = self._key_to_flops.get(k) if self.reuse else None
        if hit is None:
            hit = self._key_to_flops[k] = compute(plan)
            if caching.CHECK_KEYS:
                caching.check_key(f"StepMemo.flops {name}", key, compute, plan)
        return hit


_MISSING = object()
# Plan fields no per-stage or per-rank term reads (they choose which layers a stage holds, how many
# microbatches run, and how ZeRO shards states: the rank-level arithmetic reads them from the plan).
STAGE_BLIND = frozenset({"pp", "vpp", "layers_per_stage", "global_batch", "zero", "zero_shard_size",
                         "overlap_grad_reduce", "overlap_param_gather"})
_STAGE_FIELDS = tuple(f for f in ParallelPlan.model_fields if f not in STAGE_BLIND)


def _stage_fields(plan: ParallelPlan) -> tuple:
    """The plan part of a StepMemo.stage key: what plan_fields keeps (for CHECK_KEYS)."""
    return tuple(getattr(plan, f) for f in _STAGE_FIELDS)


def _costs_key(plan: ParallelPlan, st: StepSetup) -> tuple:
    """What layer_costs reads: the split and spans (the plan's degrees, tokens, kernels, as
    StepSetup derives them), TP overlap and the framework (its cost-model view)."""
    return (st.split, st.spans, plan.tp_comm_overlap, plan.framework)


def layer_costs(stages: list[list[Layer]], st: StepSetup, cluster: Cluster, p: CostParams,
                 plan: ParallelPlan, memos: tuple[dict, dict] | None = None) -> dict[str, LayerCost]:
    """Cost of each distinct layer (all dense decoders are alike, all MoE decoders are alike).
    `memos`: (GEMM times, costs of layers without experts) kept across splits for this graph,
    cluster and p (layer.gemm_pass_times_s; layer.expert_blind: one cost per expert layout)."""
    out: dict[str, LayerCost] = {}
    gemm_memo, blind_memo = memos or (None, None)
    for stage in stages:
        for layer in stage:
            key = _layer_key(layer)
            if key in out:
                continue
            if blind_memo is None or layer.num_experts:
                out[key] = layer_cost(layer, st.split, st.spans, cluster, p, plan.tp_comm_overlap, gemm_memo)
                continue
            split, spans = expert_blind(st.split, st.spans)
            hit = blind_memo.get((key, split, spans, plan.tp_comm_overlap))
            if hit is None:
                hit = blind_memo[key, split, spans, plan.tp_comm_overlap] = layer_cost(
                    layer, split, spans, cluster, p, plan.tp_comm_overlap, gemm_memo)
            out[key] = hit
    return out


def _layer_key(layer: Layer) -> str:
    return layer.cost_key


def _recompute_mode(plan: ParallelPlan, position: int) -> str:
    """Recompute mode of the position-th decoder layer of a virtual stage (Megatron's block method
    recomputes the first K layers of each virtual stage)."""
    r = plan.recompute
    if r.mode == RecomputeMode.FULL and r.num_layers is not None and position >= r.num_layers:
        return RecomputeMode.NONE
    return r.mode


def stage_time(stage: list[Layer], costs: dict[str, LayerCost], plan: ParallelPlan) -> tuple[float, float, float, dict]:
    """(fwd, bwd incl. recompute, recompute, comm parts) of one virtual stage for one microbatch."""
    fwd = bwd = rec = 0.0
    parts = {"tp_comm": 0.0, "cp_comm": 0.0, "ep_comm": 0.0}
    position = 0
    policy = framework_profile(plan.framework, plan.framework_release).selective_policy
    for layer in stage:
        c = costs[_layer_key(layer)]
        mode = RecomputeMode.NONE
        if layer.kind in ("dense", "moe"):
            mode = _recompute_mode(plan, position)
            position += 1
        # Full recompute re-runs the forward: its compute counts as recompute, its communication
        # under the axis that issues it (so the breakdown counts every second once).
        full = mode == RecomputeMode.FULL
        r = c.fwd_compute_s if full else c.recompute_s(mode, plan.recompute.modules, policy)
        fwd += c.fwd_s
        bwd += c.bwd_s + r + (c.tp_comm_fwd_s + c.cp_comm_fwd_s + c.ep_comm_fwd_s if full else 0.0)
        rec += r
        parts["tp_comm"] += c.tp_comm_fwd_s + c.tp_comm_bwd_s + (c.tp_comm_fwd_s if full else 0.0)
        parts["cp_comm"] += c.cp_comm_fwd_s + c.cp_comm_bwd_s + (c.cp_comm_fwd_s if full else 0.0)
        parts["ep_comm"] += c.ep_comm_fwd_s + c.ep_comm_bwd_s + (c.ep_comm_fwd_s if full else 0.0)
    return fwd, bwd, rec, parts


def rank_layers(chunks: list[list[Layer]], costs: dict[str, LayerCost], plan: ParallelPlan) -> list[tuple]:
    """(layer, its cost, its recompute mode) of a pipeline rank's chunks in execution order."""
    out = []
    for chunk in chunks:
        position = 0
        for layer in chunk:
            mode = "none"
            if layer.kind in ("dense", "moe"):
                mode = _recompute_mode(plan, position)
                position += 1
            out.append((layer, costs[_layer_key(layer)], mode))
    return out


def stage_params(stage: list[Layer], plan: ParallelPlan, tied_copy: bool, embedding: Layer) -> tuple[float, float, float]:
    """(dense params on one GPU, expert params on one GPU, largest layer) of one virtual stage."""
    dense = expert = largest = 0.0
    for layer in stage:
        d = layer.params_tp / plan.tp + layer.params_replicated
        e = layer.params_expert / (plan.ep * plan.expert_tp)
        dense, expert, largest = dense + d, expert + e, max(largest, d + e)
    if tied_copy:
        dense += embedding.params_tp / plan.tp  # Megatron keeps the word embedding on the last stage too
    return dense, expert, largest


def stage_activation_bytes(stage: list[Layer], plan: ParallelPlan, tokens: float,
                           classes: tuple[int, ...] | None = None) -> tuple[float, float]:
    """(saved bytes for one microbatch, working bytes of the largest recomputed layer). `classes`:
    the stage's layer classes (StepMemo.signature), so that alike layers are sized once."""
    saved = work = 0.0
    position = 0
    sp = plan.sequence_parallel
    fw = framework_profile(plan.framework, plan.framework_release)
    fp8 = plan.precision != "bf16" and fw.fp8_one_byte_saved_inputs  # mxfp8 / nvfp4 saved at fp8's byte too
    unfused = plan.attention_backend == "unfused"
    sized: dict[tuple, tuple[float, float]] = {}
    for i, layer in enumerate(stage):
        mode = RecomputeMode.NONE
        if layer.kind in ("dense", "moe"):
            mode = _recompute_mode(plan, position)
            position += 1
        hit = sized.get((classes[i], mode)) if classes is not None else None
        if hit is None:
            kept = memory.saved_activation_bytes(layer, tokens, plan.seq_len, plan.tp, sp, mode,
                                                 plan.recompute.modules, fp8, fw.selective_policy, plan.expert_tp,
                                                 unfused)
            full = kept if mode == RecomputeMode.NONE else memory.saved_activation_bytes(
                layer, tokens, plan.seq_len, plan.tp, sp, RecomputeMode.NONE, fp8=fp8, etp=plan.expert_tp,
                unfused_attention=unfused)
            hit = (kept, full)
            if classes is not None:
                sized[classes[i], mode] = hit
        kept, full = hit
        saved += kept
        if mode != RecomputeMode.NONE:
            work = max(work, full - kept)
        if layer.kind == "head":
            vocab = next(g.n for g in layer.gemms if g.split == "vocab")
            work = max(work, memory.loss_transient_bytes(tokens, vocab, plan.tp, fw.fused_cross_entropy))
    return saved, work


def _rank_contents(chunks: list[list[Layer]], graph: ModelGraph, plan: ParallelPlan, tokens: float, tied_copy: bool,
                   memo: StepMemo | None) -> tuple[float, float, float, tuple[float, ...], float]:
    """(dense params, expert params, largest layer, saved bytes per chunk, largest working bytes)
    of a pipeline rank's chunks: stage_params and stage_activation_bytes of each (`tied_copy`: the
    last chunk also holds the word embedding)."""
    dense = expert = largest = work = 0.0
    saved = []
    fields = memo.plan_fields(plan) if memo is not None else ()
    for i, chunk in enumerate(chunks):
        tied = tied_copy and i == len(chunks) - 1
        if memo is None:
            d, e, big = stage_params(chunk, plan, tied, graph.layers[0])
            s, w = stage_activation_bytes(chunk, plan, tokens)
        else:
            sig = memo.signature(chunk)
            d, e, big = memo.stage("params", (sig, tied, *fields),
                                   lambda q: stage_params(chunk, q, tied, graph.layers[0]), plan)
            s, w = memo.stage("acts", (sig, tokens, *fields), lambda q: stage_activation_bytes(chunk, q, tokens, sig),
                              plan)
        dense, expert, largest = dense + d, expert + e, max(largest, big)
        saved.append(s)
        work = max(work, w)
    return dense, expert, largest, tuple(saved), work


def rank_memory(rank: int, chunks: list[list[Layer]], graph: ModelGraph, plan: ParallelPlan, st: StepSetup,
                 p: CostParams, memo: StepMemo | None = None) -> tuple[float, dict[str, float], float, float]:
    """(peak bytes, breakdown, dense params, expert params) of one pipeline rank. The peak is the
    larger of two phases (not a sum of per-phase maxima): forward/backward (resident model states,
    activations in flight, the recompute and loss transients, gathered ZeRO-3 weights) and the
    optimizer step (weights, all gradients, optimizer state). `memo` (StepMemo) reuses stages'
    parameters and activations across plans; the numbers are the same without it."""
    p = for_framework(p, plan.framework)
    layout = st.layout
    tied_copy = layout.tied_embedding_copy and rank == layout.pp - 1
    if memo is None:
        dense, expert, largest, saved, work = _rank_contents(chunks, graph, plan, st.split.tokens, tied_copy, None)
    else:
        key = (memo.rank_signature(chunks), tied_copy, st.split.tokens, *memo.plan_fields(plan))
        dense, expert, largest, saved, work = memo.stage(
            "rank_contents", key, lambda q: _rank_contents(chunks, graph, q, st.split.tokens, tied_copy, memo), plan)
    g = memory.main_grad_bytes(plan.framework, plan.grad_reduce_in_bf16)
    fw = framework_profile(plan.framework, plan.framework_release)
    o = fw.optimizer_bytes_per_param
    states = memory.model_state_bytes(dense, plan.framework, plan.zero, layout.dense_shard, g, o)
    expert_states = memory.model_state_bytes(expert, plan.framework, plan.zero, layout.expert_shard, g, o)
    states = {k: states[k] + expert_states[k] for k in states}
    # Interleaved: the rank's in-flight chunks hold its mean chunk's activations.
    activations = layout.inflight[rank] * sum(saved) / len(saved)
    unit = largest  # a block: the rank's largest layer
    if plan.zero >= 3 and fw.gather_unit == "module":
        unit = fsdp.largest_unit_params([layer for chunk in chunks for layer in chunk], plan)
    gathered = memory.fsdp_transient_bytes(dense + expert, unit, plan.framework, plan.zero,
                                           fw.gathered_bytes_per_unit_param, plan.pp)
    persistent = fw.persistent_gradients
    resident = memory.resident_state_bytes(states, persistent, st.m)
    fwd_bwd = resident + activations + work + gathered
    optimizer_step = sum(states.values())
    if fwd_bwd >= optimizer_step:
        breakdown = {**states, "gradients": resident - states["weights"] - states["optimizer"],
                     "activations": activations + work, "fsdp_gathered": gathered}
        # model states and a stage held gathered through the step do not fragment (memory.peak_reserved_bytes)
        held = memory.fsdp_stage_held_bytes(dense + expert, plan.framework, plan.zero, plan.pp)
        fixed, cycled = resident + held, activations + work + gathered - held
    else:
        breakdown = {**states, "activations": 0.0, "fsdp_gathered": 0.0}
        fixed, cycled = optimizer_step, 0.0
    allocated = sum(breakdown.values())
    total = memory.peak_reserved_bytes(fixed, cycled, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation)
    breakdown["buffers_and_fragmentation"] = total - allocated
    return total, breakdown, dense, expert


def _dp_sync_s(dense: float, expert: float, st: StepSetup, cluster: Cluster, p: CostParams,
               plan: ParallelPlan) -> tuple[float, float]:
    """(once per step, once per microbatch) data-parallel traffic over the dense and the expert DP
    group. ZeRO 0: one gradient all-reduce per step; ZeRO 1: one reduce-scatter of the accumulated
    gradients plus the parameter all-gather per step; ZeRO 2 keeps only its gradient shard, so
    every microbatch's backward reduce-scatters its gradients (DeepSpeed ZeRO-2 and Megatron-FSDP
    optim_grads reduce per micro-step; Rajbhandari et al. 2020 §5.2) and the parameter all-gather
    stays once per step. ZeRO-3/FSDP: see autopar.cost.fsdp, nothing is charged here a second time."""
    if plan.zero >= 3:
        return 0.0, 0.0
    g = memory.main_grad_bytes(plan.framework, plan.grad_reduce_in_bf16)
    step = per_microbatch = 0.0
    for params, span in ((dense, st.dp_span), (expert, st.edp_span)):
        if span.size <= 1 or params <= 0:
            continue
        if plan.zero == 0:
            step += comm.all_reduce_s(params * g, span, cluster, p)
            continue
        reduce_s = comm.reduce_scatter_s(params * g, span, cluster, p)
        if plan.zero == 2:
            per_microbatch += reduce_s
        else:
            step += reduce_s
        step += comm.all_gather_s(params * BF16_BYTES, span, cluster, p)
    return step, per_microbatch


def dp_sync_lower_bound_s(dense: float, expert: float, layout: Layout, cluster: Cluster, p: CostParams,
                          plan: ParallelPlan) -> float:
    """F, a floor of ZeRO 2's per-microbatch gradient reduce-scatters over the step, for a plan
    whose pipeline ranks hold on average `dense` and `expert` parameters (on one GPU): m · x with
    x the linear comm.reduce_scatter_floor_s of those parameters (so x ≤ the mean rank's sync,
    ≤ the busiest's). 0 for the other ZeRO stages. See with_dp_floor_s for how it bounds a step."""
    return layout.num_microbatches * dp_sync_floor_per_microbatch_s(dense, expert, layout, cluster, p, plan)


def dp_sync_floor_per_microbatch_s(dense: float, expert: float, layout: Layout, cluster: Cluster, p: CostParams,
                                   plan: ParallelPlan) -> float:
    """x of dp_sync_lower_bound_s: one microbatch's share (the same for every micro batch size)."""
    if plan.zero != 2:
        return 0.0
    p = for_framework(p, plan.framework)
    g = memory.main_grad_bytes(plan.framework, plan.grad_reduce_in_bf16)
    return (comm.reduce_scatter_floor_s(dense * g, layout.dp_span, cluster, p)
            + comm.reduce_scatter_floor_s(expert * g, layout.edp_span, cluster, p))


def with_dp_floor_s(pipeline_s: float, floor_s: float) -> float:
    """A step-time bound from a bound on the pipeline part and F = dp_sync_lower_bound_s. The
    estimate charges rank r's per-microbatch sync x_r as m · _exposed_dp_s(x_r, b_r) ≥
    m · max(x_r / GRAD_BUCKETS, x_r − b_r) on top of a pipeline ≥ m · (f_r + b_r); so the step is
    ≥ pipeline + F / GRAD_BUCKETS and ≥ m · (f_r + x_r) ≥ F (the backward it hides behind is
    itself on the step)."""
    return max(pipeline_s + floor_s / GRAD_BUCKETS, floor_s)


def _exposed_dp_s(sync_s: float, overlap_window_s: float, plan: ParallelPlan) -> float:
    """With overlap, all but the last bucket hides behind the last microbatch's backward."""
    if not plan.overlap_grad_reduce:
        return sync_s
    return max(sync_s / GRAD_BUCKETS, sync_s - overlap_window_s)


def _rank_time(chunks: list[list[Layer]], costs: dict[str, LayerCost], plan: ParallelPlan, memo: StepMemo,
               rec_key: tuple) -> tuple[float, float, float, dict[str, float], tuple[int, ...]]:
    """(fwd, bwd, recompute, comm parts, decoder layers per chunk) of one pipeline rank for one
    microbatch: the stage_time of its chunks, summed."""
    times = [memo.stage("time", (memo.signature(chunk), *rec_key), lambda q: stage_time(chunk, costs, q), plan)
             for chunk in chunks]
    parts = {k: sum(t[3][k] for t in times) for k in ("tp_comm", "cp_comm", "ep_comm")}
    decoders = tuple(sum(1 for x in chunk if x.kind in ("dense", "moe")) for chunk in chunks)
    return sum(t[0] for t in times), sum(t[1] for t in times), sum(t[2] for t in times), parts, decoders


def rank_chunks(stages: list[list[Layer]], layout: Layout) -> list[list[list[Layer]]]:
    """The virtual stages each pipeline rank holds (Layout.rank_stages), in execution order."""
    return [[stages[i] for i in layout.rank_stages(r)] for r in range(layout.pp)]


def estimate(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, p: CostParams,
             memory_margin: float = DEFAULT_MEMORY_MARGIN, memo: StepMemo | None = None) -> Estimate:
    """Score one plan (assumed valid: see autopar.cost.layout.check_layout); it fits when its peak
    rank is within usable_memory_bytes(HBM, memory_margin). `memo`: a StepMemo of the same graph,
    cluster and cost model, shared by the estimates of a search (same numbers, computed once)."""
    if memo is None or not memo.bound_to(graph, cluster, p):
        memo = StepMemo(graph, cluster, p)
    p = for_framework(p, plan.framework)
    st = setup(graph, cluster, plan, p, memo.layout(plan))
    layout = st.layout
    stages = memo.stages(layout)
    costs_key, costs = memo.costs(stages, st, plan, p)
    ranks = memo.ranks(layout)
    rec_key = (costs_key, *memo.plan_fields(plan))  # what stage_time and rank_layers read: costs and the plan
    f, b, rec, comm_parts, stage_rows, dp_exposed = [], [], [], [], [], 0.0
    opt_params = 0.0
    syncs: dict[tuple[float, float], tuple[float, float]] = {}
    for r, chunks in enumerate(ranks):
        rank_key = (memo.rank_signature(chunks), *rec_key)
        fwd_s, bwd_s, rec_s, parts, decoders = memo.stage("rank_time", rank_key,
                                                          lambda q: _rank_time(chunks, costs, q, memo, rec_key), plan)
        f.append(fwd_s)
        b.append(bwd_s)
        rec.append(rec_s)
        comm_parts.append(parts)
        mem, breakdown, dense, expert = rank_memory(r, chunks, graph, plan, st, p, memo)
        opt_params = max(opt_params, dense / layout.dense_optimizer_shard + expert / layout.expert_optimizer_shard)
        if (dense, expert) not in syncs:  # ranks holding the same parameters sync alike
            syncs[dense, expert] = _dp_sync_s(dense, expert, st, cluster, p, plan)
        sync, sync_per_microbatch = syncs[dense, expert]
        slack = r * (b[-1] / plan.vpp)  # later ranks finish their last backward earlier
        dp_exposed = max(dp_exposed, max(0.0, _exposed_dp_s(sync, b[-1], plan) - slack)
                         + st.m * _exposed_dp_s(sync_per_microbatch, b[-1], plan))
        dp_exposed = max(dp_exposed, fsdp.passes_per_step(plan, st.m) * fsdp.exposed_per_microbatch_s(
            memo.stage("rank_layers", rank_key, lambda q: rank_layers(chunks, costs, q), plan), plan, st.dp_span, cluster,
            p) + fsdp.persistent_regather_s(chunks, plan, st.dp_span, cluster, p))
        stage_rows.append(StageEstimate(rank=r, layers=decoders,
                                        fwd_s=f[-1], bwd_s=b[-1], recompute_s=rec[-1], params=dense + expert,
                                        memory_bytes=mem, memory_breakdown_bytes=breakdown))
    p2p_s = pipeline_send_s(graph.spec.hidden_size, st, plan, cluster, p, st.pp_crosses_nodes) if plan.pp > 1 else 0.0
    pipe_s, pp_comm_s = pipeline_step_s(f, b, st.m, plan.vpp, p2p_s)
    optimizer_s = memory_bound_time_s(opt_params * OPTIMIZER_BYTES_PER_PARAM, cluster.hbm_bytes_per_s, p, kernels=4)
    step_s = pipe_s + pp_comm_s + dp_exposed + optimizer_s
    slow = max(range(plan.pp), key=lambda r: f[r] + b[r])
    busy = st.m * (f[slow] + b[slow])
    exposed = {k: st.m * v for k, v in comm_parts[slow].items()}
    breakdown_s = {
        "compute": busy - st.m * rec[slow] - sum(exposed.values()),
        "recompute": st.m * rec[slow],
        **exposed,
        "dp_comm": dp_exposed,
        "pp_comm": pp_comm_s,
        "bubble": pipe_s - busy,
        "optimizer": optimizer_s,
    }
    return _summarize(graph, cluster, plan, st, step_s, breakdown_s, stage_rows, rec, memory_margin, memo)


def peak_memory_bytes(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, p: CostParams,
                      memo: StepMemo | None = None) -> float:
    """`estimate(...).peak_memory_bytes` without the times: the largest rank_memory over the
    pipeline ranks, for callers that rank plans by memory alone (the search's "no plan fits"
    message). tests/test_search.py checks it equals the estimate's peak."""
    if memo is None or not memo.bound_to(graph, cluster, p):
        memo = StepMemo(graph, cluster, p)
    p = for_framework(p, plan.framework)
    st = setup(graph, cluster, plan, p, memo.layout(plan))
    return max(rank_memory(r, chunks, graph, plan, st, p, memo)[0] for r, chunks in enumerate(memo.ranks(st.layout)))


def pipeline_send_s(hidden_size: int, st: StepSetup, plan: ParallelPlan, cluster: Cluster, p: CostParams,
                    crosses_nodes: bool) -> float:
    """One stage-boundary send of a microbatch's activations (or their gradient), tokens × hidden in
    bf16. Megatron-Core sends the sp-split tensor under sequence parallelism and the whole tensor
    otherwise. Megatron-LM before Megatron-Core's pipeline (January 2021 to March 2023) and
    Megatron-DeepSpeed split it over the tp ranks without sequence parallelism, each sending 1/tp,
    and all-gather it over tp on the receiving stage before use (Narayanan et al. SC'21 §4.1, the
    scatter/gather optimization; --no-scatter-gather-tensors-in-pipeline turns it off)."""
    full_bytes = st.split.tokens * hidden_size * BF16_BYTES
    if plan.tp > 1 and plan.sequence_parallel:
        return comm.send_recv_s(full_bytes / plan.tp, crosses_nodes, cluster, p)
    if plan.tp > 1 and framework_profile(plan.framework, plan.framework_release).pipeline_scatter_gather:
        return (comm.send_recv_s(full_bytes / plan.tp, crosses_nodes, cluster, p)
                + comm.all_gather_s(full_bytes, st.spans.tp, cluster, p))
    return comm.send_recv_s(full_bytes, crosses_nodes, cluster, p)


def _summarize(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, st: StepSetup, step_s: float,
               breakdown_s: dict[str, float], stage_rows: list[StageEstimate], rec: list[float],
               memory_margin: float, memo: StepMemo) -> Estimate:
    n = cluster.num_gpus
    tokens = plan.global_batch * plan.seq_len
    model_flops = memo.flops("model", _seq_key, lambda q: graph.model_flops_per_token(q.seq_len, causal=True),
                             plan) * tokens
    recompute_flops = memo.flops("recompute", _recompute_flops_key, lambda q: _recompute_flops(graph, q), plan) * tokens
    peak_row = max(stage_rows, key=lambda row: row.memory_bytes)
    capacity = cluster.hbm_bytes
    usable = usable_memory_bytes(capacity, memory_margin)
    return Estimate(
        step_time_s=step_s, tokens_per_s=tokens / step_s, tokens_per_s_per_gpu=tokens / step_s / n,
        model_tflops_per_gpu=model_flops / step_s / n / 1e12,
        hardware_tflops_per_gpu=(model_flops + recompute_flops) / step_s / n / 1e12,
        mfu=model_flops / step_s / n / cluster.peak_flops("bf16"),
        peak_memory_bytes=peak_row.memory_bytes, memory_capacity_bytes=capacity,
        usable_memory_bytes=usable, memory_margin=memory_margin, fits=peak_row.memory_bytes <= usable,
        time_breakdown_s=breakdown_s, memory_breakdown_bytes=dict(peak_row.memory_breakdown_bytes),
        stages=tuple(stage_rows), num_microbatches=st.m, dp=st.dp, moe=graph.spec.moe is not None,
        notes=(MFU_NOTE,),
    )


def _seq_key(plan: ParallelPlan) -> tuple:
    return (plan.seq_len,)


def _recompute_flops_key(plan: ParallelPlan) -> tuple:
    """What _recompute_flops reads of the plan."""
    r = plan.recompute
    return (plan.seq_len, r.mode, r.modules, r.num_layers, plan.pp, plan.vpp)


def _recompute_flops(graph: ModelGraph, plan: ParallelPlan) -> float:
    """Extra forward FLOPs per token that recomputation adds (for hardware TFLOP/s)."""
    r = plan.recompute
    decoders = graph.decoder_layers
    if r.mode == RecomputeMode.FULL:
        per_stage = graph.spec.num_layers / (plan.pp * plan.vpp)
        share = 1.0 if r.num_layers is None else min(1.0, r.num_layers / per_stage)
        return share * sum(layer.forward_flops_per_token(plan.seq_len) for layer in decoders)
    if r.mode == RecomputeMode.SELECTIVE and "core_attn" in r.modules:
        return sum(layer.attention_flops_per_token(plan.seq_len) for layer in decoders)
    return 0.0
