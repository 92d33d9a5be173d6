"""Pipeline schedules: event simulation vs closed forms (Narayanan et al. SC'21 §2.2), with
hand-worked schedules, bounds on random instances, and a timing budget."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost.pipeline import (
    Op,
    PipelineTimes,
    bubble_fraction_1f1b,
    bubble_fraction_interleaved,
    exposed_p2p_hops,
    pipeline_step_s,
    simulate_1f1b,
    simulate_interleaved,
)

EPS = 1e-9


# The estimate's closed form (the only one), called the two ways these tests use it.
def step_time_1f1b_closed_s(fwd_s, bwd_s, m, p2p_s=0.0):
    """pipeline_step_s at vpp 1: Σ(f + b) + (m − 1)·max(f + b) + exposed_p2p_hops(p, m, 1)·p2p."""
    base, p2p = pipeline_step_s(fwd_s, bwd_s, m, 1, p2p_s)
    return base + p2p


def step_time_interleaved_closed_s(fwd_s, bwd_s, p, m, vpp, p2p_s=0.0):
    """pipeline_step_s on p equal ranks (per-rank full-microbatch f, b): (m + (p − 1)/vpp)(f + b) + 2(p·vpp − 1)·p2p."""
    base, p2p = pipeline_step_s([fwd_s] * p, [bwd_s] * p, m, vpp, p2p_s)
    return base + p2p


def _uniform(p: int, f: float, b: float) -> tuple[list[float], list[float]]:
    return [f] * p, [b] * p


def _check_schedule(times: PipelineTimes, fwd_s, bwd_s, p: int, m: int, vpp: int = 1) -> None:
    """Ops on a rank never overlap; every op starts after its dependency."""
    assert len(times.ops) == 2 * m * p * vpp
    end = {(op.kind, op.chunk * p + op.rank, op.microbatch): op.end_s for op in times.ops}
    last_v = p * vpp - 1
    for rank in range(p):
        rank_ops = [op for op in times.ops if op.rank == rank]
        for before, after in zip(rank_ops, rank_ops[1:]):
            assert after.start_s >= before.end_s - EPS
    for op in times.ops:
        v = op.chunk * p + op.rank
        assert op.end_s - op.start_s == pytest.approx((fwd_s if op.kind == "F" else bwd_s)[v])
        if op.kind == "F" and v > 0:
            assert op.start_s >= end[("F", v - 1, op.microbatch)] - EPS
        if op.kind == "B":
            dep = ("F", v, op.microbatch) if v == last_v else ("B", v + 1, op.microbatch)
            assert op.start_s >= end[dep] - EPS


# ----------------------------------------------------------------------------- 1F1B, uniform


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 16])
def test_uniform_1f1b_simulation_equals_closed_form(p, m):
    fwd_s, bwd_s = _uniform(p, 1.0, 2.0)
    times = simulate_1f1b(fwd_s, bwd_s, m)
    assert times.step_s == pytest.approx(step_time_1f1b_closed_s(fwd_s, bwd_s, m), abs=EPS)
    assert times.step_s == pytest.approx((m + p - 1) * 3.0, abs=EPS)
    _check_schedule(times, fwd_s, bwd_s, p, m)


def test_uniform_1f1b_hand_worked_bubble():
    # p=4, m=8, f=1, b=2: the last stage runs F0 at t=3 (after 3 forwards upstream) and then
    # back-to-back F/B for 8·3 = 24 s; the last backward climbs back in 3·2 = 6 s:
    # step = 3 + 24 + 6 = 33 = (m + p - 1)·(f + b). Ideal = m·(f + b) = 24, bubble = 9.
    times = simulate_1f1b([1.0] * 4, [2.0] * 4, 8)
    assert times.step_s == pytest.approx(33.0)
    assert times.busy_s_by_rank == pytest.approx((24.0,) * 4)
    assert times.bubble_s == pytest.approx(9.0)
    assert times.bubble_s / 24.0 == pytest.approx(bubble_fraction_1f1b(4, 8)) == 3 / 8


def test_1f1b_warmup_order_matches_megatron():
    # p=4, m=8: stage 0 runs 3 warm-up forwards, stage 3 none; then F/B alternate.
    ops = simulate_1f1b([1.0] * 4, [2.0] * 4, 8).ops
    stage0 = [(op.kind, op.microbatch) for op in ops if op.rank == 0]
    stage3 = [(op.kind, op.microbatch) for op in ops if op.rank == 3]
    assert stage0[:6] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4)]
    assert stage0[-3:] == [("B", 5), ("B", 6), ("B", 7)]
    assert stage3[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_bubble_fractions():
    assert bubble_fraction_1f1b(8, 32) == pytest.approx(7 / 32)
    assert bubble_fraction_interleaved(8, 32, 4) == pytest.approx(7 / 128)
    assert bubble_fraction_interleaved(8, 32, 1) == bubble_fraction_1f1b(8, 32)


# ----------------------------------------------------------------------------- 1F1B, p2p


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2])
def test_uniform_1f1b_p2p_adds_two_sends_per_boundary_when_m_le_2(p, m):
    fwd_s, bwd_s = _uniform(p, 1.0, 2.0)
    base_s = simulate_1f1b(fwd_s, bwd_s, m).step_s
    step_s = simulate_1f1b(fwd_s, bwd_s, m, p2p_s=0.25).step_s
    assert step_s == pytest.approx(base_s + 2 * (p - 1) * 0.25)
    assert step_s == pytest.approx(step_time_1f1b_closed_s(fwd_s, bwd_s, m, 0.25))


def test_uniform_1f1b_p2p_round_trip_stalls_hand_worked():
    # p=2, m=4, f=b=1, p2p=d. Orders: stage 0 F0 F1 B0 F2 B1 F3 B2 B3, stage 1 F0 B0 F1 B1 ...
    # s0: F0[0,1] F1[1,2]; s1: F0[1+d,2+d] B0[2+d,3+d] F1[3+d,4+d] B1[4+d,5+d]
    # s0: B0[3+2d,4+2d] F2[4+2d,5+2d]; s1: F2 waits for it: [5+3d,6+3d] B2[6+3d,7+3d]
    # s0: B1[5+2d,6+2d] F3[6+2d,7+2d]; s1: F3[7+3d,8+3d] B3[8+3d,9+3d]
    # s0: B2[7+4d,8+4d] B3[9+4d,10+4d]  -> step 10 + 4d: with p2p the 2 microbatches in flight on
    # stage 0 no longer cover one round trip. The closed form counts those sends too:
    # exposed_p2p_hops(2, 4, 1) = 2 + 2·3 − 2·(⌊2/2⌋ + 1) = 4.
    d = 0.5
    step_s = simulate_1f1b([1.0, 1.0], [1.0, 1.0], 4, p2p_s=d).step_s
    assert step_s == pytest.approx(10 + 4 * d)
    assert exposed_p2p_hops(2, 4, 1) == 4
    assert step_time_1f1b_closed_s([1.0, 1.0], [1.0, 1.0], 4, d) == pytest.approx(10 + 4 * d)


def test_per_boundary_p2p_list():
    # m=1: a single microbatch walks down and back up: sum(f + b) + 2·sum(p2p).
    step_s = simulate_1f1b([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 1, p2p_s=[0.1, 0.3]).step_s
    assert step_s == pytest.approx(9.0 + 2 * 0.4)
    with pytest.raises(ValueError, match="per-boundary"):
        simulate_1f1b([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 1, p2p_s=[0.1])


# ----------------------------------------------------------------------------- 1F1B, unequal


def test_nonuniform_hand_worked_below_closed_form():
    # p=2, m=2, stage 0: f=2, b=3 (embedding-heavy), stage 1: f=1, b=2.
    # Orders: stage 0 (1 warm-up) F0 F1 B0 B1; stage 1 F0 B0 F1 B1.
    # s0: F0[0,2] F1[2,4]; s1: F0[2,3] B0[3,5] F1[5,6] (F1 arrived at 4, rank busy to 5) B1[6,8]
    # s0: B0[5,8] (needs s1 B0 at 5) B1[8,11] (needs s1 B1 at 8)  -> step 11.
    # Closed form: (5 + 3) + (2 - 1)·max(5, 3) = 13 ≥ 11: the slow stage 0 overlaps.
    times = simulate_1f1b([2.0, 1.0], [3.0, 2.0], 2)
    assert times.step_s == pytest.approx(11.0)
    assert times.busy_s_by_rank == pytest.approx((10.0, 6.0))
    assert times.bubble_s == pytest.approx(1.0)
    assert step_time_1f1b_closed_s([2.0, 1.0], [3.0, 2.0], 2) == pytest.approx(13.0)


def test_nonuniform_hand_worked_above_closed_form():
    # p=3, m=2, f=(4,1,1), b=(1,4,1): forward-heavy stage 0 next to backward-heavy stage 1.
    # Orders: s0 F0 F1 B0 B1; s1 F0 F1 B0 B1; s2 F0 B0 F1 B1.
    # s0: F0[0,4] F1[4,8]; s1: F0[4,5] F1[8,9]; s2: F0[5,6] B0[6,7] F1[9,10] B1[10,11]
    # s1: B0[9,13] B1[13,17]; s0: B0[13,14] B1[17,18] -> step 18, path 2·f0 + f1 + 2·b1 + b0.
    # Closed form: 12 + 1·5 = 17 < 18. The always-valid bound 12 + 1·(4 + 4) = 20 holds.
    f, b = [4.0, 1.0, 1.0], [1.0, 4.0, 1.0]
    step_s = simulate_1f1b(f, b, 2).step_s
    assert step_s == pytest.approx(18.0)
    assert step_time_1f1b_closed_s(f, b, 2) == pytest.approx(17.0)
    assert step_s <= sum(f) + sum(b) + (2 - 1) * (max(f) + max(b))


def test_embedding_and_head_stages_closed_form_is_upper_bound():
    # Realistic shape: equal b/f ratio per stage, heavier first (embedding) and last (head+loss).
    f = [1.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.8]
    b = [2 * x for x in f]
    for m in (1, 4, 8, 32):
        assert simulate_1f1b(f, b, m).step_s <= step_time_1f1b_closed_s(f, b, m) + EPS


# ----------------------------------------------------------------------------- interleaved


def test_interleaved_uniform_hand_worked():
    # p=4, vpp=2, m=8, chunk f=0.5, b=1 -> per-rank full microbatch f=1, b=2:
    # (m + (p - 1)/vpp)·(f + b) = (8 + 3/2)·3 = 28.5, vs 33 for plain 1F1B (test above);
    # bubble 4.5 = (p - 1)/(m·vpp) of the ideal 24.
    times = simulate_interleaved([0.5] * 8, [1.0] * 8, 8, vpp=2)
    assert times.step_s == pytest.approx(28.5)
    assert step_time_interleaved_closed_s(1.0, 2.0, 4, 8, 2) == pytest.approx(28.5)
    assert times.bubble_s / 24.0 == pytest.approx(bubble_fraction_interleaved(4, 8, 2))


def test_interleaved_smallest_schedule_by_hand():
    # p=2, vpp=2, m=2, every chunk f=b=1. Rank 0 holds v0, v2; rank 1 holds v1, v3.
    # Warm-up: rank 0 min(1·2 + 1·2, 4) = 4 (all forwards), rank 1 min(0 + 2, 4) = 2.
    # r0: F(c0,0)[0,1] F(c0,1)[1,2] F(c1,0)[2,3] F(c1,1)[3,4]
    # r1: F(c0,0)[1,2] F(c0,1)[2,3] F(c1,0)[3,4] B(c1,0)[4,5] F(c1,1)[5,6] B(c1,1)[6,7]
    # r0: B(c1,0)[5,6] B(c1,1)[7,8]; r1: B(c0,0)[7,8] B(c0,1)[8,9]; r0: B(c0,0)[8,9] B(c0,1)[9,10]
    # step 10 = (2 + 1/2)·(2 + 2).
    times = simulate_interleaved([1.0] * 4, [1.0] * 4, 2, vpp=2)
    assert times.step_s == pytest.approx(10.0)
    rank1 = [(op.kind, op.chunk, op.microbatch, op.start_s) for op in times.ops if op.rank == 1]
    assert rank1[2:6] == [("F", 1, 0, 3.0), ("B", 1, 0, 4.0), ("F", 1, 1, 5.0), ("B", 1, 1, 6.0)]


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("vpp", [2, 3, 4])
@pytest.mark.parametrize("groups", [1, 2, 3, 5])
def test_interleaved_uniform_equals_closed_form(p, vpp, groups):
    m = p * groups
    fwd_s, bwd_s = [0.7 / vpp] * (p * vpp), [1.6 / vpp] * (p * vpp)
    times = simulate_interleaved(fwd_s, bwd_s, m, vpp)
    closed_s = step_time_interleaved_closed_s(0.7, 1.6, p, m, vpp)
    assert times.step_s == pytest.approx(closed_s, abs=EPS)
    assert times.busy_s_by_rank == pytest.approx((m * 2.3,) * p)
    _check_schedule(times, fwd_s, bwd_s, p, m, vpp)


def test_interleaved_needs_microbatches_divisible_by_pp():
    with pytest.raises(ValueError, match="num_microbatches % pp == 0"):
        simulate_interleaved([1.0] * 8, [2.0] * 8, 6, vpp=2)


def test_interleaved_vpp1_is_1f1b_and_closed_forms_agree():
    f, b = [1.0, 1.5, 1.0], [2.0, 3.0, 2.0]
    assert simulate_interleaved(f, b, 5, vpp=1) == simulate_1f1b(f, b, 5)
    assert step_time_interleaved_closed_s(1.0, 2.0, 4, 8, 1, 0.1) == pytest.approx(
        step_time_1f1b_closed_s([1.0] * 4, [2.0] * 4, 8, 0.1)
    )


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="num_microbatches"):
        simulate_1f1b([1.0], [1.0], 0)
    with pytest.raises(ValueError, match="equal lengths"):
        simulate_1f1b([1.0, 1.0], [1.0], 2)
    with pytest.raises(ValueError, match="vpp"):
        simulate_interleaved([1.0] * 6, [1.0] * 6, 4, vpp=4)


# ----------------------------------------------------------------------------- properties

times_st = st.floats(min_value=0.01, max_value=5.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    p=st.integers(1, 6),
    m=st.integers(1, 12),
    data=st.data(),
    p2p_s=st.one_of(st.just(0.0), st.floats(0.0, 2.0)),
)
def test_1f1b_properties(p, m, data, p2p_s):
    f = data.draw(st.lists(times_st, min_size=p, max_size=p))
    b = data.draw(st.lists(times_st, min_size=p, max_size=p))
    times = simulate_1f1b(f, b, m, p2p_s)
    assert times.busy_s_by_rank == pytest.approx([m * (fi + bi) for fi, bi in zip(f, b)])
    assert times.step_s >= max(times.busy_s_by_rank) - EPS
    assert times.step_s >= sum(f) + sum(b) + 2 * (p - 1) * p2p_s - EPS
    assert times.bubble_s == pytest.approx(times.step_s - max(times.busy_s_by_rank))
    _check_schedule(times, f, b, p, m)
    if p2p_s == 0.0:  # bound valid for any stage times
        assert times.step_s <= sum(f) + sum(b) + (m - 1) * (max(f) + max(b)) + EPS


@settings(max_examples=300, deadline=None)
@given(p=st.integers(1, 7), m=st.integers(1, 12), ratio=st.floats(0.5, 3.0), data=st.data())
def test_1f1b_closed_form_upper_bound_for_equal_backward_ratio(p, m, ratio, data):
    f = data.draw(st.lists(times_st, min_size=p, max_size=p))
    b = [ratio * x for x in f]
    assert simulate_1f1b(f, b, m).step_s <= step_time_1f1b_closed_s(f, b, m) + EPS


@settings(max_examples=300, deadline=None)
@given(
    p=st.integers(1, 8), m=st.integers(1, 16), f=times_st, b=times_st, d=st.floats(0.0, 5.0)
)
def test_1f1b_uniform_p2p_closed_form_is_lower_bound(p, m, f, b, d):
    fwd_s, bwd_s = _uniform(p, f, b)
    step_s = simulate_1f1b(fwd_s, bwd_s, m, d).step_s
    closed_s = step_time_1f1b_closed_s(fwd_s, bwd_s, m, d)
    assert closed_s - 1e-7 <= step_s <= closed_s + (m - 1) * 2 * (p - 1) * d / p + 1e-7


@settings(max_examples=150, deadline=None)
@given(
    p=st.integers(2, 5),
    vpp=st.integers(2, 4),
    groups=st.integers(1, 4),
    data=st.data(),
    p2p_s=st.one_of(st.just(0.0), st.floats(0.0, 2.0)),
)
def test_interleaved_properties(p, vpp, groups, data, p2p_s):
    m = p * groups
    f = data.draw(st.lists(times_st, min_size=p * vpp, max_size=p * vpp))
    b = data.draw(st.lists(times_st, min_size=p * vpp, max_size=p * vpp))
    times = simulate_interleaved(f, b, m, vpp, p2p_s)
    busy = [m * sum(f[r::p]) + m * sum(b[r::p]) for r in range(p)]
    assert times.busy_s_by_rank == pytest.approx(busy)
    assert times.step_s >= max(busy) - EPS
    assert times.step_s >= sum(f) + sum(b) + 2 * (p * vpp - 1) * p2p_s - EPS
    _check_schedule(times, f, b, p, m, vpp)


@settings(max_examples=150, deadline=None)
@given(
    p=st.integers(2, 6),
    vpp=st.integers(2, 4),
    groups=st.integers(1, 4),
    fc=times_st,
    bc=times_st,
    d=st.floats(0.0, 5.0),
)
def test_interleaved_uniform_p2p_closed_form_is_lower_bound(p, vpp, groups, fc, bc, d):
    m = p * groups
    step_s = simulate_interleaved([fc] * (p * vpp), [bc] * (p * vpp), m, vpp, d).step_s
    closed_s = step_time_interleaved_closed_s(vpp * fc, vpp * bc, p, m, vpp, d)
    # The closed form charges the 2(p·vpp − 1) virtual-stage boundaries of the first microbatch's
    # forward and the last one's backward; sends longer than a chunk also stall the steady state.
    slack_s = (m * vpp - 1) * 2 * (p - 1) * d / p
    assert closed_s - 1e-7 <= step_s <= closed_s + slack_s + 1e-7
    if d <= min(fc, bc):
        assert step_s == pytest.approx(closed_s, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 24), f=times_st, b=times_st, share=st.floats(0.0, 1.0))
def test_1f1b_uniform_closed_form_exact_while_sends_are_shorter_than_compute(p, m, f, b, share):
    # Sends no longer than a stage's forward and backward: the closed form's p2p hop count is the
    # event simulation's, fill, drain and the steady state's round trips alike.
    d = share * min(f, b)
    fwd_s, bwd_s = _uniform(p, f, b)
    assert simulate_1f1b(fwd_s, bwd_s, m, d).step_s == pytest.approx(step_time_1f1b_closed_s(fwd_s, bwd_s, m, d),
                                                                     rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(("p", "m", "v", "hops"), [(1, 8, 1, 0), (4, 1, 1, 6), (4, 2, 1, 6), (4, 3, 1, 8),
                                                   (4, 6, 1, 12), (4, 8, 1, 16), (2, 4, 2, 6), (4, 8, 5, 38)])
def test_exposed_p2p_hops_hand_worked(p, m, v, hops):
    # 1F1B p=4: 6 for fill and drain, +2 per microbatch after the first, except at m = 2, 6, 10, ...
    # (2(p − 1) + 2(m − 1) − 2(⌊(m − 2)/p⌋ + 1)); interleaved: 2(p·v − 1) whatever m.
    assert exposed_p2p_hops(p, m, v) == hops


# ----------------------------------------------------------------------------- speed


def test_simulation_p16_m128_under_50ms():
    f = [1.0 + 0.01 * i for i in range(16)]
    b = [2 * x for x in f]
    simulate_1f1b(f, b, 128)  # warm caches
    best_s = min(_timed(lambda: simulate_1f1b(f, b, 128)) for _ in range(3))
    assert best_s < 0.05


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_op_record_is_frozen():
    op = simulate_1f1b([1.0], [1.0], 1).ops[0]
    assert op == Op(rank=0, kind="F", microbatch=0, chunk=0, start_s=0.0, end_s=1.0)
    with pytest.raises(AttributeError):
        op.start_s = 2.0  # type: ignore[misc]
