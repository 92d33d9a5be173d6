"""The search space: small generators of valid degrees, a filter through the one plan validator
(autopar.schema.plan.plan_violations), and a flat list of candidate plans.

Axes and what each generator allows (Megatron-LM conventions, Narayanan et al. SC'21 §3):
  tp   divisors of gcd(heads, kv heads) that fit in one node (≤ max_tp when given)
  pp   divisors of the GPU count with pp ≤ decoder layers
  cp   divisors of the GPU count with seq_len % (2·cp) == 0 (causal load balancing), ≥ 1024 tokens a rank
  dp   derived: gpus / (tp·pp·cp), and it must divide the global batch
  ep   divisors of the expert count (MoE only) with etp·ep·pp dividing the GPU count
  etp  tp or 1 (MoE only; None = tp)
  vpp  1, or v ≥ 2 with pp·v ≤ layers, microbatches % pp == 0 and an even split (see vpp_options)
  mbs  divisors of global_batch / dp
  zero the stages the framework searches (its FrameworkSpec, autopar.frameworks)
  sp   on when tp > 1 (Megatron's MoE and TP-overlap need it; it never costs memory)
  recompute  none, selective(core_attn), full (all layers); the ILP refines full(K)

`fix` pins axes by the CLI's names (tp pp dp cp ep etp vpp mbs zero sp recompute); a pinned value
that the generators would not produce is still tried, so the validator says why it is invalid.
Precision and the framework are the user's choice and are not searched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from autopar.cost.step import DEFAULT_MEMORY_MARGIN  # noqa: F401 (re-exported: the one margin)
from autopar.errors import InvalidPlanError, NoFeasiblePlanError
from autopar.limits import MAX_EXPERTS, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_HEADS, MAX_SEQ_LEN, clip
from autopar.frameworks import framework_spec, model_refusals, plan_refusals
from autopar.frameworks.base import no_plan_refusals
from autopar.schema.plan import Framework, ParallelPlan, Precision, Recompute, RecomputeMode, plan_violations
from autopar.schema.rules import Context, is_valid, rules_by_level

AXES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "sp", "recompute")
RECOMPUTE_CHOICES = {
    RecomputeMode.NONE: Recompute.trusted(RecomputeMode.NONE),
    RecomputeMode.SELECTIVE: Recompute.trusted(RecomputeMode.SELECTIVE, ("core_attn",)),
    RecomputeMode.FULL: Recompute.trusted(RecomputeMode.FULL),
}
# Ring attention hides its K/V exchange behind attention only when each rank keeps enough of the
# sequence (Liu et al. 2023); Llama 3 ran cp16 at 131k tokens, 8k per rank. Below 1k per rank the
# exchange dominates, so such cp are not generated (a pinned cp is still tried).
MIN_TOKENS_PER_CP_RANK = 1024
# A space with more raw plans than this is refused before any plan is built (count_raw_candidates), so
# a search's time and memory are bounded by construction. Above the largest realistic space: Kimi K2
# (384 experts) on 18,432 GB200 at 131,072 tokens and 73,728 sequences has 2,795,418 raw plans, and its
# search takes about 10 s and under 450 MiB on one core (benchmarks/search_speed.py); MoE models on a few
# hundred GPUs have 200,000-650,000 (Llama 4 Maverick on 576 GB200 at 1,152 sequences: 319,932). Only
# inputs nobody runs go past it (Kimi K2 on 147,456 GB200 at 332,640 sequences of 1M tokens: 9,952,128).
MAX_RAW_CANDIDATES = 3_000_000
_MAX_DIVISOR_INPUT = max(MAX_GPUS, MAX_GLOBAL_BATCH, MAX_SEQ_LEN, MAX_EXPERTS, MAX_HEADS)


@dataclass(frozen=True)
class SpaceSpec:
    """Everything the generators read: model shape, cluster shape, batch, and user constraints."""

    num_gpus: int
    gpus_per_node: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int
    seq_len: int
    global_batch: int
    framework: Framework = Framework.MEGATRON
    precision: Precision = Precision.BF16
    fix: dict[str, Any] = field(default_factory=dict)
    max_tp: int | None = None
    model_spec: Any = None  # the ModelSpec, for the target framework's expressibility rules

    def validator_kwargs(self) -> dict[str, int]:
        mixers = self.model_spec.mixer_counts() if self.model_spec is not None else {}
        return dict(num_gpus=self.num_gpus, num_layers=self.num_layers, num_heads=self.num_heads,
                    num_kv_heads=self.num_kv_heads, num_experts=self.num_experts, gpus_per_node=self.gpus_per_node,
                    **mixers)


def space_spec_for(graph, cluster, seq_len: int, global_batch: int, *, framework: str = Framework.MEGATRON,
                   precision: str = Precision.BF16, fix: dict | None = None, max_tp: int | None = None) -> SpaceSpec:
    from autopar.cost.layout import precision_violations

    problems = precision_violations(precision, cluster)
    if problems:
        raise InvalidPlanError("; ".join(problems))
    s = graph.spec
    # gpus_per_node: the scale-up domain the job fills (Cluster.scale_up_gpus), which bounds tp (the rule
    # "tp within the scale-up domain"); the host for a plain node
    return SpaceSpec(num_gpus=cluster.num_gpus, gpus_per_node=cluster.scale_up_gpus, num_layers=s.num_layers,
                     num_heads=s.num_attention_heads, num_kv_heads=s.kv_heads,
                     num_experts=s.moe.num_experts if s.moe else 0, seq_len=seq_len, global_batch=global_batch,
                     framework=Framework(framework), precision=Precision(precision), fix=normalize_fix(fix or {}), max_tp=max_tp,
                     model_spec=s)


def normalize_fix(fix: dict[str, Any]) -> dict[str, Any]:
    """Check axis names and turn a recompute string into a Recompute."""
    unknown = sorted(set(fix) - set(AXES))
    if unknown:
        raise InvalidPlanError(f"cannot fix unknown axis {', '.join(unknown)}; fixable axes are {', '.join(AXES)}")
    out = dict(fix)
    r = out.get("recompute")
    if isinstance(r, str):
        if r not in RECOMPUTE_CHOICES:
            raise InvalidPlanError(f"recompute {r!r} is not one of {', '.join(RECOMPUTE_CHOICES)}; pick one of those")
        out["recompute"] = RECOMPUTE_CHOICES[r]
    return out


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending. n is capped (autopar.limits) so the loop to √n is bounded."""
    if not 1 <= n <= _MAX_DIVISOR_INPUT:
        raise InvalidPlanError(f"{clip(n)} is outside 1..{_MAX_DIVISOR_INPUT:,}; use a smaller GPU count, batch or "
                               "sequence length")
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pinned(spec: SpaceSpec, axis: str, options: list) -> list:
    """The generator's options, or just the pinned value when the user fixed this axis."""
    return [spec.fix[axis]] if axis in spec.fix else options


