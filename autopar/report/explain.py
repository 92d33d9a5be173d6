"""Why this plan: where its step time and memory go, stage by stage, and why each neighbouring plan
loses or fails.

Per-stage step time. Every pipeline rank spends the whole step, so each rank's row sums to the
step time:

    compute + recompute + tp/cp/ep comm   its busy time, m · (fwd + bwd) per microbatch
    bubble                                 the rest of the pipeline phase: pipeline − busy
    pp_comm, dp_comm, optimizer            step-wide: every rank waits for the slowest

The bottleneck rank's row equals the Estimate's time_breakdown_s. The exposed communication of
the other ranks is not kept in the Estimate; `rank_comm_s` reprices it with the cost model's own
per-stage accounting (autopar.cost.step).

Neighbours. From the plan: tp, pp and cp ×2 / ÷2 (dp absorbs the factor: tp·pp·cp·dp stays
the GPU count), vpp ×2 / ÷2 (pipelined plans), ep and etp ×2 / ÷2 (MoE models), micro batch ×2 / ÷2, recompute one step less and more on the ladder
none < selective < full, and the adjacent ZeRO stages the framework offers. Each one is validated
(autopar.schema.plan.plan_violations) and, if valid, scored by the same `estimate`. Verdicts:

    invalid        the validator's reasons ("tp 16 exceeds the 8 GPUs of the scale-up domain")
    oom            does not fit: "OOM on stage 0 by 3.1 GiB" (usable = HBM · (1 − memory_margin))
    faster_unfit   faster, but does not fit
    slower         fits, slower: the terms that grew most ("+2.100 s exposed tp communication")
    tie            fits, same step time
    wins           fits and is faster (or fits where the chosen plan does not)

`Explanation.to_dict()` keys (stable; the JSON of `autopar explain --json`):

    model, cluster, gpus, memory_margin, bottleneck_rank
    plan                  autopar.report.records.plan_to_dict
    estimate              autopar.report.records.estimate_to_dict
    stage_time_s          [{rank, layers, compute, recompute, tp_comm, cp_comm, ep_comm, pp_comm,
                            dp_comm, bubble, optimizer, total}]           seconds per step
    stage_memory_bytes    [{rank, weights, gradients, optimizer, activations, fsdp_gathered,
                            buffers_and_fragmentation, total, usable, headroom}]   bytes per GPU
    alternatives          [{name, axis, layout, change, verdict, wins, reason, violations,
                            step_time_s, step_change, fits, peak_memory_bytes, shortfall_bytes,
                            oom_rank}]   step_change = alternative / chosen − 1; null when invalid
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autopar.cost import step as step_model
from autopar.cost.layout import check_layout, layout_violations
from autopar.cost.params import CostParams
from autopar.cost.step import DEFAULT_MEMORY_MARGIN, Estimate, estimate
from autopar.hardware import Cluster
from autopar.inputs import load_inputs
from autopar.model.graph import ModelGraph
from autopar.report.records import estimate_to_dict, plan_to_dict
from autopar.report.tables import gib, print_table, seconds
from autopar.frameworks import framework_spec
from autopar.schema.plan import Framework, ParallelPlan, Recompute, RecomputeMode

COMM_AXES = ("tp_comm", "cp_comm", "ep_comm")
STEP_WIDE = ("pp_comm", "dp_comm", "optimizer")
TIME_TERMS = ("compute", "recompute", *COMM_AXES, "pp_comm", "dp_comm", "bubble", "optimizer")
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "fsdp_gathered", "buffers_and_fragmentation")
TERM_LABELS = {
    "compute": "compute", "recompute": "recompute", "tp_comm": "exposed tp communication",
    "cp_comm": "exposed cp communication", "ep_comm": "exposed ep communication",
    "pp_comm": "pipeline p2p", "dp_comm": "exposed dp communication", "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
}
VERDICTS = ("invalid", "oom", "faster_unfit", "slower", "tie", "wins")
_TIE_REL = 1e-9  # step times this close (relative) are a tie
_RECOMPUTE_LADDER = tuple(RecomputeMode)
_SELECTIVE = Recompute(mode=RecomputeMode.SELECTIVE, modules=("core_attn",))


@dataclass(frozen=True, slots=True)
class StageTime:
    """Seconds of one step spent by one pipeline rank, by term (TIME_TERMS); sums to the step."""

    rank: int
    layers: tuple[int, ...]
    terms_s: dict[str, float]

    @property
    def total_s(self) -> float:
        return sum(self.terms_s.values())


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak bytes of one pipeline rank's GPU by term (MEMORY_TERMS) against the usable HBM."""

    rank: int
    breakdown_bytes: dict[str, float]
    total_bytes: float
    usable_bytes: float

    @property
    def headroom_bytes(self) -> float:
        return self.usable_bytes - self.total_bytes


