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

O(S · n²) work, vectorized over i. Ties go to the smallest i (earliest cut), so the result is
deterministic. `partition_layers` is pure: arrays in, counts out.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class Partition:
    """Decoder layers per stage (execution order) and the bottleneck stage time it achieves."""

    counts: tuple[int, ...]
    bottleneck_s: float


@dataclass(frozen=True)
class StageInputs:
    """Per-item arrays in graph order (embedding, decoders, MTP, head) and per-stage limits."""

    time_s: np.ndarray  # forward + backward (+ recompute) per microbatch
    state_bytes: np.ndarray  # weights + grads + optimizer on one GPU
    saved_bytes: np.ndarray  # activations kept for one microbatch
    work_bytes: np.ndarray  # transient bytes while recomputing the item
    is_decoder: np.ndarray  # bool
    inflight: tuple[int, ...]  # microbatches in flight on each stage
    usable_bytes: float  # allocated bytes a stage may hold
    extra_last_bytes: float = 0.0


def _prefix(x: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(x, dtype=float)))


def stage_cost(inputs: StageInputs, stage: int, lo: int, hi: int) -> tuple[float, float]:
    """(time, allocated bytes) of stage `stage` holding decoders [lo, hi) plus its fixed items."""
    items = _stage_items(inputs, stage, lo, hi)
    t = float(inputs.time_s[items].sum())
    mem = (float(inputs.state_bytes[items].sum()) + inputs.inflight[stage] * float(inputs.saved_bytes[items].sum())
           + float(inputs.work_bytes[items].max(initial=0.0)))
    if stage == len(inputs.inflight) - 1:
        mem += inputs.extra_last_bytes
    return t, mem


def _stage_items(inputs: StageInputs, stage: int, lo: int, hi: int) -> np.ndarray:
    dec = np.flatnonzero(inputs.is_decoder)
    items = list(dec[lo:hi])
    if stage == 0:
        items = list(range(dec[0])) + items
    if stage == len(inputs.inflight) - 1:
        items = items + list(range(dec[-1] + 1, len(inputs.is_decoder)))
    return np.array(items, dtype=int)


def partition_layers(inputs: StageInputs) -> Partition | None:
    """The min-bottleneck split of the decoders over len(inputs.inflight) stages, or None when no
    split fits."""
    dec = np.flatnonzero(inputs.is_decoder)
    n, stages = len(dec), len(inputs.inflight)
    if n < stages:
        return None
    head = np.arange(dec[0])
    tail = np.arange(dec[-1] + 1, len(inputs.is_decoder))
    t_pre, st_pre, sv_pre = (_prefix(a[dec]) for a in (inputs.time_s, inputs.state_bytes, inputs.saved_bytes))
    work = inputs.work_bytes[dec]
    fixed = {0: _fixed(inputs, head, 0), stages - 1: _fixed(inputs, tail, stages - 1)}
    if stages == 1:
        (t0, s0, a0, w0), (t1, s1, a1, w1) = fixed[0], _fixed(inputs, tail, 0)
        fixed[0] = (t0 + t1, s0 + s1, a0 + a1, max(w0, w1))
    best = np.full((stages, n + 1), np.inf)
    arg = np.zeros((stages, n + 1), dtype=int)
    for r in range(stages):
        f_t, f_state, f_saved, f_work = fixed.get(r, (0.0, 0.0, 0.0, 0.0))
        extra = inputs.extra_last_bytes if r == stages - 1 else 0.0
        for j in range(r + 1, n - (stages - 1 - r) + 1):
            lo = np.arange(r, j) if r else np.array([0])
            t = t_pre[j] - t_pre[lo] + f_t
            win_max = np.maximum.accumulate(work[lo[0]:j][::-1])[::-1][lo - lo[0]]  # max work over [i, j)
            mem = (st_pre[j] - st_pre[lo] + f_state + inputs.inflight[r] * (sv_pre[j] - sv_pre[lo] + f_saved)
                   + np.maximum(win_max, f_work) + extra)
            prev = best[r - 1][lo] if r else np.zeros(1)
            val = np.where(mem <= inputs.usable_bytes, np.maximum(prev, t), np.inf)
            k = int(np.argmin(val))
            best[r][j], arg[r][j] = val[k], lo[k]
    if not np.isfinite(best[stages - 1][n]):
        return None
    counts, j = [], n
    for r in range(stages - 1, -1, -1):
        i = arg[r][j]
        counts.append(int(j - i))
        j = i
    return Partition(tuple(reversed(counts)), float(best[stages - 1][n]))


def _fixed(inputs: StageInputs, items: np.ndarray, stage: int) -> tuple[float, float, float, float]:
    """(time, state, saved, max work) of the non-decoder items pinned to a stage."""
    return (float(inputs.time_s[items].sum()), float(inputs.state_bytes[items].sum()),
            float(inputs.saved_bytes[items].sum()), float(inputs.work_bytes[items].max(initial=0.0)))


def brute_force_partition(inputs: StageInputs) -> Partition | None:
    """Every composition of the decoders into non-empty stages (for tests on small instances)."""
    n, stages = int(inputs.is_decoder.sum()), len(inputs.inflight)
    best: Partition | None = None
    for cuts in combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        worst = 0.0
        for r in range(stages):
            t, mem = stage_cost(inputs, r, bounds[r], bounds[r + 1])
            if mem > inputs.usable_bytes:
                worst = np.inf
                break
            worst = max(worst, t)
        if np.isfinite(worst) and (best is None or worst < best.bottleneck_s):
            best = Partition(tuple(b - a for a, b in zip(bounds, bounds[1:])), worst)
    return best
