"""What a training framework is, as autopar needs it: one FrameworkSpec per framework, defined in
that framework's own module (autopar/frameworks/megatron.py, deepspeed.py, torchtitan.py) and
registered once in autopar/frameworks/__init__.py. Nothing else in autopar keys behaviour on a
framework's name: the plan's defaults, the search space, the plan rules, the cost model's kernels
and memory policy, and the exporter and importer are all read from the spec.

Plain frozen dataclasses and functions (no Pydantic, no NumPy): the CLI and the search's hot loops
read them. Exporters and importers are named by dotted path ("module:function") and imported on
first use, so the frameworks sit below the cost model, which reads their profiles, while their
exporters sit above it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

ZERO_STATES = ("optimizer", "gradients", "weights")  # what ZeRO stages 1, 2, 3 add to the sharded set


def no_model_refusals(model_spec) -> list[str]:
    """A framework that can train every model autopar builds."""
    return []


def no_plan_refusals(model_spec, gpus: int, plan) -> list[str]:
    """A framework whose limits are all plan rules (autopar.schema.rules): Megatron's."""
    return []


@dataclass(frozen=True, slots=True)
class FrameworkProfile:
    """What the cost model reads of a framework release (sources in each framework's module)."""

    name: str
    version: str
    attention_kernel_by_arch: tuple[tuple[str, str], ...]  # (GPU architecture, kernel family)
    # "modules" (Megatron's list), "op_sac" (torchtitan's per-op policy), or "kept" (a Hugging Face model
    # under DeepSpeed: selective core-attention recompute is no call at all, SDPA/flash keep no scores)
    selective_policy: str
    fused_cross_entropy: bool
    persistent_gradients: bool
    fp8_one_byte_saved_inputs: bool
    gather_unit: str  # "module" | "block": granularity of ZeRO-3/FSDP parameter all-gathers
    gathers_under_full_recompute: int  # parameter all-gathers per microbatch with full recompute
    prefetch_depth: int  # chunks gathered ahead of the one computing
    prefetch_max_params: float | None = None  # a unit larger than this is not prefetched (None = any)
    persistence_threshold_params: float = 0.0  # parameters smaller than this are never partitioned
    synchronous_gathers: bool = False  # every parameter gather waits for the device: no prefetch overlap
    per_rank_copies: bool = False  # ZeRO-3 collectives copy each rank's slice with its own kernel
    # ZeRO-3 re-gathers its persistent (under-threshold) parameters after every step, copying each rank's
    # slice of each of them into place with its own kernel (autopar.cost.fsdp.persistent_regather_s)
    persistent_regather: bool = False
    gathered_bytes_per_unit_param: float = 4.0  # unsharded bytes alive per parameter of the largest gather unit
    cp_ring: str = "te"  # "te": Transformer Engine's CP attention | "torch": PyTorch's ring (fp32 merge, dK/dV ring)
    cp_repeats_kv_heads: bool = False  # CP moves K/V repeated to the query heads (GQA expanded before SDPA)
    cp_comm_overlapped: bool = True  # CP transfers run behind attention (False: waited where issued)
    tp_backward_overlap: bool = False  # sp backward: input re-gather / dgrad reduce-scatter behind dgrad / wgrad
    elementwise: str = "fused"  # norms, RoPE, activation: "fused" kernels | "eager" op by op | "compile": per plan
    fp8_casts: str = "te"  # how fp8 linears cast their operands (autopar.cost.layer.FP8_CAST_RECIPES)
    pipeline_scatter_gather: bool = False  # pp sends split over tp without sp, all-gathered on receipt
    optimizer_bytes_per_param: float | None = None  # replaces FrameworkSpec.state_bytes_per_param's optimizer bytes
    # HBM bytes per logit (forward, backward) of the loss over a rank's vocabulary shard: the cast to fp32, the
    # softmax passes and the gradient, as the framework's loss code runs them (autopar.cost.layer.loss_s);
    # `unfused_loss_bytes_per_logit` is what a plan running it unfused moves (Megatron cross_entropy_fusion
    # off, an eager torchtitan plan; None: no such choice)
    loss_bytes_per_logit: tuple[float, float] = (10.0, 20.0)
    unfused_loss_bytes_per_logit: tuple[float, float] | None = None
    # (GPU architecture, largest head dim its attention_kernel_by_arch kernel trains, (query/key, value)
    # pairs above that it trains all the same): a model with other head dims runs `attention_fallback_kernel`
    # there (the framework's own choice, e.g. Transformer Engine's cuDNN backend on Blackwell)
    kernel_head_dim_limits: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...] = ()
    attention_fallback_kernel: str = "fa2"

    def attention_kernel(self, arch: str, head_dims: tuple[tuple[int, int], ...] = ()) -> str:
        """The kernel family the framework launches on `arch` for a model whose softmax attention has
        these (query/key, value) head dims (ModelGraph.attention_head_dims)."""
        kernel = dict(self.attention_kernel_by_arch).get(arch, "fa2")
        for limit_arch, limit, allowed in self.kernel_head_dim_limits:
            if limit_arch == arch and any(max(d) > limit and d not in allowed for d in head_dims):
                return self.attention_fallback_kernel
        return kernel

    def loss_bytes(self, unfused: bool) -> tuple[float, float]:
        """(forward, backward) HBM bytes per logit of the loss a plan runs: this profile's, or its unfused
        one where the plan runs the loss unfused (Megatron cross_entropy_fusion off, torchtitan eager)."""
        if unfused and self.unfused_loss_bytes_per_logit is not None:
            return self.unfused_loss_bytes_per_logit
        return self.loss_bytes_per_logit