def tp_options(spec: SpaceSpec) -> list[int]:
    if not framework_spec(spec.framework).offers_tp:
        return _pinned(spec, "tp", [1])
    cap = min(spec.gpus_per_node, spec.max_tp or spec.gpus_per_node)
    heads = math.gcd(spec.num_heads, spec.num_kv_heads)
    return _pinned(spec, "tp", [d for d in divisors(heads) if d <= cap and spec.num_gpus % d == 0])


def pp_options(spec: SpaceSpec) -> list[int]:
    return _pinned(spec, "pp", [d for d in divisors(spec.num_gpus) if d <= spec.num_layers])


def cp_options(spec: SpaceSpec) -> list[int]:
    """cp = 1, or divisors with seq_len % (2·cp) == 0 that leave each CP rank ≥ MIN_TOKENS_PER_CP_RANK."""
    if not framework_spec(spec.framework).cp_comm_types:
        return _pinned(spec, "cp", [1])
    return _pinned(spec, "cp", [d for d in divisors(spec.num_gpus) if d == 1 or (
        spec.seq_len % (2 * d) == 0 and spec.seq_len // d >= MIN_TOKENS_PER_CP_RANK)])


def ep_options(spec: SpaceSpec, tp: int, pp: int) -> list[int]:
    if not spec.num_experts or not framework_spec(spec.framework).offers_ep:
        return _pinned(spec, "ep", [1])
    return _pinned(spec, "ep", [e for e in divisors(spec.num_experts) if spec.num_gpus % (e * pp) == 0])


def etp_options(spec: SpaceSpec, tp: int) -> list[int | None]:
    if not spec.num_experts or tp == 1:
        return _pinned(spec, "etp", [None])
    return _pinned(spec, "etp", [None, 1])


def mbs_options(spec: SpaceSpec, dp: int) -> list[int]:
    if spec.global_batch % dp:
        return _pinned(spec, "mbs", [])
    return _pinned(spec, "mbs", divisors(spec.global_batch // dp))


def vpp_options(spec: SpaceSpec, pp: int, num_microbatches: int) -> list[int]:
    """1, and interleaving degrees v ≥ 2 whose pp·v virtual stages split the layers evenly except
    that the first and/or last stage (embedding, head) may hold one layer fewer — Llama 3's 405B
    balancing (Dubey et al. 2024 §3.3.2). Other v give uneven middle stages and are left out."""
    out = [1]
    if pp > 1 and num_microbatches % pp == 0 and framework_spec(spec.framework).offers_interleaving:
        layers = spec.num_layers
        out += [v for v in range(2, layers // pp + 1) if any((layers + k) % (pp * v) == 0 for k in (0, 1, 2))]
    return _pinned(spec, "vpp", out)


def zero_options(spec: SpaceSpec) -> list[int]:
    """Every ZeRO stage the framework has, except Megatron-FSDP's optim_grads_params (Megatron zero
    3), searched only when pinned (--fix zero=3): the time bound leaves out its per-microbatch
    parameter re-gather, so it multiplied the plans the search scores (about 5x on Llama 3.1 405B,
    16,384 GPUs) while zero 2 (optim_grads: gradients sharded at the distributed optimizer's
    communication) wins the benchmark cases."""
    return _pinned(spec, "zero", list(framework_spec(spec.framework).searched_zero_stages))


def sp_options(spec: SpaceSpec, tp: int) -> list[bool | None]:
    return _pinned(spec, "sp", [None])  # None = on when tp > 1


def recompute_options(spec: SpaceSpec) -> list[Recompute]:
    return _pinned(spec, "recompute", list(RECOMPUTE_CHOICES.values()))


def model_parallel_degrees(spec: SpaceSpec) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) with tp·pp·cp·dp = gpus and dp dividing the global batch."""
    for tp in tp_options(spec):
        for pp in pp_options(spec):
            for cp in cp_options(spec):
                mp = tp * pp * cp
                if spec.num_gpus % mp:
                    continue
                dp = spec.num_gpus // mp
                if "dp" in spec.fix and spec.fix["dp"] != dp:
                    continue
                if spec.global_batch % dp and "mbs" not in spec.fix:
                    continue
                yield tp, pp, cp, dp


_PLAN_ATTRS = vars(ParallelPlan)


class Draft(NamedTuple):
    """A candidate before it becomes a ParallelPlan: the searched axes and the spec's constants,
    with ParallelPlan's own derived properties (borrowed, not re-implemented), so the one plan
    validator and the search's bounds read it as they read a plan. Building a validated Pydantic
    plan costs ~20 µs; the search makes one only for the candidates it visits (`to_plan`)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int | None
    vpp: int
    mbs: int
    zero: int
    sp: bool | None
    recompute: Recompute
    global_batch: int
    seq_len: int
    precision: str
    framework: str
    cp_comm_type: str
    # Fields the generators leave at ParallelPlan's defaults (class attributes, not tuple fields).
    zero_shard_size = None
    layers_per_stage = None
    tp_comm_overlap = False
    framework_release = None  # the search plans for current framework releases
    grad_reduce_in_bf16 = False
    overlap_grad_reduce = ParallelPlan.model_fields["overlap_grad_reduce"].default
    moe_dispatcher = ParallelPlan.model_fields["moe_dispatcher"].default
    attention_backend = ParallelPlan.model_fields["attention_backend"].default
    moe_load_imbalance = ParallelPlan.model_fields["moe_load_imbalance"].default
    moe_capacity_factor = ParallelPlan.model_fields["moe_capacity_factor"].default
    moe_pad_to_capacity = ParallelPlan.model_fields["moe_pad_to_capacity"].default
    moe_shared_expert_overlap = ParallelPlan.model_fields["moe_shared_expert_overlap"].default
    moe_grouped_gemm = True  # what autopar exports (--moe-grouped-gemm)

    expert_tp = _PLAN_ATTRS["expert_tp"]
    sequence_parallel = _PLAN_ATTRS["sequence_parallel"]
    schedule = _PLAN_ATTRS["schedule"]
    model_parallel_size = _PLAN_ATTRS["model_parallel_size"]
    dp_for = _PLAN_ATTRS["dp_for"]
    num_microbatches = _PLAN_ATTRS["num_microbatches"]
    layout = _PLAN_ATTRS["layout"]

    @property
    def torch_compile(self) -> bool | None:
        """ParallelPlan's resolution: the framework's default (compiled torchtitan, None elsewhere)."""
        return framework_spec(self.framework).default_torch_compile

    @property
    def cross_entropy_fusion(self) -> bool | None:
        """ParallelPlan's resolution: the framework's default (fused in Megatron, None elsewhere)."""
        return framework_spec(self.framework).default_cross_entropy_fusion

    @property
    def overlap_param_gather(self) -> bool:
        """ParallelPlan's resolution (_resolve): on with ZeRO ≥ 1 (tests/test_search_speed.py)."""
        return self.zero >= 1

    def to_plan(self) -> ParallelPlan:
        """The plan of these axes (generated by the space and checked by its rules: no validator)."""
        return ParallelPlan.trusted(**dict(zip(self._fields, self)))



# Field positions the search's hot loops read by index (driver._nest, costs.split_key and
# Pricer.layout): a reordering of Draft's fields fails here, at import, not as a wrong key.
DRAFT_AXES = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "sp")
if Draft._fields[:len(DRAFT_AXES)] != DRAFT_AXES:
    raise ImportError(f"Draft's leading fields changed: {Draft._fields}")
DRAFT_MBS, DRAFT_GLOBAL_BATCH, DRAFT_FRAMEWORK = (Draft._fields.index(name)
                                                  for name in ("mbs", "global_batch", "framework"))


def draft_is_valid(d: Draft, num_gpus: int, num_layers: int, num_heads: int, num_kv_heads: int,
                   num_experts: int = 0, gpus_per_node: int | None = None, mixer_heads: int = 0,
                   mamba_heads: int = 0, cp_blocker: str = "", max_window: int = 0) -> bool:
    """`not plan_violations(d, ...)` for a Draft, without building the messages: the same rules
    (autopar.schema.rules), read off the tuple's fields. tests/test_space_fastpath.py checks it
    against plan_violations on every base of several spaces."""
    return is_valid(Context(num_gpus, num_layers, num_heads, num_kv_heads, num_experts, gpus_per_node,
                            mixer_heads, mamba_heads, cp_blocker, max_window), d)


def as_plan(plan: ParallelPlan | Draft) -> ParallelPlan:
    return plan.to_plan() if isinstance(plan, Draft) else plan


def _recompute_free(spec: SpaceSpec) -> Iterator[Draft]:
    """One draft per combination of every axis but recompute (its rules are checked per choice,
    in valid_bases)."""
    first = recompute_options(spec)[0]
    consts = _draft_constants(spec)
    zeros = zero_options(spec)
    vpps: dict[tuple[int, int], list[int]] = {}  # (pp, microbatches) -> vpp_options
    for tp, pp, cp, dp in model_parallel_degrees(spec):
        sps = sp_options(spec, tp)
        etps = etp_options(spec, tp)
        for mbs in mbs_options(spec, dp):
            m = spec.global_batch // (dp * mbs) if dp * mbs else 0
            if (pp, m) not in vpps:
                vpps[pp, m] = vpp_options(spec, pp, m)
            for ep in ep_options(spec, tp, pp):
                for etp in etps:
                    for vpp in vpps[pp, m]:
                        for zero in zeros:
                            for sp in sps:
                                yield tuple.__new__(Draft, (tp, pp, cp, ep, etp, vpp, mbs, zero, sp, first, *consts))


def _draft_constants(spec: SpaceSpec) -> tuple:
    """The Draft fields after recompute, which the space does not vary."""
    return (spec.global_batch, spec.seq_len, spec.precision, spec.framework,
            framework_spec(spec.framework).default_cp_comm_type)


# Loop depth of each searched axis in _valid_recompute_free (dp comes with tp, pp and cp); every
# other plan field is a constant of the loops (a Draft's pinned default or the spec's).
_LEVELS = {"tp": 0, "pp": 0, "cp": 0, "mbs": 1, "ep": 2, "etp": 3, "vpp": 4, "zero": 5, "sp": 6, "recompute": 7}
_RULES_BY_LEVEL = rules_by_level(_LEVELS)


class _Bindings:
    """The axes bound so far in _valid_recompute_free's loops, with a Draft's constants, read by the
    rules as they read a plan (autopar.schema.rules). Any other plan field reads as a Draft's: its
    class constant or its property (what a Draft of these axes would say)."""

    __slots__ = ("tp", "pp", "cp", "mbs", "ep", "etp", "vpp", "zero", "sp", "recompute", "global_batch", "seq_len",
                 "precision", "framework", "cp_comm_type")

    def __init__(self, spec: SpaceSpec, recompute: Recompute) -> None:
        self.recompute = recompute
        self.global_batch, self.seq_len, self.precision, self.framework, self.cp_comm_type = _draft_constants(spec)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(Draft, name)  # AttributeError for a name that is no plan field
        return attr.fget(self) if isinstance(attr, property) else attr


def _check(rules: tuple) -> Callable[[Context, Any], bool] | None:
    """One call that is `all(r.ok(c, p) for r in rules)`; None when there is nothing to check."""
    if not rules:
        return None
    if len(rules) == 1:
        return rules[0].ok
    oks = tuple(r.ok for r in rules)

    def check(c: Context, p: Any) -> bool:
        for ok in oks:
            if not ok(c, p):
                return False
        return True
    return check


def _only_axis(rule, axis: str) -> bool:
    """Whether `axis` is the one searched axis `rule` reads (the rest are the loops' constants)."""
    return _reads_only(rule, {axis})


def _reads_only(rule, axes: set[str]) -> bool:
    """Whether the searched axes `rule` reads are among `axes` (the rest are the loops' constants)."""
    return {a for a in rule.axes if a in _LEVELS} <= axes


def _allowed(c: Context, b: "_Bindings", axis: str, options: list, rules: tuple) -> list:
    """The options of `axis` that `rules` allow with the axes bound in `b`."""
    out = []
    for value in options:
        setattr(b, axis, value)
        if all(r.ok(c, b) for r in rules):
            out.append(value)
    return out


def _valid_recompute_free(spec: SpaceSpec) -> Iterator[Draft]:
    """The drafts of _recompute_free that draft_is_valid accepts, in the same order: each rule
    (autopar.schema.rules) is checked at the loop level of the deepest axis it reads
    (_RULES_BY_LEVEL), so a failing rule skips the whole subtree instead of one check per draft
    (~57K for Qwen3-235B; tests/test_space_fastpath.py checks the two agree draft for draft). A
    rule of the pipeline shape alone filters the vpp and ZeRO options once per pp, one of tp and sp
    the sp options once per tp."""
    c = Context(**spec.validator_kwargs())
    first = recompute_options(spec)[0]
    b = _Bindings(spec, first)
    rules = _RULES_BY_LEVEL
    if not all(r.ok(c, b) for r in rules.get(-1, ())):
        return
    # Rules of the pipeline shape alone filter the interleaving and ZeRO options once per pp (with its
    # microbatch count for vpp) instead of once per draft.
    vpp_alone = tuple(r for r in rules.get(4, ()) if _reads_only(r, {"pp", "vpp"}))
    zero_alone = tuple(r for r in rules.get(5, ()) if _reads_only(r, {"pp", "zero"}))
    sp_alone = tuple(r for r in rules.get(6, ()) if _reads_only(r, {"tp", "sp"}))  # and sp once per tp
    hoisted = {*vpp_alone, *zero_alone, *sp_alone}
    at_mp, at_mbs, at_ep, at_etp, at_vpp, at_zero, at_sp = (
        _check(tuple(r for r in rules.get(level, ()) if r not in hoisted)) for level in range(7))
    consts = _draft_constants(spec)
    vpps: dict[tuple[int, int], list[int]] = {}  # (pp, microbatches) -> vpp_options the pp rules allow
    zeros_by_pp: dict[int, list[int]] = {}
    for tp, pp, cp, dp in model_parallel_degrees(spec):
        b.tp, b.pp, b.cp = tp, pp, cp
        if at_mp is not None and not at_mp(c, b):
            continue
        sps = _allowed(c, b, "sp", sp_options(spec, tp), sp_alone)
        etps = etp_options(spec, tp)
        zeros = zeros_by_pp.get(pp)
        if zeros is None:
            zeros = zeros_by_pp[pp] = _allowed(c, b, "zero", zero_options(spec), zero_alone)
        for mbs in mbs_options(spec, dp):
            m = spec.global_batch // (dp * mbs) if dp * mbs else 0
            if (pp, m) not in vpps:
                vpps[pp, m] = _allowed(c, b, "vpp", vpp_options(spec, pp, m), vpp_alone)
            b.mbs = mbs
            if at_mbs is not None and not at_mbs(c, b):
                continue
            for ep in ep_options(spec, tp, pp):
                b.ep = ep
                if at_ep is not None and not at_ep(c, b):
                    continue
                for etp in etps:
                    b.etp = etp
                    if at_etp is not None and not at_etp(c, b):
                        continue
                    for vpp in vpps[pp, m]:
                        b.vpp = vpp
                        if at_vpp is not None and not at_vpp(c, b):
                            continue
                        for zero in zeros:
                            b.zero = zero
                            if at_zero is not None and not at_zero(c, b):
                                continue
                            for sp in sps:
                                b.sp = sp
                                if at_sp is None or at_sp(c, b):
                                    yield tuple.__new__(Draft, (tp, pp, cp, ep, etp, vpp, mbs, zero, sp, first,
                                                                *consts))


def raw_candidates(spec: SpaceSpec) -> Iterator[Draft]:
    """Every combination the generators produce, before the validator (recompute innermost)."""
    options = recompute_options(spec)
    for base in _recompute_free(spec):
        yield base
        yield from _with_recompute(base, options[1:])


def _with_recompute(base: Draft, options: list[Recompute]) -> Iterator[Draft]:
    head, tail = base[:9], base[10:]  # Draft fields before and after recompute
    for r in options:
        yield tuple.__new__(Draft, (*head, r, *tail))


def count_raw_candidates(spec: SpaceSpec) -> int:
    """The number of combinations the generators produce (before the validator) without building
    one: the loops of _recompute_free × the recompute options, multiplied out over the axes that do
    not depend on the micro batch."""
    per_rest = len(zero_options(spec)) * len(recompute_options(spec))
    total = 0
    for tp, pp, cp, dp in model_parallel_degrees(spec):
        experts = sum(len(etp_options(spec, tp)) for _ in ep_options(spec, tp, pp)) * len(sp_options(spec, tp))
        for mbs in mbs_options(spec, dp):
            m = spec.global_batch // (dp * mbs) if dp * mbs else 0
            total += len(vpp_options(spec, pp, m)) * experts * per_rest
    return total


def candidates(spec: SpaceSpec) -> list[ParallelPlan]:
    """The flat list of valid candidates. When nothing is valid, raise InvalidPlanError (with
    `fix`: it quotes the validator on a pinned combination) or NoFeasiblePlanError (without)."""
    return [d.to_plan() for d in candidate_drafts(spec)]


def candidate_drafts(spec: SpaceSpec) -> list[Draft]:
    """`candidates` as Drafts (the search's form: plans are built only for what it visits)."""
    return [d for _, variants in candidate_bases(spec) for d in variants]


def candidate_bases(spec: SpaceSpec) -> list[tuple[Draft, tuple[Draft, ...]]]:
    """Each valid combination of every axis but recompute, with its valid recompute variants."""
    return [(base, tuple(with_recompute(base, r) for r in recomputes)) for base, recomputes in valid_bases(spec)]


def with_recompute(base: Draft, recompute: Recompute) -> Draft:
    """`base` with another recompute choice (valid_bases has checked the rules that read it)."""
    return base if base.recompute is recompute else tuple.__new__(Draft, (*base[:9], recompute, *base[10:]))


def valid_bases(spec: SpaceSpec) -> list[tuple[Draft, tuple[Recompute, ...]]]:
    """Each valid combination of every axis but recompute, with the recompute choices valid for it
    (`candidate_bases` without building a Draft per choice: the search builds them for the
    families it expands). A model the framework cannot train at all is refused first, before any
    plan is generated (refuse_model). The rules of recompute alone (with the loops' constants)
    filter the choices once; the rest, and the framework's refusals, per base."""
    refuse_model(spec)
    count = count_raw_candidates(spec)
    if count > MAX_RAW_CANDIDATES:
        raise InvalidPlanError(f"the search space has {count:,} candidate plans on {spec.num_gpus:,} GPUs, over the "
                               f"{MAX_RAW_CANDIDATES:,} a search takes; pin axes with --fix (e.g. mbs=1,vpp=1) or "
                               "lower --max-tp, the GPU count or the global batch")
    all_options = tuple(recompute_options(spec))
    c = Context(**spec.validator_kwargs())
    per_recompute = _RULES_BY_LEVEL.get(7, ())
    alone = tuple(r for r in per_recompute if _only_axis(r, "recompute"))
    b = _Bindings(spec, all_options[0])
    options = []
    for r in all_options:
        b.recompute = r
        if all(rule.ok(c, b) for rule in alone):
            options.append(r)
    options = tuple(options)
    rest = _check(tuple(r for r in per_recompute if r not in alone))
    fw = framework_spec(spec.framework)
    refusals = fw.plan_refusals if spec.model_spec is not None else None
    if refusals is no_plan_refusals or (refusals is not None and not fw.refuses_plans_of(spec.model_spec)):
        refusals = None  # it refuses no plan of this model (FrameworkSpec.refuses_plans_of)
    out = []
    for base in _valid_recompute_free(spec):  # draft_is_valid's verdict up to the recompute choice
        if rest is None and refusals is None:
            variants = options
        else:
            variants = tuple(r for r in options if _recompute_ok(c, spec, base, r, rest, refusals))
        if variants:
            out.append((base, variants))
    if not out:
        first_problem = _first_problem(spec, all_options)  # in enumeration order, as the error quotes it
        pinned = ", ".join(f"{k}={v.label() if isinstance(v, Recompute) else v}" for k, v in spec.fix.items())
        why = "; ".join(first_problem) if first_problem else _why_empty(spec)
        error = InvalidPlanError if pinned else NoFeasiblePlanError
        raise error(f"no valid plan on {spec.num_gpus} GPUs{' with ' + pinned if pinned else ''}: {why}")
    return out


def _recompute_ok(c: Context, spec: SpaceSpec, base: Draft, r: Recompute, check, refusals) -> bool:
    """The rules that read recompute with other axes, then the framework's refusals, for `base`
    with recompute `r`."""
    d = with_recompute(base, r)
    return (check is None or check(c, d)) and not (refusals and refusals(spec.model_spec, spec.num_gpus, d))


def refuse_model(spec: SpaceSpec) -> None:
    """NoFeasiblePlanError when the framework cannot train the model in any layout (torchtitan: no
    registry flavour has its shape, or it has MTP layers), with that reason alone."""
    if spec.model_spec is None:
        return
    reasons = model_refusals(spec.framework, spec.model_spec)
    if reasons:
        raise NoFeasiblePlanError(f"{spec.framework} cannot train {clip(spec.model_spec.name)} in any layout: "
                                  + "; ".join(reasons))


def _first_problem(spec: SpaceSpec, options: tuple[Recompute, ...]) -> list[str] | None:
    """The first refusal in enumeration order: the validator's messages for an invalid base or
    recompute choice, or the framework's refusals (None when nothing was refused)."""
    kwargs = spec.validator_kwargs()
    for base in _recompute_free(spec):
        if not draft_is_valid(base, **kwargs):
            return plan_violations(base, **kwargs)
        for r in options:
            problems = plan_problems(spec, with_recompute(base, r))
            if problems:
                return problems
    return None


def framework_problems(spec: SpaceSpec, plan) -> list[str]:
    """The target framework's refusals of `plan` (a plan or a Draft): the very function the exporters
    refuse with (autopar.frameworks.plan_refusals)."""
    if spec.model_spec is None:
        return []
    return plan_refusals(spec.model_spec, spec.num_gpus, plan)


def plan_problems(spec: SpaceSpec, plan: ParallelPlan) -> list[str]:
    """The search's whole filter for a plan it did not enumerate (the DP/ILP's refinements): the
    plan validator, then the framework's refusals (a refined full(K) torchtitan cannot run)."""
    return plan_violations(plan, **spec.validator_kwargs()) or framework_problems(spec, plan)


def _why_empty(spec: SpaceSpec) -> str:
    if "dp" in spec.fix:
        return (f"dp {spec.fix['dp']} needs tp·pp·cp = {spec.num_gpus}/{spec.fix['dp']} from the allowed degrees "
                f"and must divide the global batch {spec.global_batch}; change dp or the GPU count")
    return (f"no tp·pp·cp from tp {tp_options(spec)}, pp ≤ {spec.num_layers}, cp dividing seq/2 leaves a dp that "
            f"divides the global batch {spec.global_batch}; change the global batch or the GPU count")
