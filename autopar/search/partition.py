"""Pipeline stage partitioning by dynamic programming over the non-uniform layer sequence.

The layer sequence is graph order: non-decoder items before the first decoder (the embedding)
always sit on stage 0, those after the last decoder (MTP, head + loss) on the last stage, and each
of the S stages gets a contiguous, non-empty run of decoder layers. Under 1F1B the step is
dominated by m · max_r (f_r + b_r) (the closed form in autopar.cost.step; Σ_r is fixed by the
layers), so the DP minimizes the bottleneck stage time subject to every stage fitting:

    stage r holding items I fits  ⇔  Σ_I state + inflight_r · Σ_I saved + max_I work + extra_r ≤ usable

with inflight_r = pp − r microbatches under 1F1B (Narayanan et al. SC'21 §2.2), extra_r the
last stage's tied-embedding copy. Recurrence (Alpa's stage construction, Zheng et al. OSDI'22,
uses the same min-max form):

    B[0][j] = cost_0(0, j)                     if stage 0 = decoders [0, j) fits
    B[r][j] = min_{r ≤ i < j} max(B[r−1][i], cost_r(i, j))   over fitting stages [i, j)
    answer  = B[S−1][n]

O(S · n²) work. Ties go to the smallest i (earliest cut), so the result is deterministic.
`partition_layers` is pure: per-item columns in, counts out (plain Python: on ~100 layers it is as
fast as a NumPy version and keeps NumPy out of the plan command, issue 15).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from math import inf, isfinite

from autopar.search.summation import pairwise_sum, prefix_sums


@dataclass(frozen=True)
class Partition:
    """Decoder layers per stage (execution order) and the bottleneck stage time it achieves."""

    counts: tuple[int, ...]
    bottleneck_s: float


@dataclass(frozen=True)
class StageInputs:
    """Per-item columns in graph order (embedding, decoders, MTP, head) and per-stage limits."""

    time_s: Sequence[float]  # forward + backward (+ recompute) per microbatch
    state_bytes: Sequence[float]  # weights + grads + optimizer on one GPU
    saved_bytes: Sequence[float]  # activations kept for one microbatch
    work_bytes: Sequence[float]  # transient bytes while recomputing the item
    is_decoder: Sequence[bool]
    inflight: tuple[int, ...]  # microbatches in flight on each stage
    usable_bytes: float  # allocated bytes a stage may hold
    extra_last_bytes: float = 0.0


def stage_cost(inputs: StageInputs, stage: int, lo: int, hi: int) -> tuple[float, float]:
    """(time, allocated bytes) of stage `stage` holding decoders [lo, hi) plus its fixed items."""
    items = _stage_items(inputs, stage, lo, hi)
    t = pairwise_sum([inputs.time_s[i] for i in items])
    mem = (pairwise_sum([inputs.state_bytes[i] for i in items])
           + inputs.inflight[stage] * pairwise_sum([inputs.saved_bytes[i] for i in items])
           + max([0.0, *(inputs.work_bytes[i] for i in items)]))
    if stage == len(inputs.inflight) - 1:
        mem += inputs.extra_last_bytes
    return t, mem


def _decoder_indices(inputs: StageInputs) -> list[int]:
    return [i for i, d in enumerate(inputs.is_decoder) if d]


def _stage_items(inputs: StageInputs, stage: int, lo: int, hi: int) -> list[int]:
    dec = _decoder_indices(inputs)
    items = dec[lo:hi]
    if stage == 0:
        items = list(range(dec[0])) + items
    if stage == len(inputs.inflight) - 1:
        items = items + list(range(dec[-1] + 1, len(inputs.is_decoder)))
    return items


def partition_layers(inputs: StageInputs) -> Partition | None:
    """The min-bottleneck split of the decoders over len(inputs.inflight) stages, or None when no
    split fits."""
    dec = _decoder_indices(inputs)
    n, stages = len(dec), len(inputs.inflight)
    if n < stages:
        return None
    head = range(dec[0])
    tail = range(dec[-1] + 1, len(inputs.is_decoder))
    t_pre, st_pre, sv_pre = (prefix_sums([a[i] for i in dec])
                             for a in (inputs.time_s, inputs.state_bytes, inputs.saved_bytes))
    work = [inputs.work_bytes[i] for i in dec]
    fixed = {0: _fixed(inputs, head), stages - 1: _fixed(inputs, tail)}
    if stages == 1:  # one stage holds the embedding and the head
        fixed[0] = _fixed(inputs, [*head, *tail])
    best = [[inf] * (n + 1) for _ in range(stages)]
    arg = [[0] * (n + 1) for _ in range(stages)]
    for r in range(stages):
        f_t, f_state, f_saved, f_work = fixed.get(r, (0.0, 0.0, 0.0, 0.0))
        extra = inputs.extra_last_bytes if r == stages - 1 else 0.0
        k, usable = inputs.inflight[r], inputs.usable_bytes
        prev = best[r - 1] if r else [0.0] * (n + 1)  # stage 0 has no stages before it
        for j in range(r + 1, n - (stages - 1 - r) + 1):
            t_j, st_j, sv_j = t_pre[j], st_pre[j], sv_pre[j]
            # stage r = decoders [i, j) for r ≤ i < j (i = 0 on stage 0), scanned from the right
            # with the max work over [i, j); on ties the smaller i wins (the earliest cut).
            # Both the stage's time and its memory only grow as i falls (every column is >= 0 and
            # prefix sums of non-negative floats only grow), so the scan stops, with the same
            # result, once the stage alone is slower than the best or over memory: a smaller i
            # cannot win (over memory with nothing fitting yet, the loop would end on i = r).
            lows = range(j - 1, r - 1, -1) if r else (0,)
            win_max = -inf if r else max(work[1:j], default=-inf)
            best_val, best_i = inf, r
            for i in lows:
                if work[i] > win_max:
                    win_max = work[i]
                mem = st_j - st_pre[i] + f_state + k * (sv_j - sv_pre[i] + f_saved) + max(win_max, f_work) + extra
                if not mem <= usable:  # (NaN too, as before: no fit)
                    if best_val == inf:
                        best_i = r
                    break
                t = t_j - t_pre[i] + f_t
                if t > best_val:
                    break
                val = max(prev[i], t)
                if val <= best_val:
                    best_val, best_i = val, i
            best[r][j], arg[r][j] = best_val, best_i
    if not isfinite(best[stages - 1][n]):
        return None
    counts, j = [], n
    for r in range(stages - 1, -1, -1):
        i = arg[r][j]
        counts.append(j - i)
        j = i
    return Partition(tuple(reversed(counts)), best[stages - 1][n])


def _fixed(inputs: StageInputs, items: Sequence[int]) -> tuple[float, float, float, float]:
    """(time, state, saved, max work) of the non-decoder items pinned to a stage."""
    return (pairwise_sum([inputs.time_s[i] for i in items]), pairwise_sum([inputs.state_bytes[i] for i in items]),
            pairwise_sum([inputs.saved_bytes[i] for i in items]), max([0.0, *(inputs.work_bytes[i] for i in items)]))


def brute_force_partition(inputs: StageInputs) -> Partition | None:
    """Every composition of the decoders into non-empty stages (for tests on small instances)."""
    n, stages = len(_decoder_indices(inputs)), len(inputs.inflight)
    best: Partition | None = None
    for cuts in combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        worst = 0.0
        for r in range(stages):
            t, mem = stage_cost(inputs, r, bounds[r], bounds[r + 1])
            if mem > inputs.usable_bytes:
                worst = inf
                break
            worst = max(worst, t)
        if isfinite(worst) and (best is None or worst < best.bottleneck_s):
            best = Partition(tuple(b - a for a, b in zip(bounds, bounds[1:])), worst)
    return best
