"""Pictures of a plan: the pipeline timeline, memory per stage, and a sweep; as PNG (matplotlib,
the optional extra `autopar[plot]`) or drawn in the terminal (Rich) when matplotlib is missing or
the path is "-".

Timeline. The event simulation of the plan's schedule (autopar.cost.pipeline: 1F1B or
interleaved 1F1B) with each rank's per-microbatch fwd_s / bwd_s from the Estimate's stages, split
evenly over its vpp model chunks. A backward's leading recompute_s / vpp is its recompute. The
exposed tp/cp/ep communication is drawn as the trailing share of each op, at the bottleneck rank's
share of busy time (the Estimate keeps the split for that rank only). Stage-boundary p2p sends take
pp_comm / exposed_p2p_hops each, the estimate's own per-send time. Above MAX_MICROBATCHES the
schedule is simulated with fewer microbatches (a multiple of pp) and the picture says so: the
warm-up and cool-down are the same and the steady state repeats.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.text import Text

from autopar.cost.pipeline import BACKWARD, FORWARD, exposed_p2p_hops, simulate_interleaved
from autopar.cost.step import Estimate
from autopar.report.sweep import SweepPoint, scaling_efficiency, swept_axis, sweep_table
from autopar.report.tables import human_count
from autopar.report.tables import gib, seconds
from autopar.schema.plan import ParallelPlan
from autopar.units import GiB

MAX_MICROBATCHES = 64  # simulated for a timeline
MAX_DRAWN_CHUNK_OPS = 64  # forward chunk-ops per rank the terminal timeline draws (m · vpp), for legibility
MAX_FIGURE_OPS = 2**17  # ops (2 · m · vpp · pp) a picture's schedule holds; above it, a repeating part is cut
GROUP_CHUNKS_FROM_VPP = 8  # from this vpp on, back-to-back chunk-ops of one kind are drawn as one bar
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
KINDS = ("timeline", "memory", "sweep")
INSTALL_HINT = "pip install 'autopar[plot]'"
COLORS = {  # one colour per part; the terminal uses the same names
    "forward": "#4C78A8", "backward": "#54A24B", "recompute": "#F58518", "comm": "#B279A2",
    "p2p": "#222222", "idle": "#EEEEEE", "step_wide": "#9D755D",
    "weights": "#4C78A8", "gradients": "#72B7B2", "optimizer": "#54A24B", "activations": "#F58518",
    "other": "#BAB0AC",
}
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "other")  # other = fsdp_gathered + buffers
MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer state",
                 "activations": "activations", "other": "other: buffers, fragmentation,\nFSDP gathers"}


@dataclass(frozen=True, slots=True)
class Bar:
    """One scheduled op of the timeline. kind "F" forward or "B" backward; a backward's first
    recompute_s seconds re-run the forward, and each op's last comm_s seconds are exposed
    communication. Times in seconds from the start of the step."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float
    recompute_s: float = 0.0
    comm_s: float = 0.0

    def parts(self) -> list[tuple[str, float, float]]:
        """(part, start_s, end_s) in time order: recompute, forward/backward, comm."""
        body = "forward" if self.kind == FORWARD else "backward"
        a, b = self.start_s + self.recompute_s, self.end_s - self.comm_s
        out = [("recompute", self.start_s, a), (body, a, b), ("comm", b, self.end_s)]
        return [x for x in out if x[2] > x[1]]


@dataclass(frozen=True, slots=True)
class Transfer:
    """A p2p send across a stage boundary into `rank` (activations for F, gradients for B)."""

    rank: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """The simulated schedule. step_s is the makespan (first forward to last backward);
    num_microbatches were simulated out of the plan's total_microbatches."""

    bars: tuple[Bar, ...]
    transfers: tuple[Transfer, ...]
    step_s: float
    pp: int
    vpp: int
    num_microbatches: int
    total_microbatches: int
    p2p_s: float
    title: str

    @property
    def truncated(self) -> bool:
        return self.num_microbatches < self.total_microbatches

    def bars_of(self, rank: int) -> list[Bar]:
        return sorted((b for b in self.bars if b.rank == rank), key=lambda b: b.start_s)

    @property
    def note(self) -> str:
        if not self.truncated:
            return ""
        return (f"showing {self.num_microbatches} of {self.total_microbatches} microbatches: warm-up and cool-down "
                "are the same, the steady state repeats")


# --------------------------------------------------------------------------- timeline


