"""Sweep the GPU count, global batch or sequence length and find the best plan at each point, to
see where scaling breaks.

Each point runs the plan search (autopar.search.search, top=1). A point where nothing fits, or
where the inputs are invalid for that size (e.g. a GPU count that does not fill whole nodes), keeps
the one-line reason and the sweep goes on. Lists given together are zipped (gpus 8,16,32 with
global batch 32,64,128 is weak scaling); an axis not swept takes its base value.

Scaling efficiency of a point = its tokens/s/GPU ÷ that of the first point with a plan: 1.0 is
perfect scaling; it falls where communication, bubbles or a forced change of layout start to cost.

`SweepPoint.to_dict()` keys (stable): model, cluster, gpus, global_batch, seq_len, fits, reason,
plan (autopar.report.records.plan_to_dict or null), estimate (autopar.report.records.estimate_to_dict or null),
tokens_per_s, tokens_per_s_per_gpu, mfu (null without a plan), candidates, feasible, search_s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autopar.cost.step import DEFAULT_MEMORY_MARGIN, Estimate
from autopar.errors import AutoparError, SchemaError
from autopar.hardware import load_profile
from autopar.inputs import load_model
from autopar.report.records import estimate_to_dict, plan_to_dict
from autopar.report.tables import print_table, seconds, usable_label
from autopar.schema.plan import Framework, ParallelPlan, Precision, parse_assignments

Progress = Callable[[str, int, int], None]  # ("sweep", points done, points in all)
SWEPT = ("gpus", "global_batch", "seq_len")
BAR_GLYPHS = " ▏▎▍▌▋▊▉█"  # eighths of a character cell


@dataclass(frozen=True)
class SweepPoint:
    """The best plan at one point of a sweep, or the reason there is none."""

    model: str
    cluster: str
    gpus: int
    global_batch: int
    seq_len: int
    plan: ParallelPlan | None = None
    estimate: Estimate | None = None
    reason: str | None = None  # why there is no plan (one line)
    candidates: int = 0
    feasible: int = 0
    search_s: float = 0.0

    @property
    def fits(self) -> bool:
        return self.estimate is not None

    @property
    def tokens_per_s(self) -> float | None:
        return self.estimate.tokens_per_s if self.estimate else None

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return self.estimate.tokens_per_s_per_gpu if self.estimate else None

    @property
    def mfu(self) -> float | None:
        return self.estimate.mfu if self.estimate else None

    def value(self, axis: str) -> int:
        return {"gpus": self.gpus, "global_batch": self.global_batch, "seq_len": self.seq_len}[axis]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "cluster": self.cluster, "gpus": self.gpus, "global_batch": self.global_batch,
            "seq_len": self.seq_len, "fits": self.fits, "reason": self.reason,
            "plan": plan_to_dict(self.plan, self.gpus) if self.plan else None,
            "estimate": estimate_to_dict(self.estimate, self.plan) if self.estimate else None,
            "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
            "candidates": self.candidates, "feasible": self.feasible, "search_s": self.search_s,
        }


MAX_POINTS = 64  # points in one sweep: each runs a search


def parse_values(text: str, option: str, high: int | None = None) -> list[int]:
    """'8,16,32' -> [8, 16, 32], with a one-line error naming the option; each value at most `high`
    (default: the option's limit in autopar.limits), at most MAX_POINTS values."""
    from autopar.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN, clip, clip_repr

    high = high or {"--gpus": MAX_GPUS, "--global-batch": MAX_GLOBAL_BATCH, "--seq-len": MAX_SEQ_LEN}.get(option, MAX_GPUS)
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(x.isascii() and x.isdigit() and x.strip("0") for x in parts):
        raise SchemaError(f"{option} {clip_repr(text)} must be positive whole numbers separated by commas, e.g. 8,16,32")
    if len(parts) > MAX_POINTS:
        raise SchemaError(f"{option} lists {len(parts)} values; a sweep takes at most {MAX_POINTS}, so sweep in parts")
    too_big = [x for x in parts if len(x.lstrip("0")) > 18 or int(x) > high]  # (no 5,000-digit int conversion)
    if too_big:
        raise SchemaError(f"{option} {clip(too_big[0])} is over the limit of {high:,}; use smaller values")
    return [int(x) for x in parts]


def sweep_points(gpus_list: Sequence[int] | None, global_batch_list: Sequence[int] | None,
                 seq_len_list: Sequence[int] | None, gpus: int | None, global_batch: int | None,
                 seq_len: int) -> list[tuple[int, int, int]]:
    """(gpus, global_batch, seq_len) of every point: the given lists zipped, base values elsewhere."""
    lists = {"gpus": gpus_list, "global_batch": global_batch_list, "seq_len": seq_len_list}
    given = {k: list(v) for k, v in lists.items() if v}
    if not given:
        raise SchemaError("nothing to sweep; give a list of GPU counts, global batches or sequence lengths")
    lengths = {len(v) for v in given.values()}
    if len(lengths) > 1:
        raise SchemaError("swept lists are zipped point by point, so they need one length; got "
                          + ", ".join(f"{len(v)} {k.replace('_', ' ')} values" for k, v in given.items()))
    n = lengths.pop()
    base = {"gpus": gpus, "global_batch": global_batch, "seq_len": seq_len}
    missing = [k for k in SWEPT if k not in given and base[k] is None]
    if missing:
        raise SchemaError(f"a sweep that does not vary {' or '.join(missing)} needs its value; "
                          f"pass --{missing[0].replace('_', '-')}")
    cols = [given.get(k, [base[k]] * n) for k in SWEPT]
    return list(zip(*cols))


def sweep(model: str, cluster: str, gpus_list: Sequence[int] | None = None,
          global_batch_list: Sequence[int] | None = None, seq_len_list: Sequence[int] | None = None, *,
          gpus: int | None = None, global_batch: int | None = None, seq_len: int | None = None,
          framework: Framework = Framework.MEGATRON, precision: Precision = Precision.BF16, fix: str | None = None,
          memory_margin: float | None = None, cost_model: str | None = None, max_tp: int | None = None,
          progress: Progress | None = None) -> list[SweepPoint]:
    """The best plan (search top 1) at every point; `fix` is a --fix string ('tp=8,recompute=full').
    Unknown model or cluster names raise at once; a point's own failure is kept as its reason."""
    from autopar.search import search  # the search is only needed once a sweep runs

    seq = seq_len or load_model(model).spec.seq_length
    load_profile(cluster)
    margin = DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin
    points = sweep_points(gpus_list, global_batch_list, seq_len_list, gpus, global_batch, seq)
    out = []
    for i, (g, gbs, s) in enumerate(points):
        if progress:
            progress("sweep", i, len(points))
        try:
            r = search(model, cluster, g, s, gbs, top=1, framework=framework,
                       fix=parse_assignments(fix) if fix else None, max_tp=max_tp, memory_margin=margin,
                       precision=precision, cost_model=cost_model)
        except AutoparError as exc:
            out.append(SweepPoint(model, cluster, g, gbs, s, reason=str(exc)))
            continue
        plan, est = r.plans[0]
        out.append(SweepPoint(model, cluster, g, gbs, s, plan, est, candidates=r.candidates, feasible=r.feasible,
                              search_s=r.time_s))
    if progress:
        progress("sweep", len(points), len(points))
    return out


def swept_axis(points: Sequence[SweepPoint]) -> str:
    """The first of gpus, global_batch, seq_len whose value changes over the sweep (gpus if none)."""
    for axis in SWEPT:
        if len({p.value(axis) for p in points}) > 1:
            return axis
    return "gpus"


def scaling_efficiency(points: Sequence[SweepPoint]) -> list[float | None]:
    """tokens/s/GPU of each point over that of the first point with a plan (None without a plan)."""
    ref = next((p.tokens_per_s_per_gpu for p in points if p.fits), None)
    return [p.tokens_per_s_per_gpu / ref if p.fits and ref else None for p in points]


def bar_glyphs(fraction: float, width: int) -> str:
    """A horizontal bar of `width` cells filled to `fraction` (0..1), in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (BAR_GLYPHS[rest] if rest else "")).ljust(width)


def sweep_table(points: Sequence[SweepPoint], bar_width: int = 16) -> Table:
    """The best plan per point, throughput with bars, MFU and scaling efficiency vs the first point."""
    axis = swept_axis(points)
    first = points[0] if points else None
    title = (f"Sweep of {axis.replace('_', ' ')}: {first.model} on {first.cluster}" if first else "Sweep")
    t = Table(title=title + " (efficiency = tokens/s/GPU ÷ first point's)")
    for col in ("gpus", "global batch", "seq len", "best plan", "step", "tokens/s", "tokens/s/GPU", "", "MFU",
                "efficiency"):
        t.add_column(col, justify="left" if col in ("best plan", "") else "right", no_wrap=col == "")
    top = max((p.tokens_per_s_per_gpu for p in points if p.fits), default=0.0)
    for p, eff in zip(points, scaling_efficiency(points)):
        head = [str(p.gpus), str(p.global_batch), str(p.seq_len)]
        if not p.fits:
            t.add_row(*head, Text(p.reason.split("; ")[0] if p.reason else "no plan", style="red"),
                      "—", "—", "—", "", "—", "—")
            continue
        e, plan = p.estimate, p.plan
        style = "red" if eff < 0.8 else ("yellow" if eff < 0.95 else "green")
        t.add_row(*head,
                  f"{plan.layout()} dp{e.dp} mbs{plan.mbs} zero{plan.zero} {plan.recompute.label(plan.framework)}",
                  seconds(e.step_time_s), f"{e.tokens_per_s:,.0f}", f"{e.tokens_per_s_per_gpu:,.1f}",
                  f"[cyan]{bar_glyphs(e.tokens_per_s_per_gpu / top, bar_width)}[/]", f"{e.mfu:.1%}",
                  f"[{style}]{eff:.1%}[/]")
    return t


def sweep_table_narrow(points: Sequence[SweepPoint], bar_width: int = 10) -> Table:
    """The sweep for a narrow terminal: the point and the plan's settings stacked, tokens/s/GPU over
    its bar (tokens/s is tokens/s/GPU × gpus)."""
    axis = swept_axis(points)
    first = points[0] if points else None
    title = (f"Sweep of {axis.replace('_', ' ')}: {first.model} on {first.cluster}" if first else "Sweep")
    t = Table(title=title + " (efficiency = tokens/s/GPU ÷ first point's)")
    for col in ("point", "best plan", "step", "tok/s/GPU", "MFU", "efficiency"):
        t.add_column(col, justify="left" if col in ("point", "best plan") else "right", no_wrap=True)
    top = max((p.tokens_per_s_per_gpu for p in points if p.fits), default=0.0)
    for p, eff in zip(points, scaling_efficiency(points)):
        head = f"{p.gpus:,} GPUs\ngbs {p.global_batch:,}\nseq {p.seq_len:,}"
        if not p.fits:
            t.add_row(head, Text(p.reason.split("; ")[0] if p.reason else "no plan", style="red", overflow="fold"),
                      "—", "—", "—", "—", end_section=True)
            continue
        e, plan = p.estimate, p.plan
        style = "red" if eff < 0.8 else ("yellow" if eff < 0.95 else "green")
        t.add_row(head, f"{plan.layout()}\ndp{e.dp} mbs{plan.mbs} zero{plan.zero}\n{plan.recompute.label(plan.framework)}",
                  seconds(e.step_time_s),
                  f"{e.tokens_per_s_per_gpu:,.1f}\n[cyan]{bar_glyphs(e.tokens_per_s_per_gpu / top, bar_width)}[/]",
                  f"{e.mfu:.1%}", f"[{style}]{eff:.1%}[/]", end_section=True)
    return t


def render_sweep(console: Console, points: Sequence[SweepPoint]) -> None:
    print_table(console, sweep_table(points), sweep_table_narrow(points))
    est = next((p.estimate for p in points if p.estimate is not None), None)
    if est is not None:
        console.print(f"[dim]fit = peak ≤ {usable_label(est)}[/]")
