"""The search runs on plain Python (issue 15: `autopar plan` never imports NumPy), with its float
sums in NumPy's order, so its bounds and plans are bit for bit those of the NumPy version it
replaced: cross-checked here against NumPy itself (the tests may import it). The stagewise
recompute choice, now solved per full-recompute count, equals a scan of the whole grid."""

from __future__ import annotations

import random

import numpy as np
import pytest

from autopar.search.costs import rank_sums
from autopar.search.ilp import RecomputeProblem, _best_stage_choice, stage_memory_scaled
from autopar.search.partition import StageInputs, brute_force_partition, partition_layers
from autopar.search.summation import pairwise_sum, prefix_sums


def _floats(rng: random.Random, n: int) -> list[float]:
    """Non-negative values spread over 21 orders of magnitude (seconds to bytes), so that the
    order of the additions shows in the last bits."""
    return [rng.uniform(0, 1) * 10 ** rng.uniform(-9, 12) for _ in range(n)]


def test_pairwise_sum_is_numpys_sum_bit_for_bit():
    rng = random.Random(0)
    differs_from_left_to_right = 0
    for n in [*range(300), 511, 512, 513, 1000, 4099]:
        values = _floats(rng, n)
        expected = float(np.sum(np.array(values)))
        assert pairwise_sum(values) == expected, n
        assert pairwise_sum(tuple(values)) == expected, n
        column = np.array(values + values).reshape(2, n).T[:, 0] if n else np.zeros(0)  # a strided view
        assert pairwise_sum(values) == float(column.sum()), n
        left_to_right = 0.0
        for v in values:
            left_to_right += v
        differs_from_left_to_right += left_to_right != expected
    assert differs_from_left_to_right > 50  # the order matters on these values: the test can fail


def test_prefix_sums_are_numpys_cumsum():
    rng = random.Random(1)
    for n in (0, 1, 7, 8, 9, 95, 130, 700):
        values = _floats(rng, n)
        assert prefix_sums(values) == [0.0, *np.cumsum(np.array(values, dtype=float)).tolist()]


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 7, 8, 9, 16, 24, 64])
def test_rank_sums_are_numpys_sum_over_the_chunk_axis(pp):
    """Rank r's time is the sum over its chunks c of stage c·pp + r; NumPy summed a (vpp, pp) array
    over axis 0, chunk after chunk (interleaving needs pp ≥ 2, so pp = 1 has vpp = 1)."""
    rng = random.Random(pp)
    for vpp in ([1] if pp == 1 else [1, 2, 3, 7, 8, 9, 16, 20, 33, 64]):
        stage = _floats(rng, vpp * pp)
        assert rank_sums(stage, pp) == np.array(stage).reshape(vpp, pp).sum(axis=0).tolist(), (pp, vpp)


def _random_stage_problem(rng: random.Random) -> RecomputeProblem:
    """One stage with every sign of the selective slope (a_sel − a_none) and of c_sel and c_full."""
    return RecomputeProblem(
        layers=(rng.randint(0, 14),), base_ns=(rng.randint(0, 5000),), full_ns=(rng.randint(-50, 300),),
        sel_ns=(rng.choice([0, rng.randint(-80, 80)]),), state_bytes=(rng.randint(0, 500),),
        fixed_saved_bytes=(rng.randint(0, 30),), none_bytes=(rng.randint(0, 100),), sel_bytes=(rng.randint(0, 120),),
        full_bytes=(rng.randint(0, 100),), work_full_bytes=(rng.randint(0, 100),), work_sel_bytes=(rng.randint(0, 100),),
        inflight=(rng.randint(1, 8),), usable_bytes=rng.randint(0, 2000), num_microbatches=4, vpp=rng.choice([1, 2, 3]))


def test_stagewise_choice_equals_a_scan_of_the_whole_grid():
    """The least (t_r, f_r, s_r) over every (f, s) with f + s ≤ L_r that fits, by brute force."""
    rng = random.Random(2)
    fitting = 0
    for _ in range(3000):
        pb = _random_stage_problem(rng)
        n, cap = pb.layers[0], pb.vpp * pb.usable_bytes
        grid = [(pb.base_ns[0] + f * pb.full_ns[0] + s * pb.sel_ns[0], f, s)
                for f in range(n + 1) for s in range(n + 1 - f) if stage_memory_scaled(pb, 0, f, s) <= cap]
        expected = min(grid)[1:] if grid else None
        assert _best_stage_choice(pb, 0) == expected, pb
        fitting += expected is not None
    assert 1000 < fitting < 2900  # both outcomes are exercised


def test_partition_on_one_stage_holds_the_embedding_and_the_head_once():
    """Hand-worked: one stage holds everything: 1 (embedding) + 3 · 1 (decoders) + 5 (head) = 9 s,
    the single composition brute force prices."""
    inputs = StageInputs(time_s=(1.0, 1.0, 1.0, 1.0, 5.0), state_bytes=(0.0,) * 5, saved_bytes=(0.0,) * 5,
                         work_bytes=(0.0,) * 5, is_decoder=(False, True, True, True, False), inflight=(1,),
                         usable_bytes=1.0)
    assert partition_layers(inputs) == brute_force_partition(inputs)
    assert partition_layers(inputs).bottleneck_s == 9.0 and partition_layers(inputs).counts == (3,)