def simulated_microbatches(m: int, pp: int, vpp: int, cap: int) -> int:
    """m, or at most `cap` (kept a multiple of pp under interleaving, and at least pp)."""
    if m <= cap:
        return m
    if vpp > 1:
        return max(pp, cap - cap % pp)
    return max(cap, 1)


def pipeline_timeline(plan: ParallelPlan, estimate: Estimate, max_microbatches: int = MAX_MICROBATCHES) -> Timeline:
    """The event simulation of the plan's schedule as bars (2·m·vpp per rank) and p2p transfers."""
    pp, vpp = plan.pp, plan.vpp
    m = simulated_microbatches(estimate.num_microbatches, pp, vpp, max_microbatches)
    stages = sorted(estimate.stages, key=lambda s: s.rank)
    fwd = [stages[v % pp].fwd_s / vpp for v in range(pp * vpp)]
    bwd = [stages[v % pp].bwd_s / vpp for v in range(pp * vpp)]
    hops = exposed_p2p_hops(pp, estimate.num_microbatches, vpp)
    p2p_s = estimate.time_breakdown_s["pp_comm"] / hops if hops else 0.0
    times = simulate_interleaved(fwd, bwd, m, vpp, p2p_s)
    share = comm_share(estimate)
    bars = []
    for op in times.ops:
        rec = stages[op.rank].recompute_s / vpp if op.kind == BACKWARD else 0.0
        dur = op.end_s - op.start_s
        bars.append(Bar(op.rank, op.kind, op.microbatch, op.chunk, op.start_s, op.end_s, rec,
                        min(share * dur, dur - rec)))
    pipeline_s = _pipeline_s(estimate)  # the tables' numbers, not the simulation's makespan
    title = (f"{plan.layout()} {'interleaved 1F1B' if vpp > 1 else '1F1B'}, {estimate.num_microbatches} "
             f"microbatches: pipeline {seconds(pipeline_s)} of a {seconds(estimate.step_time_s)} step")
    return Timeline(tuple(bars), _transfers(bars, pp, vpp, p2p_s), times.step_s, pp, vpp, m,
                    estimate.num_microbatches, p2p_s, title)


def _pipeline_s(estimate: Estimate) -> float:
    tb = estimate.time_breakdown_s
    return estimate.step_time_s - tb["dp_comm"] - tb["optimizer"]


def comm_share(estimate: Estimate) -> float:
    """Exposed tp/cp/ep communication over busy time of the bottleneck rank."""
    tb = estimate.time_breakdown_s
    busy = tb["compute"] + tb["recompute"] + tb["tp_comm"] + tb["cp_comm"] + tb["ep_comm"]
    return (tb["tp_comm"] + tb["cp_comm"] + tb["ep_comm"]) / busy if busy > 0 else 0.0


def _transfers(bars: list[Bar], pp: int, vpp: int, p2p_s: float) -> tuple[Transfer, ...]:
    """Each op's input arriving from the neighbouring virtual stage: it leaves when the sender's op
    ends and arrives p2p_s later (virtual stage v = chunk·pp + rank)."""
    if p2p_s <= 0:
        return ()
    end = {(b.kind, b.chunk * pp + b.rank, b.microbatch): b.end_s for b in bars}
    last = pp * vpp - 1
    out = []
    for b in bars:
        v = b.chunk * pp + b.rank
        src = v - 1 if b.kind == FORWARD else v + 1
        if 0 <= src <= last and not (b.kind == BACKWARD and v == last):
            start = end[(b.kind, src, b.microbatch)]
            out.append(Transfer(b.rank, b.kind, b.microbatch, start, start + p2p_s))
    return tuple(out)


def timeline_text(timeline: Timeline, width: int = 100) -> Text:
    """A text Gantt chart: one row per rank, one character per time slot. F forward, B backward,
    R recompute, ~ communication, · idle; lower case marks odd microbatches so ops stand apart."""
    slot_s = timeline.step_s / width if timeline.step_s > 0 else 1.0
    chars = {"forward": "F", "backward": "B", "recompute": "R", "comm": "~"}
    out = Text()
    out.append(timeline.title + "\n", style="bold")
    if timeline.note:
        out.append(timeline.note + "\n", style="dim")
    label_w = len(f"rank {timeline.pp - 1}")
    for rank in range(timeline.pp):
        bars = timeline.bars_of(rank)
        starts = [b.start_s for b in bars]
        out.append(f"rank {rank}".rjust(label_w) + " │")
        for i in range(width):
            t = (i + 0.5) * slot_s
            k = bisect.bisect_right(starts, t) - 1
            part = _part_at(bars[k], t) if k >= 0 and bars[k].end_s > t else None
            if part is None:
                out.append("·", style="dim")
                continue
            c = chars[part]
            out.append(c.lower() if bars[k].microbatch % 2 else c, style=COLORS[part])
        out.append("│\n")
    ticks = f"0 s{' ' * (width - 3 - len(seconds(timeline.step_s)))}{seconds(timeline.step_s)}"
    out.append(" " * (label_w + 2) + ticks + "\n")
    out.append(" " * (label_w + 2) + "F forward  B backward  R recompute  ~ comm  · idle (bubble); lower case = odd "
               "microbatch", style="dim")
    return out


