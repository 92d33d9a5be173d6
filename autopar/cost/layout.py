"""A plan placed on a cluster: the one owner of every quantity that follows from the degrees and the
GPU count — dp, expert dp, the dense and expert ZeRO shard sizes, the span of every process group
on the real ranks, the microbatch count, the in-flight microbatches of each pipeline rank, which
virtual stages a pipeline rank holds, and the layer split. The estimate, the search's tables and
bounds, explain and the exporters read a `Layout`; nothing else derives these numbers (torchtitan's
`ParallelDims` is the model: one object derives every group size from the degrees).

Rank order is Megatron's (`megatron.core.parallel_state`, order "tp-cp-ep-dp-pp"): tp fastest, then
cp, then dp for dense weights; experts re-slice the same ranks as etp, ep, edp, then pp. So

    dp  = gpus / (tp · pp · cp)         edp = gpus / (etp · ep · pp)   (expert data-parallel group)
    dense gradients are reduced and the distributed optimizer shards over the dp·cp ranks holding
    the same dense weights (Megatron's data-parallel group "with context parallel"), stride tp;
    expert weights are replicated over edp ranks only, stride etp · ep.

A hybrid-sharded plan (`zero_shard_size` k, in dp ranks) keeps dp/k replicas of the sharded state
(Megatron --num-distributed-optimizer-instances dp/k; torchtitan HSDP dp_replicate = dp/k,
dp_shard = k): dense states shard over k·cp ranks, expert states over edp/(dp/k) ranks. Validation is not repeated here: see `autopar.schema.plan.plan_violations` (and
`check_layout` for a plan against a loaded model and cluster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

from autopar.caching import Recorder, RecordingView, cached_property
from autopar.cost import comm, memory
from autopar.cost.layer import Spans
from autopar.hardware import Cluster
from autopar.model.graph import ModelGraph
from autopar.errors import InvalidPlanError
from autopar.frameworks import framework_spec
from autopar.schema.plan import Framework, ParallelPlan, plan_violations


@lru_cache(maxsize=4096)
def stage_layer_counts(num_layers: int, stages: int) -> tuple[int, ...]:
    """Even split; a remainder goes to the middle stages so the first and last (which also hold
    the embedding and the head) get fewer — Llama 3's 405B layout (Dubey et al. 2024 §3.3.2)."""
    q, r = divmod(num_layers, stages)
    counts = [q] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:r]:
        counts[i] += 1
    return tuple(counts)


