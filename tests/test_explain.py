"""`explain`: each stage's step-time row sums to the step and the bottleneck row is the estimate's
own breakdown; every neighbour's verdict and reason agree with an independent estimate of that
neighbour (llama3-70b on 64 × dgx-h100, seq 8192, global batch 128)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from autopar.api import estimate_plan, make_plan
from autopar.errors import InvalidPlanError
from autopar.report.explain import (TERM_LABELS, TIME_TERMS, explain, recompute_steps, render_explanation,
                                    zero_steps)
from autopar.report.tables import gib
from autopar.schema.plan import Recompute

MODEL, CLUSTER, GPUS, SEQ, GBS, MARGIN = "llama3-70b", "dgx-h100", 64, 8192, 128, 0.1


def _plan(**kw):
    return make_plan(global_batch=GBS, seq_len=SEQ, **kw)


@pytest.fixture(scope="module")
def tp8pp4():
    return explain(MODEL, CLUSTER, GPUS, _plan(tp=8, pp=4), memory_margin=MARGIN)


@pytest.mark.parametrize("fields", [dict(tp=8, pp=4), dict(tp=8, pp=4, vpp=2), dict(tp=1, pp=1),
                                    dict(tp=4, pp=2, cp=2, recompute={"mode": "full"}), dict(tp=8, pp=8, mbs=2)])
def test_each_stage_row_sums_to_the_step(fields):
    ex = explain(MODEL, CLUSTER, GPUS, _plan(**fields), memory_margin=MARGIN)
    step = ex.estimate.step_time_s
    assert len(ex.stage_times) == ex.plan.pp
    for row in ex.stage_times:
        assert set(row.terms_s) == set(TIME_TERMS)
        assert abs(sum(row.terms_s.values()) - step) <= 1e-9 * step
        assert row.terms_s["bubble"] >= -1e-9 * step
    # The bottleneck rank's row is the estimate's own time breakdown.
    neck = ex.stage_times[ex.bottleneck_rank].terms_s
    for k in TIME_TERMS:
        assert neck[k] == pytest.approx(ex.estimate.time_breakdown_s[k], rel=1e-9, abs=1e-12 * step)


def test_stage_memory_is_the_estimates(tp8pp4):
    e = tp8pp4.estimate
    for row, s in zip(tp8pp4.stage_memory, e.stages):
        assert row.total_bytes == s.memory_bytes
        assert row.usable_bytes == pytest.approx(e.memory_capacity_bytes * (1 - MARGIN))
        assert sum(row.breakdown_bytes.values()) == pytest.approx(s.memory_bytes, rel=1e-12)


def test_doubling_tp_past_the_node_is_invalid(tp8pp4):
    alt = next(a for a in tp8pp4.alternatives if a.axis == "tp" and a.plan.tp == 16)
    assert alt.verdict == "invalid" and alt.estimate is None
    assert "tp 16 exceeds the 8 GPUs of the scale-up domain" in alt.reason
    assert "(dp 2→1)" in alt.name


def test_neighbours_are_the_expected_moves(tp8pp4):
    got = {(a.axis, a.plan.tp, a.plan.pp, a.plan.mbs, a.plan.zero, a.plan.recompute.mode) for a in tp8pp4.alternatives}
    assert got == {("tp", 16, 4, 1, 1, "selective"), ("tp", 4, 4, 1, 1, "selective"),
                   ("pp", 8, 8, 1, 1, "selective"),
                   ("pp", 8, 2, 1, 1, "selective"), ("mbs", 8, 4, 2, 1, "selective"),
                   ("cp", 8, 4, 1, 1, "selective"), ("vpp", 8, 4, 1, 1, "selective"),  # cp 1→2, vpp 1→2
                   # a dense model: no ep or etp neighbour
                   ("recompute", 8, 4, 1, 1, "none"), ("recompute", 8, 4, 1, 1, "full"),
                   ("zero", 8, 4, 1, 0, "selective"), ("zero", 8, 4, 1, 2, "selective")}  # 2: Megatron-FSDP


def test_every_verdict_matches_an_independent_estimate(tp8pp4):
    base = estimate_plan(MODEL, CLUSTER, GPUS, _plan(tp=8, pp=4), memory_margin=MARGIN)
    assert base.fits
    usable = base.memory_capacity_bytes * (1 - MARGIN)
    for a in tp8pp4.alternatives:
        if a.verdict == "invalid":
            with pytest.raises(InvalidPlanError):
                estimate_plan(MODEL, CLUSTER, GPUS, a.plan, memory_margin=MARGIN)
            continue
        e = estimate_plan(MODEL, CLUSTER, GPUS, a.plan, memory_margin=MARGIN)
        assert e.step_time_s == a.estimate.step_time_s
        faster = e.step_time_s < base.step_time_s
        if not e.fits:
            short = e.peak_memory_bytes - usable
            fullest = max(e.stages, key=lambda s: s.memory_bytes).rank
            assert f"OOM on stage {fullest} by {gib(short)}" in a.reason
            assert a.verdict == ("faster_unfit" if faster else "oom")
            assert a.shortfall_bytes == pytest.approx(short)
        elif abs(e.step_time_s / base.step_time_s - 1) <= 1e-9:  # e.g. zero 1 -> 2 at equal step time
            assert a.verdict == "tie" and not a.wins
        else:
            assert a.verdict == ("wins" if faster else "slower")
            assert a.wins == faster
        if a.verdict in ("slower", "wins"):
            sign = 1 if a.verdict == "slower" else -1
            deltas = {k: sign * (e.time_breakdown_s[k] - base.time_breakdown_s[k]) for k in TIME_TERMS}
            main = max(deltas, key=deltas.get)
            assert f"{'+' if sign > 0 else '−'}" in a.reason and TERM_LABELS[main] in a.reason
            assert a.reason.index(TERM_LABELS[main]) == min(a.reason.index(TERM_LABELS[k]) for k in TIME_TERMS
                                                            if TERM_LABELS[k] in a.reason)


def test_no_recompute_at_tp1_pp1_is_oom_by_the_exact_shortfall():
    ex = explain(MODEL, CLUSTER, GPUS, _plan(tp=1, pp=1), memory_margin=MARGIN)
    alt = next(a for a in ex.alternatives if a.axis == "recompute" and a.plan.recompute.mode == "none")
    e = estimate_plan(MODEL, CLUSTER, GPUS, _plan(tp=1, pp=1, recompute={"mode": "none"}), memory_margin=MARGIN)
    short = e.peak_memory_bytes - e.memory_capacity_bytes * (1 - MARGIN)
    assert not e.fits and short > 0
    assert f"OOM on stage 0 by {gib(short)}" in alt.reason
    assert alt.shortfall_bytes == pytest.approx(short) and alt.oom_rank == 0
    assert not ex.estimate.fits and not any(a.wins for a in ex.alternatives if a.estimate and not a.estimate.fits)


def test_a_neighbour_that_fits_wins_over_a_plan_that_does_not():
    # tp4 pp2 does not fit; doubling tp and full recompute do, so they win whatever their speed.
    ex = explain(MODEL, CLUSTER, GPUS, _plan(tp=4, pp=2), memory_margin=MARGIN)
    assert not ex.estimate.fits
    fitting = [a for a in ex.alternatives if a.estimate is not None and a.estimate.fits]
    assert {a.name.split(" (")[0] for a in fitting} >= {"tp 4→8", "recompute selective(core_attn)→full"}
    for a in ex.alternatives:
        assert a.wins == (a in fitting)
        if a.wins:
            assert "fits where the chosen plan does not" in a.reason


def test_recompute_ladder_and_zero_steps():
    labels = lambda rs: [r.label() for r in rs]  # noqa: E731
    assert labels(recompute_steps(Recompute(mode="none"))) == ["selective(core_attn)"]
    assert labels(recompute_steps(Recompute(mode="selective"))) == ["none", "full"]
    assert labels(recompute_steps(Recompute(mode="full"))) == ["selective(core_attn)"]
    assert labels(recompute_steps(Recompute(mode="full", num_layers=3))) == ["selective(core_attn)", "full"]
    assert zero_steps(1, "megatron") == [0, 2] and zero_steps(0, "megatron") == [1]  # 2/3: Megatron-FSDP
    assert zero_steps(0, "torchtitan") == [2] and zero_steps(3, "torchtitan") == [2]
    assert zero_steps(2, "deepspeed") == [1, 3]


def test_dp_absorbs_the_moved_factor(tp8pp4):
    for a in tp8pp4.alternatives:
        if a.axis in ("tp", "pp") and a.verdict != "invalid":
            assert a.plan.tp * a.plan.pp * a.plan.cp * a.estimate.dp == GPUS


def test_to_dict_is_json_with_stable_keys(tp8pp4):
    d = json.loads(json.dumps(tp8pp4.to_dict()))
    assert set(d) == {"model", "cluster", "gpus", "memory_margin", "bottleneck_rank", "plan", "estimate",
                      "stage_time_s", "stage_memory_bytes", "alternatives"}
    assert set(d["stage_time_s"][0]) == {"rank", "layers", "total", *TIME_TERMS}
    assert set(d["alternatives"][0]) == {"name", "axis", "layout", "change", "verdict", "wins", "reason", "violations",
                                         "step_time_s", "step_change", "fits", "peak_memory_bytes", "shortfall_bytes",
                                         "oom_rank"}
    tp16 = next(a for a in d["alternatives"] if a["change"] == {"tp": 16})
    assert tp16["step_time_s"] is None and tp16["violations"]


def test_render_names_every_stage_and_alternative(tp8pp4):
    console = Console(record=True, width=250)
    render_explanation(console, tp8pp4)
    text = console.export_text()
    for a in tp8pp4.alternatives:
        assert a.name in text
    assert "★ wins" in text or not any(a.wins for a in tp8pp4.alternatives)


def test_an_invalid_plan_is_refused():
    with pytest.raises(InvalidPlanError, match="exceeds the 8 GPUs of the scale-up domain"):
        explain(MODEL, CLUSTER, GPUS, _plan(tp=16, pp=4))


@pytest.mark.parametrize("model,gpus,gbs,seq", [("llama3-8b", 16, 64, 4096), ("llama3-70b", 64, 128, 8192)])
def test_no_neighbour_in_the_search_space_beats_the_searched_best(model, gpus, gbs, seq):
    from autopar.api import search_plans

    plan, est = search_plans(model, CLUSTER, gpus, seq, gbs, top=1, memory_margin=MARGIN).plans[0]
    ex = explain(model, CLUSTER, gpus, plan, memory_margin=MARGIN)
    assert ex.estimate.step_time_s == est.step_time_s
    for a in ex.alternatives:
        # The search is exact over the enumerated space (default layer split, recompute none /
        # selective / full, Megatron zero 0-2: autopar.search.space.zero_options); only a
        # neighbour outside it (a refined split, full(K) or Megatron-FSDP zero 3) may win.
        in_space = (a.plan.layers_per_stage is None and a.plan.recompute.num_layers is None
                    and a.plan.zero < 3)
        assert not (a.wins and in_space), (a.name, a.reason)


def test_doubling_pp_under_interleaving_keeps_the_virtual_stages():
    from autopar.report.explain import neighbours

    plan = _plan(tp=4, pp=4, vpp=20)  # 80 layers: one per virtual stage
    moves = {name: alt for name, axis, alt in neighbours(plan, GPUS, num_layers=80) if axis == "pp"}
    assert set(moves) == {"pp 4→8 (dp 4→2, vpp 20→10)", "pp 4→2 (dp 4→8)"}
    assert (moves["pp 4→8 (dp 4→2, vpp 20→10)"].vpp, moves["pp 4→2 (dp 4→8)"].vpp) == (10, 20)
    assert next(alt for name, axis, alt in neighbours(_plan(tp=8, pp=2, vpp=2), GPUS) if alt.pp == 1).vpp == 1


def test_an_eager_torchtitan_plan_is_shown_what_compiling_gives():
    plan = make_plan(global_batch=16, seq_len=8192, framework="torchtitan", zero=3, torch_compile=False,
                     recompute={"mode": "selective"})
    ex = explain("llama3-8b", "grandteton-h100-96gb", 8, plan, memory_margin=MARGIN)
    alt = next(a for a in ex.alternatives if a.axis == "torch_compile")
    compiled = estimate_plan("llama3-8b", "grandteton-h100-96gb", 8, plan.model_copy(update={"torch_compile": True}),
                             memory_margin=MARGIN)
    assert alt.name == "torch.compile off→on" and alt.plan.torch_compile
    assert alt.estimate.step_time_s == pytest.approx(compiled.step_time_s, rel=1e-12)
    assert compiled.step_time_s < ex.estimate.step_time_s and alt.wins
    assert not any(a.axis == "torch_compile" for a in explain(MODEL, CLUSTER, GPUS, _plan(tp=8, pp=4)).alternatives)
