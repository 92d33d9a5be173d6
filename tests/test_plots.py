"""Pictures: the timeline is the event simulation of the plan's schedule (2·m·vpp bars per rank,
extent = simulated makespan, recompute and p2p where the schedule puts them); PNGs are written
when matplotlib is installed; terminal renderings show every rank and stage; without matplotlib
the dispatcher falls back to the terminal and says how to install the extra."""

from __future__ import annotations

import sys

import pytest
from rich.console import Console

from autopar.api import estimate_plan, make_plan
from autopar.cost.pipeline import exposed_p2p_hops, simulate_1f1b, simulate_interleaved
from autopar.report.plots import (INSTALL_HINT, MAX_MICROBATCHES, memory_text, pipeline_timeline, save_picture,
                                  simulated_microbatches, terminal_picture, timeline_text)
from autopar.report.sweep import SweepPoint, bar_glyphs

MODEL, CLUSTER, GPUS = "llama3-70b", "dgx-h100", 64
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _case(**kw):
    plan = make_plan(seq_len=8192, **{"global_batch": 128, **kw})
    return plan, estimate_plan(MODEL, CLUSTER, GPUS, plan, memory_margin=0.1)


CASES = {"1f1b": dict(tp=8, pp=4), "interleaved": dict(tp=8, pp=4, vpp=2, global_batch=32),
         "no pipeline": dict(tp=8, pp=1, recompute={"mode": "full"}),
         "pp8": dict(tp=8, pp=8, global_batch=64, recompute={"mode": "full"})}


@pytest.mark.parametrize("name", CASES)
def test_timeline_is_the_simulated_schedule(name):
    plan, est = _case(**CASES[name])
    tl = pipeline_timeline(plan, est)
    m, p, v = est.num_microbatches, plan.pp, plan.vpp
    assert tl.num_microbatches == m <= MAX_MICROBATCHES and not tl.truncated
    for r in range(p):
        assert len(tl.bars_of(r)) == 2 * m * v
    # Independent simulation from the stage estimates, each rank's time split evenly over its chunks.
    f = [est.stages[i % p].fwd_s / v for i in range(p * v)]
    b = [est.stages[i % p].bwd_s / v for i in range(p * v)]
    p2p = est.time_breakdown_s["pp_comm"] / exposed_p2p_hops(p, m, v) if p > 1 else 0.0
    sim = simulate_1f1b(f, b, m, p2p) if v == 1 else simulate_interleaved(f, b, m, v, p2p)
    assert tl.step_s == sim.step_s
    assert max(x.end_s for x in tl.bars) - min(x.start_s for x in tl.bars) == pytest.approx(sim.step_s, rel=1e-12)
    for x in tl.bars:
        stage = est.stages[x.rank]
        assert x.recompute_s == (stage.recompute_s / v if x.kind == "B" else 0.0)
        parts = x.parts()
        assert parts[0][1] == x.start_s and parts[-1][2] == pytest.approx(x.end_s)
        assert sum(e - a for _, a, e in parts) == pytest.approx(x.end_s - x.start_s)


def test_p2p_sends_arrive_before_the_op_that_needs_them():
    plan, est = _case(**CASES["interleaved"])
    tl = pipeline_timeline(plan, est)
    m, p, v = tl.num_microbatches, tl.pp, tl.vpp
    assert tl.p2p_s > 0
    assert len(tl.transfers) == 2 * m * (p * v - 1)  # every virtual-stage boundary, both directions
    start = {(x.kind, x.rank, x.microbatch, x.chunk): x.start_s for x in tl.bars}
    for t in tl.transfers:
        assert t.end_s - t.start_s == pytest.approx(tl.p2p_s)
        starts = [s for (k, r, j, _), s in start.items() if (k, r, j) == (t.kind, t.rank, t.microbatch)]
        assert any(s >= t.end_s - 1e-12 for s in starts)