def _part_at(bar: Bar, t: float) -> str | None:
    for part, a, b in bar.parts():
        if a <= t < b:
            return part
    return None


@dataclass(frozen=True, slots=True)
class Run:
    """Back-to-back ops of one kind on one rank (no idle time between them), drawn as one bar."""

    rank: int
    kind: str
    start_s: float
    end_s: float
    ops: int
    chunks: tuple[int, int]  # lowest and highest model chunk in the run


STEADY = "FB"  # Run.kind of a steady-state stretch where forwards and backwards alternate
MIN_RUN_PX = 8  # runs narrower than this are merged into a steady-state bar


def op_runs(timeline: Timeline, min_gap_s: float = 0.0, min_width_s: float = 0.0) -> list[Run]:
    """The timeline's ops merged into runs. At vpp ≥ 8 a chunk-op is a sliver (a rank's stage time
    over vpp), so a picture groups the chunk-ops a rank runs back to back (gaps ≤ min_gap_s, i.e.
    under a pixel): warm-up forwards and cool-down backwards become one bar each, and stretches of
    runs narrower than min_width_s where forwards and backwards alternate (1F1B's steady state)
    become one STEADY bar."""
    out: list[Run] = []
    for rank in range(timeline.pp):
        runs: list[Run] = []
        for b in timeline.bars_of(rank):
            last = runs[-1] if runs else None
            if last is not None and b.kind == last.kind and b.start_s - last.end_s <= min_gap_s:
                runs[-1] = _joined(last, b.end_s, 1, (b.chunk, b.chunk), last.kind)
            else:
                runs.append(Run(rank, b.kind, b.start_s, b.end_s, 1, (b.chunk, b.chunk)))
        out += _steady(runs, min_gap_s, min_width_s)
    return out


def _joined(run: Run, end_s: float, ops: int, chunks: tuple[int, int], kind: str) -> Run:
    return Run(run.rank, kind, run.start_s, end_s, run.ops + ops, (min(run.chunks[0], chunks[0]),
                                                                   max(run.chunks[1], chunks[1])))


def _steady(runs: list[Run], min_gap_s: float, min_width_s: float) -> list[Run]:
    """Adjacent narrow runs of different kinds merged into STEADY runs."""
    out: list[Run] = []
    for run in runs:
        last = out[-1] if out else None
        narrow = run.end_s - run.start_s < min_width_s
        if (last is not None and narrow and run.start_s - last.end_s <= min_gap_s
                and (last.kind == STEADY or last.end_s - last.start_s < min_width_s) and last.kind != run.kind):
            out[-1] = _joined(last, run.end_s, run.ops, run.chunks, STEADY)
        elif last is not None and last.kind == STEADY and narrow and run.start_s - last.end_s <= min_gap_s:
            out[-1] = _joined(last, run.end_s, run.ops, run.chunks, STEADY)
        else:
            out.append(run)
    return out


def plot_timeline(plan: ParallelPlan, estimate: Estimate, path: str | Path) -> Path:
    """The pipeline timeline written to `path` (PNG/SVG/PDF by its suffix; timeline_figure)."""
    return _save(timeline_figure(plan, estimate), path)