@dataclass(frozen=True, slots=True)
class FrameworkSpec:
    """Everything autopar knows of one framework. A new framework provides one of these (see
    tests/test_frameworks.py, which builds a made-up one and checks it with check_spec)."""

    name: str  # the Framework value: --framework NAME, the plan's `framework`
    title: str  # for people: "Megatron-LM (Megatron-Core)"
    # --- axes and defaults
    zero_stages: tuple[int, ...]  # ZeRO stages it offers
    default_zero: int  # the stage a plan gets when none is named
    zero_sharded: tuple[tuple[int, tuple[str, ...]], ...]  # stage -> the states it shards (ZERO_STATES)
    searched_zero_stages: tuple[int, ...]  # the stages the search tries unless one is pinned
    cp_comm_types: tuple[str, ...]  # context-parallel K/V exchanges offered (empty: no CP)
    default_cp_comm_type: str  # what a plan carries when none is named, and at cp = 1
    offers_tp: bool = True
    offers_ep: bool = True
    offers_interleaving: bool = True  # vpp > 1
    offers_fp8: bool = True
    # Block-scaled precisions beyond fp8 (choices.Precision) the framework has a recipe for: mxfp8, nvfp4
    block_scaled_precisions: tuple[str, ...] = ()
    even_layer_split: bool = False  # pipeline stages must hold equal layer counts
    max_zero_with_pp: int | None = None  # highest ZeRO stage allowed together with pp > 1
    default_torch_compile: bool | None = None  # None: not a choice of this framework (refused when set)
    default_cross_entropy_fusion: bool | None = None  # None: not a choice (Megatron's --cross-entropy-loss-fusion)
    grad_reduce_in_bf16_settable: bool = False
    attention_backend_settable: bool = False  # the plan may pick the attention kernel (Megatron --attention-backend)
    shared_expert_overlap_settable: bool = False  # shared experts may run beside the dispatch (Megatron's switch)
    sequential_experts_settable: bool = False  # moe_grouped_gemm may be turned off
    flex_dispatcher: bool = False  # moe_dispatcher flex: Megatron's flex dispatcher on DeepEP
    selective_label: str | None = None  # None: "selective(modules)"; else the one policy's label
    # --- memory policy
    state_bytes_per_param: tuple[float, float, float] = (2.0, 4.0, 12.0)  # weights, gradients, optimizer
    zero2_keeps_weights_gathered: bool = False  # stage 2 shards all states and keeps the bf16 weights twice
    # With pp > 1, ZeRO-3 keeps the stage unsharded through the step: its 16-bit weights gathered at the
    # first microbatch and its gradients accumulated unsharded until the last (autopar.cost.fsdp)
    pp_keeps_stage_unsharded: bool = False
    layer_split: str = "megatron"  # default split of uneven layer counts: "megatron" | "torchtitan"
    tied_embedding_copy_with_pp: bool = False  # tied embeddings keep a second copy on the last stage
    # --- checkpoints (autopar.cost.run)
    checkpoint_bytes_per_param: float = 14.0  # what a checkpoint writes per parameter
    async_checkpoint: bool = False  # can save in the background (only the device-to-host copy blocks)
    # --- cost profile of the current releases and older releases that behaved differently
    profile: FrameworkProfile | None = None
    releases: tuple[tuple[str, FrameworkProfile], ...] = ()
    # --- what it cannot express: model-level (checked before any search) and plan-level
    model_refusals: Callable[[Any], list[str]] = no_model_refusals
    plan_refusals: Callable[[Any, int, Any], list[str]] = no_plan_refusals
    # Whether plan_refusals can refuse any plan of this model (False: it returns [] for every plan, so
    # the search skips it per candidate); plan_refusals itself returns [] where this is False.
    refuses_plans_of: Callable[[Any], bool] = lambda model_spec: True
    # --- files: dotted "module:function" paths, imported on first use
    exporter: str = ""  # (PlanFile) -> {file name: text}
    importer: str | None = None  # (source, ...) -> ParallelPlan

    # ------------------------------------------------------------------ derived
    def cost_profile(self, release: str | None = None) -> FrameworkProfile:
        """The profile of the current releases, or of an older `release`."""
        if release is None:
            return self.profile
        return dict(self.releases)[release]

    @property
    def release_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.releases)

    def sharded_states(self, zero: int) -> tuple[str, ...]:
        """The model states stage `zero` shards under this framework."""
        return dict(self.zero_sharded)[zero]

    def recompute_label(self, recompute) -> str:
        """How this framework names the recompute a plan asks for (its option's words)."""
        if self.selective_label is not None and str(recompute.mode) == "selective":
            return self.selective_label
        return recompute.label()

    def resolved_torch_compile(self, value: bool | None) -> bool | None:
        """A plan's torch_compile with this framework's default filled in (unchanged when set)."""
        return self.default_torch_compile if value is None else value

    def resolved_cp_comm_type(self, value: str | None, cp: int) -> str:
        """The CP exchange the plan carries: its own at cp > 1, else this framework's default (at
        cp = 1 there is no exchange; the field is normalised so equal plans compare equal)."""
        return self.default_cp_comm_type if value is None or cp == 1 else value

    def export_files(self, plan_file) -> dict[str, str]:
        """The launch files of `plan_file` ({file name: text}), written by this framework's exporter."""
        return _resolve(self.exporter)(plan_file)

    def import_function(self) -> Callable[..., Any]:
        """This framework's importer (reads its launch files back into a plan); ValueError if none."""
        if self.importer is None:
            raise ValueError(f"{self.name} has no importer")
        return _resolve(self.importer)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def check_spec(spec: FrameworkSpec) -> list[str]:
    """What a FrameworkSpec is missing or gets inconsistent (empty = a complete framework)."""
    out = []
    if not spec.name or spec.name != spec.name.lower():
        out.append(f"name {spec.name!r} must be a lower-case word")
    if spec.default_zero not in spec.zero_stages:
        out.append(f"default ZeRO {spec.default_zero} is not among its stages {spec.zero_stages}")
    if not set(spec.searched_zero_stages) <= set(spec.zero_stages):
        out.append(f"searched ZeRO stages {spec.searched_zero_stages} are not all offered {spec.zero_stages}")
    if sorted(dict(spec.zero_sharded)) != sorted(spec.zero_stages):
        out.append("zero_sharded must say what every offered stage shards")
    if spec.cp_comm_types and spec.default_cp_comm_type not in spec.cp_comm_types:
        out.append(f"default CP exchange {spec.default_cp_comm_type} is not among {spec.cp_comm_types}")
    if spec.profile is None:
        out.append("no cost profile")
    if spec.layer_split not in ("megatron", "torchtitan"):
        out.append(f"unknown layer split {spec.layer_split!r}")
    if ":" not in spec.exporter:
        out.append("no exporter ('module:function')")
    return out