def test_many_microbatches_are_capped_and_said():
    plan, est = _case(tp=8, pp=4, vpp=2, global_batch=1024)
    assert est.num_microbatches > MAX_MICROBATCHES
    tl = pipeline_timeline(plan, est)
    assert tl.truncated and tl.num_microbatches <= MAX_MICROBATCHES and tl.num_microbatches % plan.pp == 0
    assert f"of {est.num_microbatches} microbatches" in tl.note
    assert all(len(tl.bars_of(r)) == 2 * tl.num_microbatches * plan.vpp for r in range(plan.pp))
    assert simulated_microbatches(100, 6, 2, 64) == 60 and simulated_microbatches(100, 6, 1, 64) == 64
    assert simulated_microbatches(8, 4, 2, 64) == 8


@pytest.mark.parametrize("name", ["1f1b", "pp8"])
def test_terminal_renderings_show_every_rank_and_stage(name):
    plan, est = _case(**CASES[name])
    text = timeline_text(pipeline_timeline(plan, est), width=80).plain
    rows = [line for line in text.splitlines() if line.lstrip().startswith("rank ")]
    assert len(rows) == plan.pp
    for r in range(plan.pp):
        assert f"rank {r} │" in text
    assert all(len(row.split("│")[1]) == 80 for row in rows)
    assert set("".join(row.split("│")[1] for row in rows)) <= set("FfBbRr~·")
    mem = memory_text(est, width=40).plain  # the estimate carries its margin (0.1)
    for r in range(plan.pp):
        assert f"stage {r:>2} " in mem
    assert "┃" in mem


def test_terminal_timeline_of_the_real_step_has_forwards_backwards_and_a_bubble():
    plan, est = _case(**CASES["1f1b"])
    text = timeline_text(pipeline_timeline(plan, est, max_microbatches=8), width=120).plain
    row0 = next(line for line in text.splitlines() if line.startswith("rank 0")).split("│")[1]
    row3 = next(line for line in text.splitlines() if line.startswith("rank 3")).split("│")[1]
    assert row0[0] in "Ff" and row3[0] == "·"  # the last rank waits for the first forward to arrive
    assert "B" in row0.upper() and "·" in row0


def _points():
    plan, est = _case(**CASES["1f1b"])
    return [SweepPoint(MODEL, CLUSTER, 32, 128, 8192, reason="no plan fits: 3.0 GiB over; use more GPUs"),
            SweepPoint(MODEL, CLUSTER, 64, 128, 8192, plan, est)]


def test_pngs_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    for name in ("1f1b", "interleaved"):
        plan, est = _case(**CASES[name])
        out = tmp_path / f"timeline-{name}.png"
        assert "wrote" in save_picture("timeline", out, plan=plan, estimate=est)
        assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000
    plan, est = _case(**CASES["1f1b"])
    out = tmp_path / "memory.png"
    save_picture("memory", out, plan=plan, estimate=est)
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 5_000
    out = tmp_path / "sub" / "sweep.png"
    save_picture("sweep", out, points=_points())
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 5_000


def test_without_matplotlib_the_terminal_rendering_is_printed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    plan, est = _case(**CASES["1f1b"])
    console = Console(record=True, width=120)
    out = tmp_path / "timeline.png"
    note = save_picture("timeline", out, plan=plan, estimate=est, console=console)
    assert INSTALL_HINT in note and "matplotlib is not installed" in note and not out.exists()
    text = console.export_text()
    assert all(f"rank {r}" in text for r in range(plan.pp))


def test_dash_prints_each_kind():
    plan, est = _case(**CASES["1f1b"])
    for kind, kw in (("timeline", dict(plan=plan, estimate=est)), ("memory", dict(estimate=est)),
                     ("sweep", dict(points=_points()))):
        console = Console(record=True, width=160)
        assert save_picture(kind, "-", console=console, **kw) == ""
        text = console.export_text()
        assert text.strip()
        if kind == "sweep":
            assert "no plan fits" in text and "100.0%" in text


def test_unknown_kind_and_suffix():
    plan, est = _case(**CASES["1f1b"])
    with pytest.raises(ValueError, match="unknown picture kind"):
        save_picture("pie", "-", plan=plan, estimate=est)
    console = Console(record=True, width=120)
    note = save_picture("memory", "memory.txt", estimate=est, console=console)
    assert "does not end in .png" in note and "stage  0" in console.export_text()