@dataclass(frozen=True)
class Alternative:
    """One neighbouring plan and why it loses, fails or wins (verdict in VERDICTS)."""

    name: str  # e.g. "tp 8→16"
    axis: str  # tp | pp | cp | vpp | ep | etp | mbs | recompute | zero | torch_compile | moe_grouped_gemm
    plan: ParallelPlan
    verdict: str
    reason: str
    violations: tuple[str, ...] = ()
    estimate: Estimate | None = None
    shortfall_bytes: float = 0.0  # over the usable HBM on the fullest rank; 0 when it fits
    oom_rank: int | None = None

    @property
    def wins(self) -> bool:
        return self.verdict == "wins"


@dataclass(frozen=True)
class Explanation:
    model: str
    cluster: str
    gpus: int
    plan: ParallelPlan
    estimate: Estimate
    memory_margin: float
    stage_times: tuple[StageTime, ...]
    stage_memory: tuple[StageMemory, ...]
    alternatives: tuple[Alternative, ...]

    @property
    def bottleneck_rank(self) -> int:
        return max(self.estimate.stages, key=lambda s: s.fwd_s + s.bwd_s).rank

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape documented in the module docstring."""
        return {
            "model": self.model, "cluster": self.cluster, "gpus": self.gpus, "memory_margin": self.memory_margin,
            "bottleneck_rank": self.bottleneck_rank,
            "plan": plan_to_dict(self.plan, self.gpus), "estimate": estimate_to_dict(self.estimate, self.plan),
            "stage_time_s": [{"rank": s.rank, "layers": list(s.layers), **s.terms_s, "total": s.total_s}
                             for s in self.stage_times],
            "stage_memory_bytes": [{"rank": s.rank, **s.breakdown_bytes, "total": s.total_bytes,
                                    "usable": s.usable_bytes, "headroom": s.headroom_bytes}
                                   for s in self.stage_memory],
            "alternatives": [_alternative_dict(a, self.estimate) for a in self.alternatives],
        }


def _alternative_dict(a: Alternative, chosen: Estimate) -> dict[str, Any]:
    e = a.estimate
    return {
        "name": a.name, "axis": a.axis, "layout": _label(a.plan), "change": _change(a),
        "verdict": a.verdict, "wins": a.wins, "reason": a.reason, "violations": list(a.violations),
        "step_time_s": e.step_time_s if e else None,
        "step_change": e.step_time_s / chosen.step_time_s - 1.0 if e else None,
        "fits": e.fits if e else None, "peak_memory_bytes": e.peak_memory_bytes if e else None,
        "shortfall_bytes": a.shortfall_bytes, "oom_rank": a.oom_rank,
    }


def _change(a: Alternative) -> dict[str, Any]:
    p = a.plan
    value = {"tp": p.tp, "pp": p.pp, "cp": p.cp, "vpp": p.vpp, "ep": p.ep, "etp": p.expert_tp, "mbs": p.mbs,
             "zero": p.zero, "recompute": p.recompute.label(p.framework),
             "torch_compile": p.torch_compile, "moe_grouped_gemm": p.moe_grouped_gemm}[a.axis]
    return {a.axis: value}


# --------------------------------------------------------------------------- the explanation


def explain(model: str, cluster: str, gpus: int, plan: ParallelPlan, cost_model: str | None = None,
            memory_margin: float = DEFAULT_MEMORY_MARGIN) -> Explanation:
    """Explain `plan` for `model` on `gpus` GPUs of `cluster`: per-stage time and memory, and the
    verdict on every neighbouring plan. Raises InvalidPlanError when `plan` itself is invalid."""
    graph, c, p = load_inputs(model, cluster, gpus, cost_model)
    check_layout(plan, c, graph)
    est = estimate(graph, c, plan, p, memory_margin)
    usable = est.usable_memory_bytes
    return Explanation(
        model=model, cluster=cluster, gpus=gpus, plan=plan, estimate=est, memory_margin=memory_margin,
        stage_times=stage_times(est, rank_comm_s(graph, c, plan, p)),
        stage_memory=tuple(StageMemory(s.rank, {**dict.fromkeys(MEMORY_TERMS, 0.0), **s.memory_breakdown_bytes},
                                       s.memory_bytes, usable) for s in est.stages),
        alternatives=tuple(judge(graph, c, p, plan, est, name, axis, alt, memory_margin)
                           for name, axis, alt in neighbours(plan, c.num_gpus, graph.spec.num_layers,
                                                             moe=graph.spec.moe is not None)),
    )


def rank_comm_s(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, p: CostParams) -> list[dict[str, float]]:
    """Exposed tp/cp/ep communication seconds per step of each pipeline rank, by the cost model's
    own per-stage accounting (autopar.cost.step); the Estimate keeps it for the bottleneck only."""
    st = step_model.setup(graph, cluster, plan, p)
    stages = step_model.assign_layers(graph, st.layout)
    costs = step_model.layer_costs(stages, st, cluster, p, plan)
    out = []
    for chunks in step_model.rank_chunks(stages, st.layout):
        parts = [step_model.stage_time(chunk, costs, plan)[3] for chunk in chunks]
        out.append({k: st.m * sum(x[k] for x in parts) for k in COMM_AXES})
    return out


def stage_times(est: Estimate, comm_by_rank: list[dict[str, float]]) -> tuple[StageTime, ...]:
    """Each rank's step, by term: busy terms from its stage estimate, bubble = pipeline phase − busy,
    and the step-wide terms of time_breakdown_s."""
    tb = est.time_breakdown_s
    m = est.num_microbatches
    pipeline_s = est.step_time_s - sum(tb[k] for k in STEP_WIDE)
    rows = []
    for s, comm in zip(est.stages, comm_by_rank):
        busy_s = m * (s.fwd_s + s.bwd_s)
        recompute_s = m * s.recompute_s
        terms = {"compute": busy_s - recompute_s - sum(comm.values()), "recompute": recompute_s,
                 **{k: comm[k] for k in COMM_AXES}, "pp_comm": tb["pp_comm"], "dp_comm": tb["dp_comm"],
                 "bubble": pipeline_s - busy_s, "optimizer": tb["optimizer"]}
        rows.append(StageTime(s.rank, s.layers, {k: terms[k] for k in TIME_TERMS}))
    return tuple(rows)


# --------------------------------------------------------------------------- neighbours


def neighbours(plan: ParallelPlan, num_gpus: int, num_layers: int | None = None,
               moe: bool = False) -> list[tuple[str, str, ParallelPlan]]:
    """(name, axis, plan) of each neighbouring plan, in a fixed order. dp is derived, so a factor
    moved onto tp, pp or cp comes off dp and back (ep and etp split the experts within the same
    GPUs: dp stays). Doubling pp under interleaving halves vpp when pp·vpp would exceed
    `num_layers` (the same virtual stages over more ranks). vpp ×2 / ÷2 where pp > 1; ep and etp
    ×2 / ÷2 for a MoE model (`moe`)."""
    out = []
    for new_tp in (plan.tp * 2, plan.tp // 2):
        if new_tp >= 1 and new_tp != plan.tp:
            alt = _with_tp(plan, new_tp)
            out.append((_name("tp", plan.tp, new_tp, plan, alt, num_gpus), "tp", alt))
    for new_pp in (plan.pp * 2, plan.pp // 2):
        if new_pp >= 1 and new_pp != plan.pp:
            alt = _with_pp(plan, new_pp, num_layers)
            out.append((_name("pp", plan.pp, new_pp, plan, alt, num_gpus), "pp", alt))
    for new_cp in (plan.cp * 2, plan.cp // 2):
        if new_cp >= 1 and new_cp != plan.cp:
            alt = _rebuilt(plan, cp=new_cp)
            out.append((_name("cp", plan.cp, new_cp, plan, alt, num_gpus), "cp", alt))
    if plan.pp > 1:
        for new_vpp in (plan.vpp * 2, plan.vpp // 2):
            if new_vpp >= 1 and new_vpp != plan.vpp:
                out.append((f"vpp {plan.vpp}→{new_vpp}", "vpp",
                            plan.model_copy(update={"vpp": new_vpp, "layers_per_stage": None})))
    if moe:
        for new_ep in (plan.ep * 2, plan.ep // 2):
            if new_ep >= 1 and new_ep != plan.ep:
                out.append((f"ep {plan.ep}→{new_ep}", "ep", plan.model_copy(update={"ep": new_ep})))
        for new_etp in (plan.expert_tp * 2, plan.expert_tp // 2):
            if new_etp >= 1 and new_etp != plan.expert_tp:
                out.append((f"etp {plan.expert_tp}→{new_etp}", "etp", plan.model_copy(update={"etp": new_etp})))
    for new_mbs in (plan.mbs * 2, plan.mbs // 2):
        if new_mbs >= 1 and new_mbs != plan.mbs:
            out.append((f"mbs {plan.mbs}→{new_mbs}", "mbs", plan.model_copy(update={"mbs": new_mbs})))
    for rec in recompute_steps(plan.recompute):
        out.append((f"recompute {plan.recompute.label(plan.framework)}→{rec.label(plan.framework)}", "recompute",
                    plan.model_copy(update={"recompute": rec})))
    for z in zero_steps(plan.zero, plan.framework):
        out.append((f"zero {plan.zero}→{z}", "zero", plan.model_copy(update={"zero": z})))
    if not plan.moe_grouped_gemm:  # Megatron's SequentialMLP: what one grouped GEMM per rank would give
        out.append(("grouped GEMM off→on", "moe_grouped_gemm", plan.model_copy(update={"moe_grouped_gemm": True})))
    if plan.torch_compile is False:  # an eager torchtitan plan: what compiling its blocks would give
        out.append(("torch.compile off→on", "torch_compile", plan.model_copy(update={"torch_compile": True})))
    return out


def _name(axis: str, old: int, new: int, plan: ParallelPlan, alt: ParallelPlan, num_gpus: int) -> str:
    """'pp 4→8 (dp 2→1, vpp 20→10)': the move and what it drags along."""
    also = []
    if num_gpus % alt.model_parallel_size() == 0:
        also.append(f"dp {plan.dp_for(num_gpus)}→{alt.dp_for(num_gpus)}")
    if alt.vpp != plan.vpp:
        also.append(f"vpp {plan.vpp}→{alt.vpp}")
    return f"{axis} {old}→{new}" + (f" ({', '.join(also)})" if also else "")


def _rebuilt(plan: ParallelPlan, **update: Any) -> ParallelPlan:
    """`plan` with `update`, built again so that its framework's defaults resolve for the new
    degrees (the CP exchange at cp 1); model_copy when the validator refuses it (judge reports
    why)."""
    try:
        return ParallelPlan.model_validate({**plan.model_dump(), **update})
    except ValueError:
        return plan.model_copy(update=update)


def _with_tp(plan: ParallelPlan, tp: int) -> ParallelPlan:
    update: dict[str, Any] = {"tp": tp}
    if tp == 1:  # sequence parallelism and TP overlap need tp > 1: the neighbour drops them
        update.update(sp=None, tp_comm_overlap=False)
    return plan.model_copy(update=update)


def _with_pp(plan: ParallelPlan, pp: int, num_layers: int | None = None) -> ParallelPlan:
    update: dict[str, Any] = {"pp": pp, "layers_per_stage": None}  # a custom split is for the old pp
    virtual = plan.pp * plan.vpp
    if pp == 1:
        update["vpp"] = 1
    elif num_layers is not None and pp * plan.vpp > num_layers and virtual % pp == 0:
        update["vpp"] = virtual // pp
    return plan.model_copy(update=update)


def recompute_steps(r: Recompute) -> list[Recompute]:
    """One step less and one more on the ladder none < selective(core_attn) < full(K) < full."""
    level = _RECOMPUTE_LADDER.index(r.mode)
    out = []
    if level > 0:
        out.append(Recompute(mode=RecomputeMode.NONE) if r.mode == RecomputeMode.SELECTIVE else _SELECTIVE)
    if r.mode == RecomputeMode.FULL and r.num_layers is not None:
        out.append(Recompute(mode=RecomputeMode.FULL))
    elif level < 2:
        out.append(_SELECTIVE if r.mode == RecomputeMode.NONE else Recompute(mode=RecomputeMode.FULL))
    return out


def zero_steps(zero: int, framework: Framework) -> list[int]:
    """The ZeRO stages next below and above `zero` that `framework` supports."""
    stages = framework_spec(framework).zero_stages
    lower = [z for z in stages if z < zero]
    higher = [z for z in stages if z > zero]
    return ([lower[-1]] if lower else []) + ([higher[0]] if higher else [])


# --------------------------------------------------------------------------- verdicts


def judge(graph: ModelGraph, cluster: Cluster, p: CostParams, chosen: ParallelPlan, chosen_est: Estimate,
          name: str, axis: str, plan: ParallelPlan, memory_margin: float) -> Alternative:
    """Validate and score one neighbour, and say why it loses, fails or wins."""
    problems = layout_violations(plan, cluster, graph)
    if problems:
        reasons = tuple(x.split("; ")[0] for x in problems)
        return Alternative(name, axis, plan, "invalid", "; ".join(reasons), violations=reasons)
    est = estimate(graph, cluster, plan, p, memory_margin)
    usable = est.usable_memory_bytes
    verdict, reason = verdict_for(chosen_est, est, usable)
    fullest = max(est.stages, key=lambda row: row.memory_bytes)
    short = max(0.0, est.peak_memory_bytes - usable)
    return Alternative(name, axis, plan, verdict, reason, estimate=est, shortfall_bytes=short,
                       oom_rank=None if est.fits else fullest.rank)


def verdict_for(chosen: Estimate, alt: Estimate, usable_bytes: float) -> tuple[str, str]:
    """(verdict, reason) of a valid alternative against the chosen plan's estimate."""
    change = alt.step_time_s / chosen.step_time_s - 1.0
    if not alt.fits:
        oom = oom_reason(alt, usable_bytes)
        if change < -_TIE_REL:
            return "faster_unfit", f"{-change:.1%} faster ({_moves(chosen, alt, -1)}) but {oom}"
        return "oom", oom + (f"; also {change:.1%} slower" if change > _TIE_REL else "")
    if not chosen.fits:
        return "wins", f"fits where the chosen plan does not ({_speed(change)})"
    if change > _TIE_REL:
        return "slower", f"{change:.1%} slower: {_moves(chosen, alt, +1)}"
    if change < -_TIE_REL:
        return "wins", f"{-change:.1%} faster: {_moves(chosen, alt, -1)}"
    return "tie", "same step time"