@lru_cache(maxsize=4096)
def torchtitan_layer_counts(num_layers: int, stages: int, first_less: int = 1, last_less: int = 1
                            ) -> tuple[int, ...] | None:
    """Decoder layers per stage under torchtitan 0.3's own split (distributed/pipeline_parallel.py,
    _generate_llm_fqn_per_model_part, with its defaults pipeline_parallel_first/last_stage_less_layers
    = 1): the embedding counts as `first_less` layers and norm + head as `last_less`; the
    num_layers + both weights are dealt out evenly, the remainder to the earliest stages, and the
    first and last stages give up their weights' worth of decoders. None where torchtitan refuses
    (a stage lighter than a weight, or empty)."""
    if stages == 1:
        return (num_layers,)
    effective = num_layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if per == 0 or first_less > per or last_less > per:
        return None
    counts = [per + (1 if i < extra else 0) for i in range(stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return tuple(counts) if sum(counts) == num_layers and min(counts) >= 0 else None


# Every plan field Layout.build reads (etp as the plan's expert_tp: etp, else tp); a Layout cache is
# keyed by layout_key (tests/test_caching.py: Layout.build reads nothing else).
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "global_batch", "zero", "zero_shard_size",
                 "layers_per_stage", "framework")
layout_key = attrgetter(*LAYOUT_FIELDS)
# The plan fields each field Layout.build fills derives from: under caching.CHECK_KEYS, a computation
# that reads a Layout field reads these of its plan (tests/test_caching.py perturbs every plan field
# to check the table). Derived properties read these fields, so their reads follow.
LAYOUT_FIELD_READS: dict[str, tuple[str, ...]] = {
    "num_gpus": (), "num_layers": (), "gpus_per_node": (), "tp": ("tp",), "pp": ("pp",), "cp": ("cp",),
    "ep": ("ep",), "etp": ("etp", "tp"), "vpp": ("vpp",), "dp": ("tp", "pp", "cp"),
    "num_microbatches": ("global_batch", "tp", "pp", "cp", "mbs"), "dp_shard": ("zero_shard_size", "tp", "pp", "cp"),
    "zero": ("zero",), "layers_per_stage": ("layers_per_stage",), "tied_embedding_copy": ("pp", "framework"),
    "framework": ("framework",),
}


@dataclass(frozen=True)
class Layout:
    """Degrees of one plan on `num_gpus` GPUs, and every size, shard, span and count derived from
    them (cached properties: the search builds thousands of layouts and reads a few of each)."""

    num_gpus: int
    num_layers: int  # decoder layers of the model
    gpus_per_node: int  # the GPUs of one scale-up domain the job fills (Cluster.scale_up_gpus): group spans are placed on it
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    dp: int
    num_microbatches: int  # per step per pipeline: global batch / (dp · mbs)
    dp_shard: int  # data-parallel ranks one sharded copy spans: zero_shard_size, else dp
    zero: int
    layers_per_stage: tuple[int, ...] | None  # the plan's own split, if any
    tied_embedding_copy: bool  # the last pipeline rank also holds the word embedding (Megatron, tied, pp > 1)
    framework: str = Framework.MEGATRON  # whose default layer split applies (default_stage_counts)

    @classmethod
    def of(cls, plan: ParallelPlan, cluster: Cluster, graph: ModelGraph) -> "Layout":
        """The layout of `plan` on `cluster` for `graph` (the plan is assumed valid)."""
        return cls.build(plan, cluster.num_gpus, cluster.scale_up_gpus, graph.spec.num_layers,
                         graph.spec.tie_embeddings)

    @classmethod
    def build(cls, plan: ParallelPlan, num_gpus: int, gpus_per_node: int, num_layers: int,
              tie_embeddings: bool = False) -> "Layout":
        """The layout from plain numbers (exporters have a plan file, not a loaded cluster).

        Built without the dataclass's frozen __init__ (one object.__setattr__ per field, ~5 µs; a
        MoE search builds ~5·10^3 layouts): the fields go into the instance dict at once, as that
        __init__ would leave them (tests/test_layout.py compares the two). For a recorded plan
        (caching.CHECK_KEYS), the layout of the plan itself, reporting what is read of it."""
        if type(plan) is Recorder:
            layout = cls.build(plan._obj, num_gpus, gpus_per_node, num_layers, tie_embeddings)
            return RecordingView(layout, plan, LAYOUT_FIELD_READS)
        tp, pp, cp = plan.tp, plan.pp, plan.cp
        dp = num_gpus // (tp * pp * cp)  # ParallelPlan.dp_for
        layout = object.__new__(cls)
        layout.__dict__.update(
            num_gpus=num_gpus, num_layers=num_layers, gpus_per_node=gpus_per_node, tp=tp, pp=pp, cp=cp, ep=plan.ep,
            etp=plan.expert_tp, vpp=plan.vpp, dp=dp, num_microbatches=plan.global_batch // (dp * plan.mbs),
            dp_shard=plan.zero_shard_size or dp, zero=plan.zero, layers_per_stage=plan.layers_per_stage,
            tied_embedding_copy=tie_embeddings and pp > 1 and framework_spec(plan.framework).tied_embedding_copy_with_pp,
            framework=plan.framework)
        return layout

    @cached_property
    def edp(self) -> int:
        """Expert data-parallel size: gpus / (etp · ep · pp)."""
        return max(self.num_gpus // (self.etp * self.ep * self.pp), 1)

    @cached_property
    def dp_replicate(self) -> int:
        """Copies of the sharded state: dp / dp_shard (HSDP replicas, Megatron optimizer instances)."""
        return max(self.dp // self.dp_shard, 1)

    @cached_property
    def dense_shard(self) -> int:
        """Ranks the dense ZeRO state is sharded over: dp_shard · cp."""
        return self.dp_shard * self.cp

    @cached_property
    def expert_shard(self) -> int:
        """Ranks the expert ZeRO state is sharded over: edp / dp_replicate."""
        return max(self.edp // self.dp_replicate, 1)

    @cached_property
    def stage_counts(self) -> tuple[int, ...]:
        """Decoder layers per virtual stage in execution order (pp·vpp entries): the plan's, or the default."""
        return self.layers_per_stage or self.default_stage_counts

    @cached_property
    def inflight(self) -> tuple[int, ...]:
        """Microbatches (1F1B) or model chunks (interleaved) in flight on each pipeline rank at its peak."""
        return _inflight(self.pp, self.vpp, self.num_microbatches)

    @cached_property
    def tp_span(self) -> comm.GroupSpan:
        return comm.group_span(self.tp, 1, self.gpus_per_node)

    @cached_property
    def cp_span(self) -> comm.GroupSpan:
        return comm.group_span(self.cp, self.tp, self.gpus_per_node)

    @cached_property
    def ep_span(self) -> comm.GroupSpan:
        return comm.group_span(self.ep, self.etp, self.gpus_per_node)

    @cached_property
    def etp_span(self) -> comm.GroupSpan:
        return comm.group_span(self.etp, 1, self.gpus_per_node)

    @cached_property
    def dp_span(self) -> comm.GroupSpan:
        """The dense gradient / ZeRO group: dp·cp ranks at stride tp."""
        return comm.group_span(self.dp * self.cp, self.tp, self.gpus_per_node)

    @cached_property
    def edp_span(self) -> comm.GroupSpan:
        """The expert gradient / ZeRO group: edp ranks at stride etp·ep."""
        return comm.group_span(self.edp, self.etp * self.ep, self.gpus_per_node)

    @cached_property
    def pp_crosses_nodes(self) -> bool:
        """Pipeline neighbours sit tp·cp·dp ranks apart: in different nodes once that fills a node."""
        return self.tp * self.cp * self.dp >= self.gpus_per_node and self.num_gpus > self.gpus_per_node

    @property
    def default_stage_counts(self) -> tuple[int, ...]:
        """The split of the decoders over pp·vpp virtual stages when the plan names none: the one
        torchtitan makes by itself (torchtitan_layer_counts) for torchtitan, else autopar's
        (stage_layer_counts; also where torchtitan's rule has no split)."""
        if framework_spec(self.framework).layer_split == "torchtitan":
            counts = torchtitan_layer_counts(self.num_layers, self.pp * self.vpp)
            if counts is not None:
                return counts
        return stage_layer_counts(self.num_layers, self.pp * self.vpp)

    @cached_property
    def layer_spans(self) -> Spans:
        """The spans a layer's tp / cp / ep / etp communication runs on."""
        return Spans(tp=self.tp_span, cp=self.cp_span, ep=self.ep_span, etp=self.etp_span)

    @property
    def dense_optimizer_shard(self) -> int:
        """Ranks that split the dense optimizer step: the ZeRO group when ZeRO ≥ 1, else 1."""
        return self.dense_shard if self.zero >= 1 else 1

    @property
    def expert_optimizer_shard(self) -> int:
        """Ranks that split the expert optimizer step: the expert ZeRO group when ZeRO ≥ 1, else 1."""
        return self.expert_shard if self.zero >= 1 else 1

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """Virtual-stage indices pipeline rank `rank` holds, in execution order (Megatron's
        interleaving: chunk c of rank r is virtual stage c·pp + r)."""
        return tuple(c * self.pp + rank for c in range(self.vpp))

    @property
    def launch_shape(self) -> tuple[int, int]:
        """(GPUs per node, nodes) a launcher starts: the node size capped at the GPU count."""
        per_node = min(self.gpus_per_node, self.num_gpus)
        return per_node, math.ceil(self.num_gpus / per_node)


@lru_cache(maxsize=4096)
def _inflight(pp: int, vpp: int, m: int) -> tuple[int, ...]:
    """Layout.inflight for pp ranks, vpp chunks and m microbatches (shared by the search's layouts)."""
    if vpp > 1:
        return tuple(memory.inflight_chunks_interleaved(pp, vpp, r, m) for r in range(pp))
    return tuple(memory.inflight_microbatches_1f1b(pp, r, m) for r in range(pp))


def layout_violations(plan: ParallelPlan, cluster: Cluster, graph: ModelGraph) -> list[str]:
    """Every broken invariant of `plan` on `cluster` for `graph`, each naming its factors and the fix
    (autopar.schema.plan.plan_violations); empty = the plan can be laid out."""
    s = graph.spec
    return plan_violations(plan, num_gpus=cluster.num_gpus, num_layers=s.num_layers, num_heads=s.num_attention_heads,
                           num_kv_heads=s.kv_heads, num_experts=s.moe.num_experts if s.moe else 0, **s.mixer_counts(),
                           gpus_per_node=cluster.scale_up_gpus) + precision_violations(plan.precision, cluster) \
        + dispatcher_violations(plan, cluster, graph)


# DeepEP's normal (V1) kernels, which Megatron's flex dispatcher calls (megatron/core/transformer/moe/
# fused_a2a.py, deep_ep.Buffer): 8 NVLink peers per RDMA rank (csrc/legacy/buffer.hpp,
# "The number of maximum NVLink peers must be 8"), and a group either inside those 8 or a multiple of them
# (EP_HOST_ASSERT(num_ranks < NUM_MAX_NVL_PEERS or num_ranks % NUM_MAX_NVL_PEERS == 0)).
DEEPEP_NVL_PEERS = 8


def dispatcher_violations(plan: ParallelPlan, cluster: Cluster, graph: ModelGraph) -> list[str]:
    """The flex dispatcher (DeepEP) where DeepEP cannot run: GPUs other than NVIDIA's, hosts of other
    than 8 NVLink-connected GPUs (an NVL72 tray holds 4; Megatron's hybridep backend, which serves
    multi-node NVLink, is not modelled), or an etp·ep group that neither fits in one host nor fills whole
    hosts (DEEPEP_NVL_PEERS)."""
    if plan.moe_dispatcher != "flex" or graph.spec.moe is None:
        return []
    group = plan.ep * plan.expert_tp
    if cluster.vendor != "nvidia":
        return [f"moe_dispatcher flex runs DeepEP, which needs NVIDIA GPUs; the {cluster.gpu_name} of "
                f"{cluster.name} is not, so use moe_dispatcher alltoall"]
    if cluster.gpus_per_node != DEEPEP_NVL_PEERS and group > min(cluster.gpus_per_node, cluster.num_gpus):
        return [f"moe_dispatcher flex runs DeepEP, whose kernels pair 8 NVLink GPUs per host with RDMA between "
                f"hosts; {cluster.name} has {cluster.gpus_per_node} per host and the etp·ep group spans "
                f"{group} GPUs, so use moe_dispatcher alltoall"]
    if DEEPEP_NVL_PEERS < group and group % DEEPEP_NVL_PEERS:
        return [f"moe_dispatcher flex: DeepEP needs the etp·ep group ({group} GPUs) inside one host or a multiple "
                f"of {DEEPEP_NVL_PEERS}; change ep or etp, or use moe_dispatcher alltoall"]
    return []


def precision_violations(precision: str, cluster: Cluster) -> list[str]:
    """A precision the cluster's GPU has no tensor cores for (fp8 on an A100, nvfp4 on an H100 or an
    MI355X, mxfp8 before Blackwell and CDNA 4), with the fix: the profile's formats (Cluster.supports)."""
    if cluster.supports(precision):
        return []
    supported = " or ".join(("bf16",) + cluster.precisions)
    return [f"the {cluster.gpu_name} of {cluster.name} has no {precision} tensor cores (its profile lists "
            f"{', '.join(cluster.precisions) or 'none'} besides bf16); use --precision {supported}"]


def check_layout(plan: ParallelPlan, cluster: Cluster, graph: ModelGraph) -> None:
    """Raise InvalidPlanError listing every violation (see layout_violations)."""
    problems = layout_violations(plan, cluster, graph)
    if problems:
        raise InvalidPlanError("invalid plan: " + "; ".join(problems))
