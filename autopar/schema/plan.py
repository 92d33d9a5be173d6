"""The parallel plan: one layout of a model on a cluster, as the CLI, the plan JSON and the
exporters name it. Axis names (tp pp dp cp ep etp vpp mbs zero sp recompute) are the same in
every place a user sees them.

A plan is resolved when it is built: what its framework does by default is written into it
(autopar.frameworks: the ZeRO stage, the context-parallel exchange, torch.compile), and a field
that means nothing for the plan is normalised (the CP exchange at cp = 1), so every command and
exporter reads one object and two equal layouts compare equal. Otherwise the defaults are what a
Megatron-LM user gets when they say nothing: sp on with tp > 1, selective recompute of core
attention, bf16, gradient-reduce and parameter-gather overlap on, TP communication overlap off.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.choices import (  # noqa: F401 (re-exported: they were defined here; no Pydantic there, for the CLI)
    FRAMEWORKS,
    Framework,
    Precision,
    RecomputeMode,
    default_zero,
)
from autopar.errors import InvalidPlanError
from autopar.frameworks import framework_spec
from autopar.schema.rules import Context, violations
from autopar.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, clip, clip_repr
from autopar.schema.types import Count, Flag, Real

PLAN_SCHEMA_VERSION = 1
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj")


# defer_build: the validators are built on first validation. The plan command builds none: the
# search makes its plans with `trusted` (from already-checked axes) and dumps them with `plan_json`,
# so it never pays for building a validator nor for Pydantic's plugin discovery (which imports
# importlib.metadata and scans every installed distribution's entry points: ~40 ms, issue 15).
_FROZEN = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Recompute(BaseModel):
    """Activation recomputation. selective: drop the listed modules' tensors (Megatron
    --recompute-modules); full: keep only each recomputed layer's input (--recompute-granularity
    full --recompute-method block --recompute-num-layers K, K per virtual stage; None = all)."""

    model_config = _FROZEN

    mode: RecomputeMode = Field(RecomputeMode.SELECTIVE, description="none | selective | full.")
    modules: tuple[str, ...] = Field(("core_attn",), description="Modules recomputed under selective.")
    num_layers: Count | None = Field(None, ge=0, le=MAX_LAYERS, description="Full: layers per virtual stage recomputed; None = all.")

    @model_validator(mode="after")
    def _check(self) -> "Recompute":
        unknown = [m for m in self.modules if m not in RECOMPUTE_MODULES]
        if unknown:
            raise ValueError(f"unknown recompute module(s) {unknown}; choose from {', '.join(RECOMPUTE_MODULES)}")
        if self.num_layers is not None and self.mode != RecomputeMode.FULL:
            # Megatron reads --recompute-num-layers only with --recompute-granularity full.
            raise ValueError(f"{self.num_layers} recomputed layers (--recompute-layers) apply to full recompute "
                             f"only, not {self.mode}: use --recompute full, or drop the layer count")
        return self

    @classmethod
    def trusted(cls, mode: RecomputeMode, modules: tuple[str, ...] = ("core_attn",),
                num_layers: int | None = None) -> "Recompute":
        """A Recompute from values already of the validated types and valid (known modules; the
        search's own choices), built without the validator; equal to Recompute(...) of the same
        values (tests/test_plan_trusted.py)."""
        return cls.model_construct(mode=RecomputeMode(mode), modules=modules, num_layers=num_layers)

    def label(self, framework: str | None = None) -> str:
        """none, selective(modules), full(K) or full; under a framework whose selective recompute is one
        policy whatever the modules say (torchtitan's per-op AC: autopar.frameworks), its name."""
        if framework is not None:
            own = framework_spec(framework).selective_label
            if own is not None and self.mode == RecomputeMode.SELECTIVE:
                return own
        if self.mode == RecomputeMode.SELECTIVE:
            return "selective(" + "+".join(self.modules) + ")"
        if self.mode == RecomputeMode.FULL and self.num_layers is not None:
            return f"full({self.num_layers})"
        return self.mode


class ParallelPlan(BaseModel):
    """Degrees and switches of one plan. dp is derived: gpus / (tp · pp · cp)."""

    model_config = _FROZEN

    tp: Count = Field(1, ge=1, le=MAX_GPUS, description="Tensor-parallel degree.")
    pp: Count = Field(1, ge=1, le=MAX_GPUS, description="Pipeline-parallel degree.")
    cp: Count = Field(1, ge=1, le=MAX_GPUS, description="Context-parallel degree (sequence split in attention).")
    ep: Count = Field(1, ge=1, le=MAX_GPUS, description="Expert-parallel degree (MoE models).")
    etp: Count | None = Field(None, ge=1, le=MAX_GPUS, description="Expert tensor-parallel degree; None = tp.")
    vpp: Count = Field(1, ge=1, le=MAX_LAYERS, description="Virtual stages per pipeline rank (interleaved 1F1B when > 1).")
    mbs: Count = Field(1, ge=1, le=MAX_GLOBAL_BATCH, description="Micro-batch size (sequences).")
    global_batch: Count = Field(..., ge=1, le=MAX_GLOBAL_BATCH, description="Global batch size (sequences).")
    seq_len: Count = Field(..., ge=1, le=MAX_SEQ_LEN, description="Training sequence length (tokens).")
    zero: Count = Field(1, ge=0, le=3, description="ZeRO stage: 1 = Megatron distributed optimizer, 3 = FSDP full "
                        "shard; when not given, the framework's default (megatron and deepspeed 1, torchtitan 3).")
    zero_shard_size: Count | None = Field(None, ge=1, le=MAX_GPUS, description="Hybrid sharding group size; None = all of dp.")
    sp: Flag | None = Field(None, description="Sequence parallelism; None = on when tp > 1.")
    recompute: Recompute = Field(default_factory=Recompute, description="Activation recomputation.")
    precision: Precision = Field(Precision.BF16, description="Compute precision of the GEMMs.")
    overlap_grad_reduce: Flag = Field(True, description="Overlap DP gradient reduction with backward.")
    overlap_param_gather: Flag = Field(True, description="Overlap ZeRO parameter all-gather with compute; "
                                       "when not given, on exactly when parameters are gathered (zero >= 1).")
    tp_comm_overlap: Flag = Field(False, description="Overlap TP communication with GEMMs (needs sp).")
    cp_comm_type: Literal["p2p", "a2a", "allgather"] = Field(
        "p2p", description="Context-parallel attention (Megatron --cp-comm-type): p2p ring with K/V exchange "
        "overlapped, a2a (Ulysses: heads scattered, needs kv heads / tp divisible by cp), allgather of K/V; "
        "when not given, and always at cp 1, the framework's default (torchtitan allgather, else p2p).")
    attention_backend: Literal["auto", "flash", "fused", "unfused"] = Field(
        "auto", description="Megatron --attention-backend: auto = Transformer Engine's choice (FlashAttention on "
        "Ampere, cuDNN fused attention on Hopper and Blackwell), flash = the flash-attn 2 package (what "
        "NVTE_FUSED_ATTN=0 leaves), fused = cuDNN fused attention, unfused = Transformer Engine's "
        "UnfusedDotProductAttention with the scores in HBM (what Transformer Engine before 2.5 falls back to on "
        "Blackwell for head dims above 128, such as MLA's 192; no context parallelism); other frameworks pick "
        "their own kernel.")
    moe_dispatcher: Literal["alltoall", "allgather", "flex"] = Field(
        "alltoall", description="MoE token dispatcher (Megatron --moe-token-dispatcher-type): alltoall, allgather, "
        "or flex = Megatron's flex dispatcher on DeepEP (--moe-flex-dispatcher-backend deepep), which sends a "
        "token once to each node and each GPU its experts sit on (Megatron only; NVIDIA GPUs, 8 per node).")
    moe_load_imbalance: Real | None = Field(
        None, ge=1.0, description="Tokens on the busiest expert rank over the mean; None = derived from the "
        "tokens, experts per rank and top-k (balls-into-bins, see autopar.cost.step.moe_load).")
    moe_capacity_factor: Real | None = Field(
        None, gt=0, description="Expert capacity factor (Megatron --moe-expert-capacity-factor); None = dropless. "
        "Tokens beyond capacity are dropped, so the busiest rank carries min(load, capacity factor).")
    moe_pad_to_capacity: Flag = Field(
        False, description="Pad every expert's input to its capacity (Megatron --moe-pad-expert-input-to-capacity; "
        "needs moe_capacity_factor): each expert computes exactly capacity factor × the mean tokens, the all-to-alls "
        "split equally and the dispatcher skips its token-count gather and host sync.")
    moe_shared_expert_overlap: Flag = Field(
        False, description="Run the shared experts beside the token dispatch and combine (Megatron "
        "--moe-shared-expert-overlap; alltoall dispatcher, not with shared_experts recompute): their GEMMs hide "
        "that much of the all-to-alls. No effect on a model without shared experts.")
    moe_grouped_gemm: Flag = Field(
        True, description="Run a rank's local experts as one grouped GEMM (Megatron --moe-grouped-gemm); false = "
        "Megatron's SequentialMLP, one pair of Transformer Engine linears per expert, launched from Python.")
    framework: Framework = Field(Framework.MEGATRON, description="Target framework.")
    torch_compile: Flag | None = Field(
        None, description="torch.compile each transformer block (torchtitan --compile.enable), fusing its norms, "
        "RoPE and activation; false = eager PyTorch, op by op; not given = on, as autopar exports it. torchtitan "
        "only (None elsewhere): Megatron-LM runs fused kernels and DeepSpeed the Hugging Face model's eager code.")
    cross_entropy_fusion: Flag | None = Field(
        None, description="Megatron --cross-entropy-loss-fusion: the vocab-parallel cross-entropy as fused "
        "kernels (22 + 10 HBM bytes per logit); false = Megatron-LM's default without the flag, op by op (38 + 14); "
        "not given = on, as autopar exports it. Megatron only (None elsewhere).")
    grad_reduce_in_bf16: Flag = Field(
        False, description="Keep and reduce the main gradients in bf16 instead of fp32 (Megatron "
        "--grad-reduce-in-bf16; NeMo optim.grad_sync_dtype bf16). Megatron only.")
    framework_release: Literal["0.3", "megatron-deepspeed", "2024-12", "pre-core", "nemo-apex"] | None = Field(
        None, description="An older framework release whose behaviour differs (megatron pre-core: Megatron-LM "
        "of 2021-22, pipeline sends split over tp and all-gathered on receipt; megatron nemo-apex: NeMo 1.x "
        "with Apex DistributedFusedAdam, 10 optimizer bytes per parameter instead of 12; deepspeed 0.3: DeepSpeed "
        "0.3.13-0.5.5 of 2021, synchronous ZeRO-3 gathers; deepspeed megatron-deepspeed: DeepSpeed running "
        "Megatron-DeepSpeed's GPT, fused kernels and loss, instead of a Hugging Face model; torchtitan 2024-12: "
        "commit 9dec370 with torchao's tensorwise float8); None = current releases.")
    layers_per_stage: tuple[Annotated[Count, Field(ge=0, le=MAX_LAYERS)], ...] | None = Field(
        None, description="Decoder layers per virtual stage (pp·vpp entries, in execution order); None = "
        "even, with any remainder taken off the first and last stages (they hold embedding and head).")

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data):
        """The framework's defaults written into the plan (autopar.frameworks): the ZeRO stage, the CP
        exchange (normalised at cp = 1), torch.compile and the cross-entropy fusion when not given; the parameter-gather overlap
        on exactly when parameters are gathered (Megatron refuses --overlap-param-gather without
        --use-distributed-optimizer). A value of the wrong type is left for validation to refuse."""
        if not isinstance(data, dict):
            return data
        try:
            spec = framework_spec(data.get("framework", Framework.MEGATRON))
        except (KeyError, TypeError):
            return data  # an unknown framework: the field's validation names the choices
        out = dict(data)
        if out.get("zero") is None:
            out["zero"] = spec.default_zero
        cp = out.get("cp", 1)
        if out.get("cp_comm_type") is None or cp == 1:
            out["cp_comm_type"] = spec.default_cp_comm_type
        if out.get("torch_compile") is None:
            out["torch_compile"] = spec.default_torch_compile
        if out.get("cross_entropy_fusion") is None:
            out["cross_entropy_fusion"] = spec.default_cross_entropy_fusion
        if out.get("overlap_param_gather") is None:
            zero = out["zero"]
            out["overlap_param_gather"] = not isinstance(zero, int) or isinstance(zero, bool) or zero >= 1
        return out

    @classmethod
    def trusted(cls, **fields: Any) -> "ParallelPlan":
        """A plan from axes the search generated and checked (every value already of its validated
        type and in range: ints, enum members, a trusted Recompute), built without the validator;
        absent fields take their defaults, resolved as in validation. Equal to ParallelPlan(**fields)
        on every candidate of several search spaces (tests/test_plan_trusted.py)."""
        return cls.model_construct(**cls._resolve(fields))

    def for_framework(self, framework: str) -> "ParallelPlan":
        """The same plan for `framework`: every field kept but the ones that belong to the old one (its
        torch.compile and cross-entropy fusion choices and release profile), which take the new
        framework's defaults."""
        return self.changed(framework=framework, torch_compile=None, cross_entropy_fusion=None, framework_release=None)

    def changed(self, **changes: Any) -> "ParallelPlan":
        """This plan with `changes`, validated and resolved again (model_copy(update=...) would skip
        both: a plan moved to another framework would keep the old one's defaults unresolved)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, **changes})

    def plan_json(self) -> dict[str, Any]:
        """model_dump(mode="json") without Pydantic's serializer (so without building it): fields
        in declaration order, enums as their values, tuples as lists, recompute as a dict. Equal to
        model_dump(mode="json") on every candidate of several search spaces (tests/test_plan_trusted.py)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            out[name] = _json_value(getattr(self, name))
        return out

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1 if self.sp is None else self.sp

    @property
    def schedule(self) -> str:
        return "interleaved" if self.vpp > 1 else "1f1b"

    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    def dp_for(self, num_gpus: int) -> int:
        return num_gpus // self.model_parallel_size()

    def num_microbatches(self, num_gpus: int) -> int:
        return self.global_batch // (self.dp_for(num_gpus) * self.mbs)

    def layout(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        return "·".join(parts)


def _json_value(v: Any) -> Any:
    """One field value as model_dump(mode="json") writes it (the types ParallelPlan's fields hold)."""
    if isinstance(v, Recompute):
        return {"mode": v.mode.value, "modules": list(v.modules), "num_layers": v.num_layers}
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, Enum):
        return v.value
    return v


def plan_violations(plan: ParallelPlan, num_gpus: int, num_layers: int, num_heads: int, num_kv_heads: int,
                    num_experts: int = 0, gpus_per_node: int | None = None, mixer_heads: int = 0,
                    mamba_heads: int = 0, cp_blocker: str = "", max_window: int = 0) -> list[str]:
    """Every broken invariant of `plan`, each naming all its factors and the fix. Empty = valid.
    The rules are declared once, in autopar.schema.rules, with the fields each reads. The mixer
    counts come from ModelSpec.mixer_counts()."""
    return violations(Context(num_gpus, num_layers, num_heads, num_kv_heads, num_experts, gpus_per_node,
                              mixer_heads, mamba_heads, cp_blocker, max_window), plan)


_INT_AXES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero")


def parse_assignments(text: str, what: str = "--fix") -> dict[str, Any]:
    """'tp=8,pp=16,mbs=1,recompute=full,sp=on' -> typed dict, with one-line errors. An axis given
    twice is refused (not "the last wins")."""
    out: dict[str, Any] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise InvalidPlanError(f"{what} entry {clip_repr(part)} must look like axis=value, e.g. tp=8")
        if key in out:
            raise InvalidPlanError(f"{what} gives {clip(key)} twice; give each axis once")
        if key in _INT_AXES:
            if not (value.isascii() and value.isdigit()):
                raise InvalidPlanError(f"{what} {key}={clip_repr(value)}: the value must be a whole number")
            lowest = 0 if key == "zero" else 1
            highest = {"zero": 3, "vpp": MAX_LAYERS, "mbs": MAX_GLOBAL_BATCH}.get(key, MAX_GPUS)
            if len(value.lstrip("0")) > 18 or not lowest <= int(value) <= highest:  # no 5,000-digit conversion
                raise InvalidPlanError(f"{what} {key}={clip(value)}: {key} must be from {lowest} to {highest:,}")
            out[key] = int(value)
        elif key == "sp":
            if value.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise InvalidPlanError(f"{what} sp={clip_repr(value)}: use sp=on or sp=off")
            out[key] = value.lower() in ("on", "true", "1")
        elif key == "recompute":
            out[key] = value
        else:
            raise InvalidPlanError(f"{what} names unknown axis {clip_repr(key)}; axes are {', '.join(_INT_AXES)}, sp, "
                                   "recompute")
    return out


def check_plan(plan: ParallelPlan, **kwargs) -> None:
    """Raise InvalidPlanError listing every violation (see plan_violations)."""
    problems = plan_violations(plan, **kwargs)
    if problems:
        raise InvalidPlanError("invalid plan: " + "; ".join(problems))