def oom_reason(est: Estimate, usable_bytes: float) -> str:
    """'OOM on stage 0 by 3.1 GiB' for the fullest rank, naming how many ranks overflow."""
    over = [s for s in est.stages if s.memory_bytes > usable_bytes]
    fullest = max(est.stages, key=lambda s: s.memory_bytes)
    text = f"OOM on stage {fullest.rank} by {gib(fullest.memory_bytes - usable_bytes)}"
    if len(over) > 1:
        text += f" ({len(over)} of {len(est.stages)} stages over)"
    return text


def _speed(change: float) -> str:
    if abs(change) <= _TIE_REL:
        return "same step time"
    return f"{abs(change):.1%} {'slower' if change > 0 else 'faster'}"


def _moves(chosen: Estimate, alt: Estimate, sign: int) -> str:
    """The terms that moved most in direction `sign` (+1 grew, −1 shrank): one or two of them."""
    deltas = [(sign * (alt.time_breakdown_s[k] - chosen.time_breakdown_s[k]), k) for k in TIME_TERMS]
    moved = sorted((d, k) for d, k in deltas if d > 0)[::-1]
    if not moved:
        return "the same terms"
    top = [(d, k) for d, k in moved[:2] if d >= 0.25 * moved[0][0]]
    mark = "+" if sign > 0 else "−"
    return ", ".join(f"{mark}{seconds(d)} {TERM_LABELS[k]}" for d, k in top)


