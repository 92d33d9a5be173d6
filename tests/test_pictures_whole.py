"""Pictures that agree with the tables (issue 32): the timeline's title and axis end at the tables'
step, an interleaved schedule draws every microbatch, no text sits over a bar, and an SVG keeps
its text as text (small, searchable)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from autopar import api  # noqa: E402
from autopar.report.plots import (MAX_FIGURE_OPS, _pipeline_s, figure_microbatches, picture_bytes,  # noqa: E402
                                  pipeline_timeline, timeline_figure)
from autopar.report.tables import seconds  # noqa: E402
from autopar.schema.plan import ParallelPlan, Recompute  # noqa: E402


def _case(model: str, gpus: int, gbs: int, **kw):
    plan = ParallelPlan(global_batch=gbs, seq_len=8192, recompute=Recompute(mode="none"), **kw)
    return plan, api.estimate_plan(model, "dgx-h100", gpus, plan)


@pytest.fixture(scope="module")
def llama70b():
    return _case("llama3-70b", 64, 128, tp=4, pp=4, cp=2)


@pytest.fixture(scope="module")
def llama405b_interleaved():
    return _case("llama3.1-405b", 16384, 2048, tp=8, pp=32, vpp=2, cp=4)


def test_title_and_axis_are_the_tables_step(llama70b):
    """The event simulation's makespan is not the closed form's pipeline time (17.475 s against
    17.511 s here): the title states the estimate's numbers and the axis ends at its step."""
    plan, est = llama70b
    tl = pipeline_timeline(plan, est, max_microbatches=figure_microbatches(plan, est.num_microbatches))
    assert f"pipeline {seconds(_pipeline_s(est))} of a {seconds(est.step_time_s)} step" in tl.title
    ax = timeline_figure(plan, est).axes[0]
    assert ax.get_xlim()[1] == pytest.approx(est.step_time_s, rel=1e-9)
    assert not ax.texts  # no label over a bar


def test_interleaved_timeline_draws_every_microbatch(llama405b_interleaved):
    plan, est = llama405b_interleaved
    assert est.num_microbatches == 128 and 2 * 128 * plan.vpp * plan.pp <= MAX_FIGURE_OPS
    m = figure_microbatches(plan, est.num_microbatches)
    assert m == 128
    tl = pipeline_timeline(plan, est, max_microbatches=m)
    assert not tl.truncated and len(tl.bars) == 2 * 128 * plan.vpp * plan.pp  # 16,384 chunk-ops
    assert {b.microbatch for b in tl.bars} == set(range(128))
    ax = timeline_figure(plan, est).axes[0]
    assert ax.get_xlim()[1] == pytest.approx(est.step_time_s, rel=1e-9) and not ax.texts


def test_figure_microbatches_cuts_only_past_the_op_limit():
    """Hand-worked: pp 8, vpp 4 has 64 ops per microbatch, so MAX_FIGURE_OPS (131,072) holds 2,048
    microbatches; 4,096 are cut to 2,048 (a multiple of pp)."""
    plan = ParallelPlan(tp=1, pp=8, vpp=4, global_batch=4096, seq_len=4096)
    assert figure_microbatches(plan, 1000) == 1000
    assert figure_microbatches(plan, 4096) == 2048


def test_svg_keeps_text_as_text_and_is_small(llama405b_interleaved):
    plan, est = llama405b_interleaved
    svg = picture_bytes("timeline", "t.svg", plan=plan, estimate=est).decode()
    assert "<text" in svg and "interleaved 1F1B" in svg  # the title as words, not glyph outlines
    assert 'id="DejaVuSans-' not in svg  # no font glyphs embedded as paths
    assert len(svg) < 400_000  # the bars are one embedded image, not 16,384 paths