def timeline_figure(plan: ParallelPlan, estimate: Estimate):
    """The pipeline timeline as a matplotlib Figure. Needs matplotlib.
    At most about MAX_DRAWN_CHUNK_OPS forward chunk-ops per rank are drawn, so bars stay legible;
    from vpp GROUP_CHUNKS_FROM_VPP on, back-to-back chunk-ops are drawn as one bar (op_runs)."""
    tl = pipeline_timeline(plan, estimate, max_microbatches=figure_microbatches(plan, estimate.num_microbatches))
    grouped = tl.vpp >= GROUP_CHUNKS_FROM_VPP
    fig = _figure(width=14, height=1.7 + 0.5 * tl.pp)
    ax = fig.add_subplot()
    tail_start, end_s = _step_tail(tl, estimate)
    px_per_s = _px_per_s(fig, tl, end_s)
    for r in range(tl.pp):
        ax.broken_barh([(0.0, end_s)], (r - 0.4, 0.8), facecolors=COLORS["idle"], zorder=0)
    if end_s > tail_start:  # dp gradient sync and the optimizer step: every rank, after the pipeline
        ax.broken_barh([(tail_start, end_s - tail_start)] * 1, (-0.4, tl.pp - 0.2), facecolors=COLORS["step_wide"],
                       zorder=1)
    overlays: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for b in tl.bars:
        for part, a, e in b.parts():
            if part in ("recompute", "comm"):
                overlays.setdefault((part, b.rank), []).append((a, e - a))
    runs = op_runs(tl, 1.0 / px_per_s, MIN_RUN_PX / px_per_s) if grouped else []
    if grouped:
        _draw_runs(ax, runs, px_per_s)
    else:
        ops: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
        for b in tl.bars:
            ops.setdefault((b.kind, b.chunk, b.rank), []).append((b.start_s, b.end_s - b.start_s))
        for (kind, chunk, rank), spans in sorted(ops.items()):
            color = _chunk_color("forward" if kind == FORWARD else "backward", chunk, tl.vpp)
            ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.2, zorder=2,
                           rasterized=True)  # a vector picture keeps its text as text, its bars as one image
    for (part, rank), spans in sorted(overlays.items()):
        ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=COLORS[part], linewidth=0, zorder=3, rasterized=True)
    if tl.p2p_s * px_per_s >= 3:  # a send narrower than that would draw as a speck
        for tr in tl.transfers:
            y = tr.rank + (-0.45 if tr.kind == FORWARD else 0.45)
            ax.plot([tr.start_s, tr.end_s], [y, y], color=COLORS["p2p"], linewidth=1.5, zorder=4, rasterized=True)
    ax.set_ylim(tl.pp - 0.5, -0.5)
    ax.set_yticks(range(tl.pp), [f"rank {r}" for r in range(tl.pp)])
    ax.set_xlim(0, end_s)
    ax.set_xlabel(f"time (s) in a {tl.num_microbatches}-microbatch schedule" if tl.truncated
                  else "time in the step (s)")
    sub = [tl.note] if tl.note else []
    if grouped:
        sub.append(f"vpp {tl.vpp}: chunk-ops a rank runs back to back are one bar (F×n: n chunk-ops), "
                   "alternating ones one 1F1B bar")
    if tl.pp > 1:
        sub.append(f"p2p send between stages {seconds(tl.p2p_s)}"
                   + ("" if tl.p2p_s * px_per_s >= 3 else " (too short to draw)"))
    ax.set_title(tl.title + ("\n" + "\n".join(_wrap_notes(sub)) if sub else ""), fontsize=11)
    steady = any(r.kind == STEADY for r in runs)
    fig.legend(handles=_timeline_legend(tl, px_per_s, steady), loc="lower center", ncol=7, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if tl.pp > 2 else 0.12, 1, 1))
    return fig


def _wrap_notes(notes: list[str], width: int = 150) -> list[str]:
    """Notes joined by '; ' into lines of at most about `width` characters."""
    lines: list[str] = []
    for note in notes:
        if lines and len(lines[-1]) + 2 + len(note) <= width:
            lines[-1] += "; " + note
        else:
            lines.append(note)
    return lines


def _draw_runs(ax, runs: list[Run], px_per_s: float) -> None:
    """Runs as outlined bars (no text over a bar: the legend names them); a steady stretch is
    backward-green hatched with forward-blue."""
    for run in runs:
        kwargs = dict(facecolors=COLORS["backward"], edgecolors=COLORS["forward"], hatch="////", linewidth=0.6) \
            if run.kind == STEADY else dict(facecolors=COLORS["forward" if run.kind == FORWARD else "backward"],
                                            edgecolors="#333333", linewidth=0.6)
        ax.broken_barh([(run.start_s, run.end_s - run.start_s)], (run.rank - 0.4, 0.8), zorder=2, rasterized=True,
                       **kwargs)