# --------------------------------------------------------------------------- rendering


def _label(plan: ParallelPlan) -> str:
    return f"{plan.layout()} mbs{plan.mbs} zero{plan.zero} {plan.recompute.label(plan.framework)}"


_VERDICT_STYLE = {"invalid": "dim", "oom": "red", "faster_unfit": "yellow", "slower": "", "tie": "",
                  "wins": "bold green"}
_VERDICT_TEXT = {"invalid": "invalid", "oom": "OOM", "faster_unfit": "faster, OOM", "slower": "slower",
                 "tie": "tie", "wins": "★ wins"}


def render_explanation(console: Console, ex: Explanation) -> None:
    """Three Rich tables: step time per stage, memory per stage, and the neighbouring plans."""
    e = ex.estimate
    console.print(f"[bold]{_label(ex.plan)}[/] dp{e.dp} · {e.num_microbatches} microbatches · {ex.model} on "
                  f"{ex.gpus} × {ex.cluster}: step {seconds(e.step_time_s)}, {e.tokens_per_s_per_gpu:,.1f} "
                  f"tokens/s/GPU, MFU {e.mfu:.1%}, " + ("[green]fits[/]" if e.fits else "[bold red]does NOT fit[/]"))
    print_table(console, stage_time_table(ex))
    print_table(console, stage_memory_table(ex))
    print_table(console, alternatives_table(ex), alternatives_table_narrow(ex), unwrapped=True)