def test_terminal_picture_fits_narrow_terminals():
    plan, est = _case(**CASES["1f1b"])
    console = Console(record=True, width=60)
    console.print(terminal_picture("timeline", plan=plan, estimate=est, width=60))
    assert all(len(line) <= 60 for line in console.export_text().splitlines())


def test_bar_glyphs():
    assert bar_glyphs(1.0, 4) == "████"
    assert bar_glyphs(0.0, 4) == "    "
    assert bar_glyphs(0.5, 3) == "█▌ "
    assert bar_glyphs(2.0, 2) == "██"


def test_plot_functions_name_the_extra_without_matplotlib(tmp_path, monkeypatch):
    from autopar.report.plots import plot_memory

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    _, est = _case(**CASES["1f1b"])
    with pytest.raises(ImportError, match=r"autopar\[plot\]"):
        plot_memory(est, tmp_path / "m.png")


# ----------------------------------------------------------------------------- legibility (issue 15)


def test_chunk_ops_run_back_to_back_become_one_bar_at_high_vpp(tmp_path):
    """tp4·pp4·v20·cp2 (Llama-3-70B): the runs partition every rank's ops in time order, never mix
    kinds unless marked steady, never span an idle gap wider than the tolerance, and cut the
    warm-up forwards of the last rank to one bar per group of pp microbatches."""
    from autopar.report.plots import STEADY, op_runs, plot_timeline

    plan, est = _case(tp=4, pp=4, vpp=20, cp=2, recompute={"mode": "none"})
    tl = pipeline_timeline(plan, est, max_microbatches=plan.pp)
    gap = tl.step_s / 1000
    runs = op_runs(tl, min_gap_s=gap)
    for r in range(tl.pp):
        bars, mine = tl.bars_of(r), [x for x in runs if x.rank == r]
        assert sum(x.ops for x in mine) == len(bars) == 2 * tl.num_microbatches * tl.vpp
        assert all(a.end_s <= b.start_s for a, b in zip(mine, mine[1:]))
        assert all(x.kind in ("F", "B") for x in mine)  # no min_width: nothing is merged as steady
        i = 0
        for x in mine:  # each run is consecutive ops of its kind, joined across gaps ≤ the tolerance
            ops = bars[i:i + x.ops]
            i += x.ops
            assert {o.kind for o in ops} == {x.kind} and (ops[0].start_s, ops[-1].end_s) == (x.start_s, x.end_s)
            assert all(b.start_s - a.end_s <= gap for a, b in zip(ops, ops[1:]))
        assert len(mine) < len(bars) / 3  # legible: far fewer bars than chunk-ops
    # interleaving: the last rank runs pp microbatches of chunk 1 back to back, then waits for chunk 2
    # (how long depends on the link speeds, so without a tolerance: only back-to-back ops join)
    last = [x for x in op_runs(tl) if x.rank == tl.pp - 1 and x.kind == "F"]
    assert last[0].ops == tl.pp and last[0].chunks == (0, 0) and last[1].chunks[0] == 1
    # Alternating narrow runs merge into steady bars when a width is asked for.
    steady = op_runs(tl, min_gap_s=gap, min_width_s=tl.step_s)
    assert any(x.kind == STEADY for x in steady)
    assert sum(x.ops for x in steady) == len(tl.bars)
    pytest.importorskip("matplotlib")
    out = plot_timeline(plan, est, tmp_path / "v20.png")
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("total", [60.0, 70.5, 71.6, 72.0, 72.7, 74.0, 78.0, 79.5, 80.0, 81.0, 95.0, 1.0])
def test_memory_total_label_clears_the_hbm_and_usable_lines(total):
    from autopar.report.plots import label_y

    lines, h = [80.0, 72.0], 3.0  # HBM and usable (10 % margin) in GiB; label ≈ 3 GiB tall
    y = label_y(total, lines, h)
    assert y >= 0
    assert not any(y <= line <= y + h for line in lines)
    assert abs(y - total) <= 2 * h or y > max(line for line in lines if line >= total - h)  # near its bar