def _timeline_legend(tl: Timeline, px_per_s: float, steady: bool = False) -> list:
    from matplotlib.lines import Line2D

    handles = _legend_handles(["forward", "backward", "recompute", "comm", "idle", "step_wide"],
                              {"recompute": "recompute (start of backward)", "comm": "exposed tp/cp/ep comm",
                               "idle": "idle (bubble)", "step_wide": "dp comm + optimizer step"})
    if 1 < tl.vpp < GROUP_CHUNKS_FROM_VPP:
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor=_chunk_color("forward", tl.vpp - 1, tl.vpp), label="lighter: later model chunk"))
    if steady:
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor=COLORS["backward"], edgecolor=COLORS["forward"], hatch="////",
                             label="1F1B steady state (chunk-ops alternate)"))
    if tl.transfers and tl.p2p_s * px_per_s >= 3:
        handles.append(Line2D([], [], color=COLORS["p2p"], linewidth=1.5, label="p2p send (F above, B below)"))
    return handles


def _chunk_color(part: str, chunk: int, vpp: int) -> str:
    return _lighter(COLORS[part], 0.5 * chunk / max(vpp - 1, 1))


def _px_per_s(fig, tl: Timeline, end_s: float | None = None) -> float:
    """Horizontal pixels per second of the axes (about 85 % of the figure's width) over [0, end_s]."""
    span = tl.step_s if end_s is None else end_s
    return fig.get_figwidth() * fig.dpi * 0.85 / span if span > 0 else 0.0