def stage_time_table(ex: Explanation) -> Table:
    shown = [k for k in TIME_TERMS if k not in COMM_AXES or any(s.terms_s[k] > 0 for s in ex.stage_times)]
    t = Table(title="Step time per pipeline stage (each row sums to the step; * = bottleneck rank)")
    t.add_column("stage", justify="right")
    t.add_column("layers", justify="right")
    for k in shown:
        t.add_column(TERM_LABELS[k].replace("exposed ", "").replace("communication", "comm"), justify="right")
    t.add_column("total", justify="right")
    neck = ex.bottleneck_rank
    for s in ex.stage_times:
        t.add_row(f"{'*' if s.rank == neck else ''}{s.rank}", _layers_label(s.layers),
                  *(seconds(s.terms_s[k]) for k in shown), seconds(s.total_s), style="bold" if s.rank == neck else "")
    return t


def _layers_label(layers: tuple[int, ...]) -> str:
    """Decoder layers per virtual stage: '20', '5+5', or '16×1' when many chunks are alike."""
    if len(layers) > 2 and len(set(layers)) == 1:
        return f"{len(layers)}×{layers[0]}"
    return "+".join(map(str, layers))


def stage_memory_table(ex: Explanation) -> Table:
    usable = ex.stage_memory[0].usable_bytes if ex.stage_memory else 0.0
    t = Table(title=f"Memory per GPU of each stage against {gib(usable)} usable "
                    f"({gib(ex.estimate.memory_capacity_bytes)} HBM, {ex.memory_margin:.0%} kept free)")
    for col in ("stage", "weights", "gradients", "optimizer", "activations", "other", "total", "headroom"):
        t.add_column(col, justify="right")
    for s in ex.stage_memory:
        b = s.breakdown_bytes
        other = s.total_bytes - b["weights"] - b["gradients"] - b["optimizer"] - b["activations"]
        room = s.headroom_bytes
        t.add_row(str(s.rank), gib(b["weights"]), gib(b["gradients"]), gib(b["optimizer"]), gib(b["activations"]),
                  gib(other), gib(s.total_bytes), f"[red]{gib(room)}[/]" if room < 0 else gib(room))
    return t


