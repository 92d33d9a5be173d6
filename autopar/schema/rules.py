"""The plan rules, each declared once: the plan fields it reads, the predicate, and the message
naming every factor and the fix. From this one table come
- autopar.schema.plan.plan_violations: every failing rule's message (for a user's plan);
- autopar.search.space.draft_is_valid: the same verdict without the messages (for a draft);
- autopar.search.space's loop-level pruning: each rule is checked at the loop of the deepest axis it
  reads (`rules_by_level`), so a failing rule skips the whole subtree; a rule of one axis (with the
  loops' constants) filters that axis's options once.
tests/test_space_fastpath.py checks the three agree on every base of several spaces.

A rule reads the plan (anything with its fields and derived properties: a ParallelPlan, the search's
Draft or its bindings) and the context `c` (Context: the model's and cluster's numbers). The first
rule is a gate: when tp·pp·cp does not divide the GPUs, nothing else is checked (dp is undefined).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from autopar.frameworks import framework_spec


class Context(NamedTuple):
    """What the rules read besides the plan: the model's and cluster's numbers."""

    num_gpus: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int = 0
    gpus_per_node: int | None = None  # GPUs of the scale-up domain the job fills (NVLink / xGMI), not the host
    # The recurrent mixers (ModelSpec.mixer_counts): the gcd of the Mamba / linear-attention head
    # and group counts tp must divide, the Mamba heads cp splits after tp, the mixer cp cannot split.
    mixer_heads: int = 0
    mamba_heads: int = 0
    cp_blocker: str = ""
    max_window: int = 0  # the longest attention window or chunk (0: none), which the sequence must cover


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    axes: tuple[str, ...]  # the plan fields the predicate reads
    ok: Callable[[Context, Any], bool]
    message: Callable[[Context, Any], str]


def _dp(c: Context, p) -> int:
    return c.num_gpus // (p.tp * p.pp * p.cp)


def _batch_ok(c: Context, p) -> bool:
    return p.global_batch % (_dp(c, p) * p.mbs) == 0


def _expert_tp(p) -> int:
    return p.etp if p.etp is not None else p.tp


def _sp(p) -> bool:
    return p.tp > 1 if p.sp is None else p.sp


def _missing_axes(p) -> list[tuple[str, str]]:
    spec = framework_spec(p.framework)
    return [(axis, what) for axis, what, offered in (
        ("cp", "context parallelism", spec.cp_comm_types), ("ep", "expert parallelism", spec.offers_ep),
        ("vpp", "interleaved pipeline", spec.offers_interleaving)) if getattr(p, axis) > 1 and not offered]


def _kernels(framework: str) -> str:
    kind = framework_spec(framework).profile.elementwise
    return {"fused": "fused kernels", "eager": "the Hugging Face model's eager code"}.get(kind, "its own kernels")


GATE = Rule(
    "degrees divide the GPUs", ("tp", "pp", "cp"),
    lambda c, p: c.num_gpus % (p.tp * p.pp * p.cp) == 0,
    lambda c, p: f"tp·pp·cp = {p.tp}·{p.pp}·{p.cp} = {p.tp * p.pp * p.cp} does not divide {c.num_gpus} GPUs; "
                 "pick degrees whose product divides the GPU count")

RULES: tuple[Rule, ...] = (
    GATE,
    Rule("tp divides the heads", ("tp",),
         lambda c, p: c.num_heads % p.tp == 0 and c.num_kv_heads % p.tp == 0,
         lambda c, p: f"tp {p.tp} must divide the {c.num_heads} attention heads and the {c.num_kv_heads} kv heads "
                      "(Megatron: num_query_groups % tp == 0); use a tp that divides both"),
    Rule("tp divides the mixer heads", ("tp",), lambda c, p: not c.mixer_heads or c.mixer_heads % p.tp == 0,
         lambda c, p: f"tp {p.tp} must divide the Mamba-2 / linear-attention head and group counts (their gcd is "
                      f"{c.mixer_heads}; Megatron splits heads and groups over tp); use a tp that divides "
                      f"{c.mixer_heads}"),
    Rule("cp splits the mixers", ("cp", "tp"),
         lambda c, p: p.cp == 1 or (not c.cp_blocker and (c.mamba_heads // p.tp) % p.cp == 0),
         lambda c, p: (f"cp {p.cp}: no framework here splits {c.cp_blocker} layers over the sequence; use cp 1"
                       if c.cp_blocker else
                       f"cp {p.cp} must divide the {c.mamba_heads} Mamba-2 heads / tp {p.tp} = "
                       f"{c.mamba_heads // p.tp} (Megatron's Mamba CP all-to-alls heads over cp); use a cp that "
                       "divides them or cp 1")),
    Rule("the sequence covers the window", ("seq_len",), lambda c, p: p.seq_len >= c.max_window,
         lambda c, p: f"sequence length {p.seq_len} is shorter than the model's {c.max_window}-token attention "
                      "window or chunk, which then is full attention; train at a longer sequence or describe those "
                      "layers as full attention (layer_pattern A)"),
    Rule("dp·mbs divides the batch", ("tp", "pp", "cp", "mbs", "global_batch"), _batch_ok,
         lambda c, p: f"global batch {p.global_batch} is not divisible by dp·mbs = {_dp(c, p)}·{p.mbs} = "
                      f"{_dp(c, p) * p.mbs}; change the global batch, the micro batch or the degrees"),
    Rule("vpp needs pp", ("pp", "vpp"), lambda c, p: not (p.vpp > 1 and p.pp == 1),
         lambda c, p: f"vpp {p.vpp} needs pp > 1 (interleaving splits each pipeline rank); set vpp 1 or pp > 1"),
    Rule("even layer split", ("pp", "vpp", "framework"),
         lambda c, p: not (c.num_layers % (p.pp * p.vpp) and framework_spec(p.framework).even_layer_split),
         lambda c, p: f"{c.num_layers} layers do not split evenly over pp·vpp = {p.pp}·{p.vpp}; "
                      f"{p.framework} needs an even split"),
    Rule("layers_per_stage", ("layers_per_stage", "pp", "vpp"),
         lambda c, p: p.layers_per_stage is None or (len(p.layers_per_stage) == p.pp * p.vpp
                                                     and sum(p.layers_per_stage) == c.num_layers),
         lambda c, p: f"layers_per_stage {list(p.layers_per_stage)} must have pp·vpp = {p.pp * p.vpp} "
                      f"entries summing to the {c.num_layers} layers; fix the list or drop it"),
    Rule("a layer per stage", ("pp", "vpp"), lambda c, p: c.num_layers >= p.pp * p.vpp,
         lambda c, p: f"{c.num_layers} layers are fewer than pp·vpp = {p.pp * p.vpp} stages; lower pp or vpp"),
    Rule("interleaved microbatches", ("tp", "pp", "cp", "mbs", "vpp", "global_batch"),
         lambda c, p: not (p.vpp > 1 and _batch_ok(c, p) and (p.global_batch // (_dp(c, p) * p.mbs)) % p.pp),
         lambda c, p: f"interleaving needs the number of microbatches ({p.global_batch // (_dp(c, p) * p.mbs)}) "
                      f"to be a multiple of pp ({p.pp}); change the global batch or use vpp 1"),
    Rule("sp needs tp", ("sp", "tp"), lambda c, p: not (p.sp is True and p.tp == 1),
         lambda c, p: "sequence parallelism needs tp > 1 (Megatron ignores --sequence-parallel at tp 1); drop --sp"),
    Rule("tp overlap needs sp", ("tp_comm_overlap", "sp", "tp"), lambda c, p: not p.tp_comm_overlap or _sp(p),
         lambda c, p: "tp communication overlap needs sequence parallelism (Megatron: --tp-comm-overlap needs "
                      "--sequence-parallel); enable sp or drop the overlap"),
    Rule("a2a heads over cp", ("cp", "cp_comm_type", "tp"),
         lambda c, p: not (p.cp > 1 and p.cp_comm_type == "a2a" and (c.num_kv_heads // max(p.tp, 1)) % p.cp),
         lambda c, p: f"cp_comm_type a2a scatters heads over cp: the {c.num_kv_heads} kv heads / tp {p.tp} are not "
                      f"divisible by cp {p.cp}; use p2p or allgather, or a cp that divides them"),
    Rule("sequence over 2·cp", ("cp", "seq_len"), lambda c, p: not (p.cp > 1 and p.seq_len % (2 * p.cp)),
         lambda c, p: f"sequence length {p.seq_len} must be divisible by 2·cp = {2 * p.cp} "
                      "(causal load balancing); change cp or the sequence length"),
    Rule("experts need an MoE", ("ep", "etp", "tp"),
         lambda c, p: bool(c.num_experts) or not (p.ep > 1 or (p.etp is not None and p.etp != p.tp)),
         lambda c, p: "ep/etp are for MoE models; this model is dense, so set ep 1 and leave etp unset"),
    Rule("ep divides the experts", ("ep",), lambda c, p: not c.num_experts or c.num_experts % p.ep == 0,
         lambda c, p: f"ep {p.ep} does not divide the {c.num_experts} experts; use a divisor of {c.num_experts}"),
    Rule("expert degrees divide the GPUs", ("etp", "tp", "ep", "pp"),
         lambda c, p: not c.num_experts or c.num_gpus % (_expert_tp(p) * p.ep * p.pp) == 0,
         lambda c, p: f"etp·ep·pp = {_expert_tp(p)}·{p.ep}·{p.pp} = {_expert_tp(p) * p.ep * p.pp} does not divide "
                      f"{c.num_gpus} GPUs (Megatron's expert data-parallel group); change ep or etp"),
    Rule("ZeRO stage offered", ("zero", "framework"), lambda c, p: p.zero in framework_spec(p.framework).zero_stages,
         lambda c, p: f"zero {p.zero} is not available in {p.framework} (it supports "
                      f"{framework_spec(p.framework).zero_stages}); pick one of those"),
    Rule("shard size divides dp", ("zero_shard_size", "tp", "pp", "cp"),
         lambda c, p: p.zero_shard_size is None or (p.zero_shard_size <= _dp(c, p)
                                                    and _dp(c, p) % p.zero_shard_size == 0),
         lambda c, p: f"zero shard size {p.zero_shard_size} must divide dp {_dp(c, p)}; pick a divisor of {_dp(c, p)}"),
    Rule("precision the framework offers", ("precision", "framework"),
         lambda c, p: str(p.precision) in ("bf16", "fp8") or str(p.precision) in framework_spec(p.framework).block_scaled_precisions,
         lambda c, p: f"{p.framework} has no {p.precision} training recipe (it offers "
                      f"{', '.join(('bf16', 'fp8') + framework_spec(p.framework).block_scaled_precisions)}); use one of "
                      "those" + ("" if p.framework == "megatron" else ", or megatron for mxfp8 and nvfp4")),
    Rule("axes the framework offers", ("cp", "ep", "vpp", "framework"), lambda c, p: not _missing_axes(p),
         lambda c, p: f"{p.framework}'s engine has no {' or '.join(w for _, w in _missing_axes(p))}; use megatron "
                      f"or set {', '.join(a for a, _ in _missing_axes(p))} to 1"),
    Rule("ZeRO with pipeline", ("pp", "zero", "framework"),
         lambda c, p: (framework_spec(p.framework).max_zero_with_pp is None or p.pp == 1
                       or p.zero <= framework_spec(p.framework).max_zero_with_pp),
         lambda c, p: f"{p.framework} pipeline parallelism works only with zero " + " or ".join(
             str(z) for z in framework_spec(p.framework).zero_stages
             if z <= framework_spec(p.framework).max_zero_with_pp) + "; lower zero or set pp 1"),
    Rule("bf16 gradient reduce", ("grad_reduce_in_bf16", "framework"),
         lambda c, p: not p.grad_reduce_in_bf16 or framework_spec(p.framework).grad_reduce_in_bf16_settable,
         lambda c, p: f"grad_reduce_in_bf16 is Megatron's --grad-reduce-in-bf16; {p.framework} sets its gradient "
                      "dtype itself, so turn grad_reduce_in_bf16 off"),
    Rule("attention backend", ("attention_backend", "framework"),
         lambda c, p: p.attention_backend == "auto" or framework_spec(p.framework).attention_backend_settable,
         lambda c, p: f"attention_backend is Megatron's --attention-backend; {p.framework} picks its own attention "
                      "kernel, so leave attention_backend auto"),
    # Transformer Engine's get_attention_backend (dot_product_attention/utils.py, TE 2.x): "Disabling
    # UnfusedDotProductAttention as it does not support context parallelism".
    Rule("unfused attention without cp", ("attention_backend", "cp"),
         lambda c, p: p.attention_backend != "unfused" or p.cp == 1,
         lambda c, p: f"attention_backend unfused: Transformer Engine's unfused attention has no context "
                      f"parallelism (cp {p.cp}); set cp 1 or attention_backend auto"),
    Rule("sequential experts", ("moe_grouped_gemm", "framework"),
         lambda c, p: p.moe_grouped_gemm or framework_spec(p.framework).sequential_experts_settable,
         lambda c, p: f"moe_grouped_gemm is Megatron's --moe-grouped-gemm; {p.framework} always groups its experts' "
                      "GEMMs, so leave moe_grouped_gemm on"),
    Rule("padding needs a capacity", ("moe_pad_to_capacity", "moe_capacity_factor"),
         lambda c, p: not p.moe_pad_to_capacity or p.moe_capacity_factor is not None,
         lambda c, p: "moe_pad_to_capacity pads each expert's input to its capacity, so it needs moe_capacity_factor "
                      "(Megatron: 'moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity'); "
                      "set a capacity factor or drop the padding"),
    Rule("shared-expert overlap is Megatron's", ("moe_shared_expert_overlap", "framework"),
         lambda c, p: not p.moe_shared_expert_overlap or framework_spec(p.framework).shared_expert_overlap_settable,
         lambda c, p: f"moe_shared_expert_overlap is Megatron's --moe-shared-expert-overlap; {p.framework} runs its "
                      "shared experts in line, so turn moe_shared_expert_overlap off"),
    Rule("shared-expert overlap needs alltoall", ("moe_shared_expert_overlap", "moe_dispatcher", "recompute"),
         lambda c, p: not p.moe_shared_expert_overlap or (
             p.moe_dispatcher == "alltoall"
             and not (p.recompute.mode == "selective" and "shared_experts" in p.recompute.modules)),
         lambda c, p: "moe_shared_expert_overlap needs the alltoall dispatcher and no shared_experts recompute "
                      "(Megatron: 'moe_shared_expert_overlap only works with alltoall token dispatcher', "
                      "'shared_experts recompute cannot work with --moe-shared-expert-overlap'); drop the overlap, "
                      "or use alltoall and leave shared_experts out of the recomputed modules"),
    Rule("flex dispatcher is Megatron's", ("moe_dispatcher", "framework"),
         lambda c, p: p.moe_dispatcher != "flex" or framework_spec(p.framework).flex_dispatcher,
         lambda c, p: f"moe_dispatcher flex is Megatron's flex token dispatcher on DeepEP; {p.framework} has no "
                      "DeepEP dispatch, so use moe_dispatcher alltoall"),
    Rule("flex dispatcher needs an expert group", ("moe_dispatcher", "ep", "etp", "tp"),
         lambda c, p: p.moe_dispatcher != "flex" or not c.num_experts or p.ep * _expert_tp(p) > 1,
         lambda c, p: "the flex dispatcher sends tokens over the etp·ep group (Megatron: 'Flex token dispatcher "
                      "requires TPxEP > 1'); raise ep (or etp) above 1, or use moe_dispatcher alltoall"),
    Rule("flex dispatcher has no padding", ("moe_dispatcher", "moe_pad_to_capacity"),
         lambda c, p: p.moe_dispatcher != "flex" or not p.moe_pad_to_capacity,
         lambda c, p: "Megatron: 'Flex token dispatcher with deepep backend does not support "
                      "moe_pad_expert_input_to_capacity'; drop moe_pad_to_capacity or use moe_dispatcher alltoall"),
    Rule("moe_act needs grouped GEMM", ("moe_grouped_gemm", "recompute"),
         lambda c, p: p.moe_grouped_gemm or not (p.recompute.mode == "selective" and "moe_act" in p.recompute.modules),
         lambda c, p: "Megatron recomputes moe_act only with --moe-grouped-gemm; turn moe_grouped_gemm on or drop "
                      "moe_act"),
    Rule("cross-entropy fusion is Megatron's", ("cross_entropy_fusion", "framework"),
         lambda c, p: p.cross_entropy_fusion is None or framework_spec(p.framework).default_cross_entropy_fusion is not None,
         lambda c, p: f"cross_entropy_fusion is Megatron's --cross-entropy-loss-fusion; {p.framework} computes its "
                      "loss its own way, so leave cross_entropy_fusion unset"),
    Rule("torch.compile is torchtitan's", ("torch_compile", "framework"),
         lambda c, p: p.torch_compile is None or framework_spec(p.framework).default_torch_compile is not None,
         lambda c, p: f"torch_compile is torchtitan's --compile.enable; {p.framework} runs {_kernels(p.framework)} "
                      "whatever it says, so leave torch_compile unset (drop --torch-compile / --no-torch-compile)"),
    Rule("compiled async TP and fp8", ("torch_compile", "tp_comm_overlap", "precision", "framework"),
         lambda c, p: not (p.torch_compile is False and (p.tp_comm_overlap or p.precision != "bf16")),
         lambda c, p: f"{p.framework}'s async TP and float8 linears are priced compiled only (async TP is a compile "
                      "pass; float8's casts are fused by it); turn torch_compile on (drop --no-torch-compile) or drop "
                      "tp_comm_overlap and fp8"),
    Rule("release profile", ("framework_release", "framework"),
         lambda c, p: p.framework_release is None or p.framework_release in framework_spec(p.framework).release_names,
         lambda c, p: f"{p.framework} has no release profile {p.framework_release!r} (it has "
                      f"{', '.join(framework_spec(p.framework).release_names) or 'none'}); leave framework_release "
                      "unset"),
    Rule("tp within the scale-up domain", ("tp",), lambda c, p: not (c.gpus_per_node and p.tp > c.gpus_per_node),
         lambda c, p: f"tp {p.tp} exceeds the {c.gpus_per_node} GPUs of the scale-up domain; tensor parallelism "
                      f"must stay inside it (tp <= {c.gpus_per_node})"),
)


def violations(c: Context, p) -> list[str]:
    """Every failing rule's message, in declaration order (only the gate's when it fails)."""
    if not GATE.ok(c, p):
        return [GATE.message(c, p)]
    return [r.message(c, p) for r in RULES[1:] if not r.ok(c, p)]


def is_valid(c: Context, p) -> bool:
    """`not violations(c, p)` without building a message."""
    return all(r.ok(c, p) for r in RULES)


def rules_by_level(levels: dict[str, int], rules: tuple[Rule, ...] = RULES) -> dict[int, tuple[Rule, ...]]:
    """Each rule under the deepest level (by `levels`, axis -> loop depth) of the axes it reads; an
    axis not in `levels` is a constant of the loops, at level -1. Declaration order within a level
    (the gate first)."""
    out: dict[int, list[Rule]] = {}
    for r in rules:
        out.setdefault(max((levels.get(a, -1) for a in r.axes), default=-1), []).append(r)
    return {k: tuple(v) for k, v in out.items()}