def figure_microbatches(plan: ParallelPlan, num_microbatches: int) -> int:
    """Every microbatch of the schedule, unless its ops (2 · m · vpp · pp) pass MAX_FIGURE_OPS."""
    per_microbatch = 2 * plan.vpp * plan.pp
    return simulated_microbatches(num_microbatches, plan.pp, plan.vpp, max(1, MAX_FIGURE_OPS // per_microbatch))


def _step_tail(tl: Timeline, estimate: Estimate) -> tuple[float, float]:
    """(start, end) of the step-wide tail (dp communication, optimizer step) on the picture's axis:
    after the estimate's pipeline phase, ending at the estimate's step (the tables' number), or
    after the drawn schedule when a repeating part of it is cut."""
    tb = estimate.time_breakdown_s
    tail = tb["dp_comm"] + tb["optimizer"]
    start = tl.step_s if tl.truncated else max(tl.step_s, _pipeline_s(estimate))
    return start, start + tail


# --------------------------------------------------------------------------- memory


def memory_parts(breakdown: dict[str, float]) -> dict[str, float]:
    """The five drawn parts of a stage's memory breakdown; other = the rest (FSDP gathers, buffers
    and fragmentation)."""
    main = {k: breakdown.get(k, 0.0) for k in MEMORY_PARTS[:-1]}
    return {**main, "other": sum(v for k, v in breakdown.items() if k not in main)}


def memory_text(estimate: Estimate, width: int = 60) -> Text:
    """Memory bars per stage in the terminal: W weights, G gradients, O optimizer, A activations,
    X other; ┃ marks the usable HBM (the estimate's: capacity less its margin), │ the capacity."""
    cap = estimate.memory_capacity_bytes
    usable = estimate.usable_memory_bytes
    scale = max(cap, max(s.memory_bytes for s in estimate.stages))
    chars = {"weights": "W", "gradients": "G", "optimizer": "O", "activations": "A", "other": "X"}
    out = Text()
    out.append(f"Peak memory per GPU by pipeline stage ({gib(usable)} usable of {gib(cap)})\n", style="bold")
    marks = {min(width - 1, round(usable / scale * width)): "┃"}
    marks.setdefault(min(width - 1, round(cap / scale * width)), "│")
    for s in sorted(estimate.stages, key=lambda s: s.rank):
        cells: list[tuple[str, str]] = []
        acc = 0.0
        for part, v in memory_parts(s.memory_breakdown_bytes).items():
            acc += v
            n = round(acc / scale * width) - len(cells)
            cells += [(chars[part], COLORS[part])] * max(n, 0)
        cells += [("·", "dim")] * (width - len(cells))
        out.append(f"stage {s.rank:>2} ")
        for i, (c, style) in enumerate(cells[:width]):
            if i in marks:
                out.append(marks[i], style="bold red")
            else:
                out.append(c, style=style)
        over = s.memory_bytes > usable
        out.append(f" {gib(s.memory_bytes)}" + (" OVER" if over else "") + "\n", style="bold red" if over else "")
    out.append("W weights  G gradients  O optimizer  A activations  X other (buffers, fragmentation, FSDP gathers)"
               "  ┃ usable  │ HBM", style="dim")
    return out


def plot_memory(estimate: Estimate, path: str | Path, plan: ParallelPlan | None = None) -> Path:
    """The memory bars written to `path` (memory_figure)."""
    return _save(memory_figure(estimate, plan), path)


def memory_figure(estimate: Estimate, plan: ParallelPlan | None = None):
    """Stacked memory bars per stage with the HBM capacity (and usable share) lines; `plan` names the
    layout in the title. Needs matplotlib."""
    stages = sorted(estimate.stages, key=lambda s: s.rank)
    fig = _figure(width=max(6.0, 1.2 + 0.55 * len(stages)), height=5.0)
    ax = fig.add_subplot()
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    bars = []
    for part in MEMORY_PARTS:
        vals = [memory_parts(s.memory_breakdown_bytes)[part] / GiB for s in stages]
        bars.append(ax.bar(xs, vals, bottom=bottom, color=COLORS[part], width=0.7, label=MEMORY_LABELS[part],
                           edgecolor="white", linewidth=0.5))
        bottom = [b + v for b, v in zip(bottom, vals)]
    cap = estimate.memory_capacity_bytes / GiB
    lines = [ax.axhline(cap, color="black", linewidth=1.2, label=f"HBM {cap:.0f} GiB")]
    usable = estimate.usable_memory_bytes / GiB
    if estimate.memory_margin > 0:
        lines.append(ax.axhline(usable, color="#D62728", linestyle="--", linewidth=1.2,
                                label=f"usable {usable:.1f} GiB ({estimate.memory_margin:.0%} kept free)"))
    ax.set_ylim(0, max(cap, max(bottom)) * 1.18)
    label_h = _text_height(fig, ax, fontsize=8)
    line_ys = [cap] + ([usable] if estimate.memory_margin > 0 else [])
    for x, total in zip(xs, bottom):
        over = total > usable
        ax.text(x, label_y(total, line_ys, label_h), f"{total:.1f}", ha="center", va="bottom", fontsize=8,
                color="#D62728" if over else "black", fontweight="bold" if over else "normal")
    ax.set_xticks(xs, [str(s.rank) for s in stages])
    ax.set_xlabel("pipeline stage (rank)")
    ax.set_ylabel("peak memory per GPU (GiB)")
    title = "Peak memory per GPU by pipeline stage"
    if plan is not None:
        title += (f"\n{plan.layout()} dp{estimate.dp} mbs{plan.mbs} zero{plan.zero} "
                  f"{plan.recompute.label(plan.framework)}")
    ax.set_title(title, fontsize=11)
    ax.legend(handles=lines + bars[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9,
              frameon=False)  # parts listed top-down, as stacked
    fig.tight_layout()
    return fig


def label_y(total: float, line_ys: Sequence[float], height: float) -> float:
    """Bottom of a bar's total label, clear of every horizontal line (HBM, usable memory): just
    above the bar; else just inside the bar's top; else above the highest line it would cross."""
    pad = 0.15 * height

    def clear(y: float) -> bool:
        return not any(y - pad <= line <= y + height + pad for line in line_ys)

    for y in (total + pad, total - height - pad):
        if y >= 0 and clear(y):
            return y
    y = total + pad
    for line in sorted(line_ys):
        if not clear(y):
            y = max(y, line + 2 * pad)
    return y


def _text_height(fig, ax, fontsize: float) -> float:
    """Height of a line of text of `fontsize` points in the axes' data units (y)."""
    axes_px = ax.get_position().height * fig.get_figheight() * fig.dpi
    lo, hi = ax.get_ylim()
    return fontsize / 72 * fig.dpi * 1.25 / axes_px * (hi - lo)


# --------------------------------------------------------------------------- sweep


def plot_sweep(points: Sequence[SweepPoint], path: str | Path, runs: Sequence[dict | None] | None = None) -> Path:
    """The sweep's curves written to `path` (sweep_figure)."""
    return _save(sweep_figure(points, runs), path)


def sweep_figure(points: Sequence[SweepPoint], runs: Sequence[dict | None] | None = None):
    """tokens/s/GPU (left axis) and MFU (right axis) against the swept variable, each point labelled
    with its best layout; points without a plan are marked on the x axis. With `runs` (each point's
    whole-run block, autopar.cost.run), a second panel: days and GPU-hours to the token count, each
    point labelled with its goodput (more GPUs: fewer days, more interruptions). Needs matplotlib."""
    axis = swept_axis(points)
    fig = _figure(width=max(7.0, 1.6 * len(points)), height=8.4 if runs else 4.8)
    ax = fig.add_subplot(2, 1, 1) if runs else fig.add_subplot()
    xs = list(range(len(points)))
    ok = [i for i, p in enumerate(points) if p.fits]
    tps = [points[i].tokens_per_s_per_gpu for i in ok]
    ax.plot(ok, tps, marker="o", color=COLORS["forward"], label="tokens/s/GPU")
    for i, eff in zip(ok, (scaling_efficiency(points)[i] for i in ok)):
        p = points[i]
        ax.annotate(f"{p.plan.layout()}\n{eff:.0%} eff.", (i, p.tokens_per_s_per_gpu), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8)
    failed = [i for i, p in enumerate(points) if not p.fits]
    if failed:
        ax.plot(failed, [0] * len(failed), "x", color="#D62728", markersize=10, clip_on=False,
                label="no plan (does not fit or invalid)")
        for i in failed:
            ax.annotate("no plan", (i, 0), textcoords="offset points", xytext=(0, 10), ha="center", fontsize=8,
                        color="#D62728")
    ax.set_ylim(0, max(tps, default=1.0) * 1.3)
    ax.set_ylabel("tokens/s per GPU", color=COLORS["forward"])
    ax.set_xticks(xs, [str(p.value(axis)) for p in points])
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.set_xlabel(_axis_label(axis))
    ax2 = ax.twinx()
    ax2.plot(ok, [points[i].mfu * 100 for i in ok], marker="s", linestyle="--", color=COLORS["recompute"],
             label="MFU")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("MFU (%)", color=COLORS["recompute"])
    first = points[0]
    fixed = ", ".join(f"{k.replace('_', ' ')} {first.value(k)}" for k in ("gpus", "global_batch", "seq_len")
                      if k != axis and len({p.value(k) for p in points}) == 1)
    ref = next((p for p in points if p.fits), None)
    eff_note = f"\neff. = tokens/s/GPU ÷ that at {_point_label(axis, ref.value(axis))}" if ref else ""
    ax.set_title(f"{first.model} on {first.cluster}: best plan per point ({fixed}){eff_note}", fontsize=11)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    if runs:
        h3, l3 = _plot_runs(fig.add_subplot(2, 1, 2), points, runs, axis)
        h1, l1 = h1 + h3, l1 + l3
    fig.legend(h1 + h2, l1 + l2, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _plot_runs(ax, points: Sequence[SweepPoint], runs: Sequence[dict | None], axis: str):
    """Days to the token count (bars, 80 % band whiskers, goodput above) and GPU-hours (line, right axis)."""
    ok = [i for i, r in enumerate(runs) if r is not None]
    days = [runs[i]["days"] for i in ok]
    err = [[runs[i]["days"] - runs[i]["days_low"] for i in ok], [runs[i]["days_high"] - runs[i]["days"] for i in ok]]
    ax.bar(ok, days, yerr=err, color=COLORS["forward"], alpha=0.6, capsize=4, label="days (80 % band)")
    for i in ok:
        ax.annotate(f"goodput {runs[i]['goodput']:.1%}", (i, runs[i]["days_high"]), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=8)
    ax.set_ylabel("days")
    ax.set_ylim(0, max((runs[i]["days_high"] for i in ok), default=1.0) * 1.25)
    ax.set_xticks(range(len(points)), [str(p.value(axis)) for p in points])
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.set_xlabel(_axis_label(axis))
    tokens = next((runs[i]["train_tokens"] for i in ok), 0.0)
    ax.set_title(f"the whole run to {human_count(tokens)} tokens", fontsize=11)
    ax2 = ax.twinx()
    ax2.plot(ok, [runs[i]["gpu_hours"] for i in ok], marker="o", color=COLORS["recompute"], label="GPU-hours")
    ax2.set_ylim(0, max((runs[i]["gpu_hours"] for i in ok), default=1.0) * 1.3)
    ax2.set_ylabel("GPU-hours", color=COLORS["recompute"])
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    return h1 + h2, l1 + l2


def _point_label(axis: str, value: int) -> str:
    return f"{value} GPUs" if axis == "gpus" else f"{_axis_label(axis)} {value}"


def _axis_label(axis: str) -> str:
    return {"gpus": "GPUs", "global_batch": "global batch", "seq_len": "sequence length"}[axis]


# --------------------------------------------------------------------------- dispatch


def save_picture(kind: str, path: str | Path, *, plan: ParallelPlan | None = None,
                 estimate: Estimate | None = None, points: Sequence[SweepPoint] | None = None,
                 console: Console | None = None, runs: Sequence[dict | None] | None = None) -> str:
    """Write a picture of `kind` ("timeline": plan + estimate; "memory": estimate; "sweep": points).
    A path ending in .png/.svg/.pdf is written with matplotlib; with path "-", another suffix, or
    matplotlib missing, the terminal rendering is printed instead. Returns a one-line note."""
    if kind not in KINDS:
        raise ValueError(f"unknown picture kind {kind!r}; use one of {', '.join(KINDS)}")
    path_s = str(path)
    if path_s != "-" and Path(path_s).suffix.lower() in PICTURE_SUFFIXES:
        if matplotlib_available():
            if kind == "timeline":
                plot_timeline(plan, estimate, path_s)
            elif kind == "memory":
                plot_memory(estimate, path_s, plan)
            else:
                plot_sweep(points, path_s, runs)
            return f"wrote the {kind} picture to {path_s}"
        note = f"matplotlib is not installed, so the {kind} is drawn here instead of {path_s}; {INSTALL_HINT}"
    elif path_s == "-":
        note = ""
    else:
        note = f"{path_s} does not end in {', '.join(PICTURE_SUFFIXES)}, so the {kind} is drawn here instead"
    console = console or Console()
    console.print(terminal_picture(kind, plan=plan, estimate=estimate, points=points,
                                   width=console.width))
    return note


def terminal_picture(kind: str, *, plan: ParallelPlan | None = None, estimate: Estimate | None = None,
                     points: Sequence[SweepPoint] | None = None, width: int = 120):
    """The Rich renderable of a picture for a terminal `width` characters wide."""
    if kind == "timeline":
        chart_w = max(20, width - 12)
        tl = pipeline_timeline(plan, estimate, terminal_microbatches(plan, chart_w))
        return timeline_text(tl, chart_w)
    if kind == "memory":
        return memory_text(estimate, max(20, min(80, width - 30)))
    return Group(sweep_table(points))


def terminal_microbatches(plan: ParallelPlan, width: int) -> int:
    """Microbatches that leave each op about two characters: 2·m·vpp ops over ~(m + pp) op slots."""
    return max(1, width // (4 * plan.vpp) - plan.pp)


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global state)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(f"pictures need matplotlib: {INSTALL_HINT}, or pass the path '-' to draw in the "
                          "terminal") from None

    return Figure(figsize=(width, height), dpi=110)


def picture_bytes(kind: str, path: str | Path, *, plan: ParallelPlan | None = None,
                  estimate: Estimate | None = None, points: Sequence[SweepPoint] | None = None,
                  runs: Sequence[dict | None] | None = None) -> bytes:
    """The picture save_picture writes at a .png/.svg/.pdf `path`, rendered in memory (for a caller
    that writes it with its other outputs, all or none). Needs matplotlib."""
    if kind == "timeline":
        fig = timeline_figure(plan, estimate)
    elif kind == "memory":
        fig = memory_figure(estimate, plan)
    elif kind == "sweep":
        fig = sweep_figure(points, runs)
    else:
        raise ValueError(f"unknown picture kind {kind!r}; use one of {', '.join(KINDS)}")
    return _render(fig, path)


def _render(fig, path: str | Path) -> bytes:
    import io

    buf = io.BytesIO()
    import matplotlib

    # text stays text in an SVG (not one path per glyph): a small file whose words can be searched
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format=Path(path).suffix.lower().lstrip(".") or "png", bbox_inches="tight")
    return buf.getvalue()


def _save(fig, path: str | Path) -> Path:
    """Render to memory, then write atomically (autopar.io): a failed write leaves no partial picture
    and its OSError is one line. (The CLI writes its pictures with its other outputs: picture_bytes.)"""
    from autopar.io import write_output

    out = Path(path)
    write_output(out, _render(fig, out), force=True, what="picture")
    return out


def _lighter(color: str, amount: float) -> str:
    """Blend a #RRGGBB colour toward white by `amount` (0..1)."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02X}" for c in rgb)


def _legend_handles(parts: list[str], labels: dict[str, str]):
    from matplotlib.patches import Patch

    return [Patch(facecolor=COLORS[p], label=labels.get(p, p)) for p in parts]