def alternatives_table(ex: Explanation) -> Table:
    t = Table(title="Neighbouring plans (★ = would beat the chosen plan)")
    for col in ("change", "step", "vs chosen", "verdict", "why"):
        t.add_column(col, justify="right" if col in ("step", "vs chosen") else "left", no_wrap=col == "change")
    base = ex.estimate.step_time_s
    for a in ex.alternatives:
        e = a.estimate
        step = seconds(e.step_time_s) if e else "—"
        rel = f"{e.step_time_s / base - 1.0:+.1%}" if e else "—"
        t.add_row(a.name, step, rel, _VERDICT_TEXT[a.verdict], Text(a.reason), style=_VERDICT_STYLE[a.verdict])
    return t


def alternatives_table_narrow(ex: Explanation) -> Table:
    """The neighbours for a narrow terminal: step, change and verdict stacked in one column."""
    t = Table(title="Neighbouring plans (★ = would beat the chosen plan)")
    t.add_column("change")
    t.add_column("step", justify="right")
    t.add_column("why")
    base = ex.estimate.step_time_s
    for a in ex.alternatives:
        e = a.estimate
        step = f"{seconds(e.step_time_s)}\n{e.step_time_s / base - 1.0:+.1%}\n" if e else "—\n"
        t.add_row(Text(a.name.replace(" (", "\n(")), step + _VERDICT_TEXT[a.verdict], Text(a.reason),
                  style=_VERDICT_STYLE[a.verdict], end_section=True)
    return t
