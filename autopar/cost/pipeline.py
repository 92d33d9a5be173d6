"""Pipeline-parallel step time: 1F1B and interleaved 1F1B as Megatron-LM schedules them.

Source: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21, §2.2 (PipeDream-Flush / 1F1B, §2.2.1; interleaved schedule, §2.2.2).

Inputs are per-stage times of ONE microbatch, in seconds. Two estimators:
- `simulate_1f1b` / `simulate_interleaved`: exact event simulations of the schedule (each op
  starts when its rank is free and its dependency is done; ops on one rank run in schedule
  order). Used for final plans and for the timeline picture.
- `pipeline_step_s`: the O(p) closed form the estimate and the search's bounds use (the only
  closed form; the tests check it against the simulations).

Model of communication: a p2p send of activations (forward) or gradients (backward) across a
stage boundary delays the consumer by `p2p_s` but occupies neither rank (no compute slot is
spent on it; there is no bandwidth contention between sends).
Ignored: data-parallel gradient reduction and optimizer step after the flush, kernel launch
gaps, and the compute slow-down of overlapped communication.

Bubble definition used throughout: `bubble_s = step_s - max over ranks of busy_s`, where a
rank's busy time is the sum of its op durations. With uniform stages and no p2p this equals
(p - 1)·(f + b), and bubble_s / (m·(f + b)) = (p - 1)/m, the paper's bubble time fraction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"
_NOT_DONE = -1.0  # sentinel end time of an op that has not been scheduled yet (times are >= 0)


@dataclass(frozen=True, slots=True)
class Op:
    """One scheduled compute op: `kind` "F" (forward) or "B" (backward) of `microbatch` on
    model chunk `chunk` (always 0 without interleaving) of pipeline rank `rank`."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class PipelineTimes:
    """Result of a pipeline simulation.

    step_s: makespan, from the first forward to the last backward on any rank.
    busy_s_by_rank: per rank, the sum of its op durations (m·(f + b) summed over its chunks).
    bubble_s: step_s - max(busy_s_by_rank): the idle time of the busiest rank.
    ops: every op, in the order the simulation scheduled it.
    """

    step_s: float
    bubble_s: float
    busy_s_by_rank: tuple[float, ...]
    ops: tuple[Op, ...]


# ----------------------------------------------------------------------------- closed forms


def bubble_fraction_1f1b(p: int, m: int) -> float:
    """Bubble time / ideal compute time of 1F1B: (p - 1)/m. Source: Narayanan'21 §2.2.1."""
    return (p - 1) / m


def bubble_fraction_interleaved(p: int, m: int, v: int) -> float:
    """Bubble fraction of interleaved 1F1B with v chunks per rank: (p - 1)/(m·v).
    Source: Narayanan'21 §2.2.2."""
    return (p - 1) / (m * v)


def pipeline_step_s(f: Sequence[float], b: Sequence[float], m: int, v: int, p2p_s: float) -> tuple[float, float]:
    """(step without p2p, p2p part) of the (interleaved) 1F1B schedule, closed form: the one the
    estimate and the search's bounds use.

        base = m · max_r (f_r + b_r) + (Σ_r (f_r + b_r) − max_r (f_r + b_r)) / v,
        p2p = exposed_p2p_hops(p, m, v) · p2p_s

    f_r, b_r: rank r's forward and backward of a FULL microbatch (all its v chunks). Source:
    Narayanan'21 §2.2: (m + p − 1)(f + b) for 1F1B and (m + (p − 1)/v)(f + b) interleaved with equal
    ranks, generalized to unequal ranks as one microbatch's path plus m − 1 slots of the slowest
    rank. Exact against the event simulation for equal ranks (m % p == 0 when interleaved) while a
    send is no longer than a chunk's forward and its backward, a lower bound beyond; without p2p
    an upper bound for unequal ranks with the same backward/forward ratio (see the tests). Ignores
    what the module docstring lists. O(p).
    """
    fb = [x + y for x, y in zip(f, b)]
    slowest = max(fb)
    base = m * slowest + (sum(fb) - slowest) / v
    return base, exposed_p2p_hops(len(fb), m, v) * p2p_s


def exposed_p2p_hops(p: int, m: int, v: int) -> int:
    """Stage-boundary sends on the critical path of one step: how many times `p2p_s` adds to the
    step. Exact for equal stages whose compute outlasts a send (the event simulations agree; see
    tests/test_pipeline.py); O(1).
    Interleaved (v ≥ 2): the first microbatch's forward and the last one's backward each cross all
    p·v − 1 virtual-stage boundaries, and the steady state hides every other send: 2(p·v − 1)
    (Narayanan'21 §2.2.2: interleaving multiplies the communication by v).
    1F1B (v = 1): 2(p − 1) for the fill and drain, plus in the steady state a blocking round trip
    per microbatch (Megatron's send_forward_recv_backward / send_backward_recv_forward), two sends,
    except once per p microbatches, when the microbatches in flight cover it:
    2(p − 1) + 2(m − 1) − 2(⌊(m − 2)/p⌋ + 1) for m ≥ 2."""
    if p <= 1:
        return 0
    if v > 1:
        return 2 * (p * v - 1)
    if m <= 1:
        return 2 * (p - 1)
    return 2 * (p - 1) + 2 * (m - 1) - 2 * ((m - 2) // p + 1)


# ----------------------------------------------------------------------------- schedules


def _one_f_one_b_order(
    fwd_ops: list[tuple[str, int, int]],
    bwd_ops: list[tuple[str, int, int]],
    warmup: int,
) -> list[tuple[str, int, int]]:
    """Megatron's per-rank op order: `warmup` forwards, then (forward, backward) pairs, then the
    remaining backwards (cool-down). Ops are (kind, chunk, microbatch)."""
    steady = len(fwd_ops) - warmup
    order = list(fwd_ops[:warmup])
    for k in range(steady):
        order.append(fwd_ops[warmup + k])
        order.append(bwd_ops[k])
    order.extend(bwd_ops[steady:])
    return order


def _order_1f1b(rank: int, p: int, m: int) -> list[tuple[str, int, int]]:
    """PipeDream-Flush order of one rank: min(p - rank - 1, m) warm-up forwards (Narayanan'21
    §2.2.1; Megatron `forward_backward_pipelining_without_interleaving`)."""
    fwd_ops = [(FORWARD, 0, j) for j in range(m)]
    bwd_ops = [(BACKWARD, 0, j) for j in range(m)]
    return _one_f_one_b_order(fwd_ops, bwd_ops, min(p - rank - 1, m))


def _order_interleaved(rank: int, p: int, m: int, vpp: int) -> list[tuple[str, int, int]]:
    """Interleaved order of one rank (Narayanan'21 §2.2.2; Megatron
    `forward_backward_pipelining_with_interleaving`): microbatches in groups of p; within a group,
    all p microbatches on chunk 0, then chunk 1, ...; backwards visit chunks in reverse. Warm-up:
    min((p - rank - 1)·2 + (vpp - 1)·p, m·vpp) forward chunk-ops."""
    fwd_ops: list[tuple[str, int, int]] = []
    bwd_ops: list[tuple[str, int, int]] = []
    for group_start in range(0, m, p):
        group = range(group_start, group_start + p)
        fwd_ops.extend((FORWARD, c, j) for c in range(vpp) for j in group)
        bwd_ops.extend((BACKWARD, c, j) for c in reversed(range(vpp)) for j in group)
    warmup = min((p - rank - 1) * 2 + (vpp - 1) * p, m * vpp)
    return _one_f_one_b_order(fwd_ops, bwd_ops, warmup)


# ----------------------------------------------------------------------------- simulation


def _ready_s(
    kind: str,
    v: int,
    j: int,
    end_f: list[list[float]],
    end_b: list[list[float]],
    p2p_s: list[float],
) -> float:
    """Earliest start of op (kind, virtual stage v, microbatch j) from its dependency, or
    _NOT_DONE if the dependency has not run yet. p2p_s[v] is the delay across boundary v→v+1."""
    last = len(end_f) - 1
    if kind == FORWARD:
        if v == 0:
            return 0.0
        dep = end_f[v - 1][j]
        return _NOT_DONE if dep == _NOT_DONE else dep + p2p_s[v - 1]
    if v == last:  # the loss stage turns its own forward around, no p2p
        return end_f[v][j]
    dep = end_b[v + 1][j]
    return _NOT_DONE if dep == _NOT_DONE else dep + p2p_s[v]


def _simulate(
    orders: list[list[tuple[str, int, int]]],
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    m: int,
    p2p_s: list[float],
) -> PipelineTimes:
    """Schedule every rank's ops in order, each at max(rank free, dependency ready).

    A worklist of ranks: a rank runs ops until one's dependency is missing, then waits; any rank
    that made progress wakes its two ring neighbours (the only ranks that consume its outputs).
    Each op is scheduled once, so the cost is O(total ops). Virtual stage = chunk·p + rank.
    """
    p = len(orders)
    num_stages = len(fwd_s)
    end_f = [[_NOT_DONE] * m for _ in range(num_stages)]
    end_b = [[_NOT_DONE] * m for _ in range(num_stages)]
    next_op = [0] * p
    free_s = [0.0] * p
    ops: list[Op] = []
    pending = list(range(p))
    while pending:
        rank = pending.pop()
        order = orders[rank]
        progressed = False
        while next_op[rank] < len(order):
            kind, chunk, j = order[next_op[rank]]
            v = chunk * p + rank
            ready_s = _ready_s(kind, v, j, end_f, end_b, p2p_s)
            if ready_s == _NOT_DONE:
                break
            start_s = max(free_s[rank], ready_s)
            end_s = start_s + (fwd_s[v] if kind == FORWARD else bwd_s[v])
            (end_f if kind == FORWARD else end_b)[v][j] = end_s
            ops.append(Op(rank, kind, j, chunk, start_s, end_s))
            free_s[rank] = end_s
            next_op[rank] += 1
            progressed = True
        if progressed:
            pending.extend({(rank - 1) % p, (rank + 1) % p})
    if any(n < len(order) for n, order in zip(next_op, orders)):
        raise RuntimeError(f"pipeline schedule deadlocked at op indices {next_op}")
    return _times(ops, p)


def _times(ops: list[Op], p: int) -> PipelineTimes:
    """Makespan, per-rank busy time and bubble of a finished schedule."""
    busy_s = [0.0] * p
    for op in ops:
        busy_s[op.rank] += op.end_s - op.start_s
    step_s = max((op.end_s for op in ops), default=0.0)
    return PipelineTimes(step_s, step_s - max(busy_s), tuple(busy_s), tuple(ops))


def _check_inputs(
    fwd_s: Sequence[float], bwd_s: Sequence[float], m: int, p2p_s: float | Sequence[float]
) -> list[float]:
    """Validate stage times and microbatch count; return p2p_s as one value per boundary."""
    if len(fwd_s) == 0 or len(fwd_s) != len(bwd_s):
        raise ValueError(
            f"fwd_s and bwd_s need one time per stage and equal lengths; got {len(fwd_s)} "
            f"and {len(bwd_s)}"
        )
    if m < 1:
        raise ValueError(f"num_microbatches must be >= 1; got {m}")
    if min(fwd_s) < 0 or min(bwd_s) < 0:
        raise ValueError("stage times must be >= 0 seconds")
    boundaries = len(fwd_s) - 1
    if isinstance(p2p_s, (int, float)):
        per_boundary = [float(p2p_s)] * boundaries
    else:
        per_boundary = [float(x) for x in p2p_s]
    if len(per_boundary) != boundaries or any(x < 0 for x in per_boundary):
        raise ValueError(
            f"p2p_s must be a scalar or {boundaries} non-negative per-boundary times "
            f"(one per stage boundary); got {p2p_s!r}"
        )
    return per_boundary


def simulate_1f1b(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    num_microbatches: int,
    p2p_s: float | Sequence[float] = 0.0,
) -> PipelineTimes:
    """Event simulation of 1F1B (PipeDream-Flush) as Megatron runs it. Source: Narayanan'21
    §2.2.1.

    fwd_s[i], bwd_s[i]: time of one microbatch's forward / backward on stage i (of p).
    p2p_s: send time across each of the p - 1 stage boundaries (scalar or per-boundary list).
    Stage i runs min(p - i - 1, m) warm-up forwards, then one-forward-one-backward, then the
    cool-down backwards. Cost: O(p·m) ops; p=16, m=128 takes ~6 ms.
    """
    boundary_s = _check_inputs(fwd_s, bwd_s, num_microbatches, p2p_s)
    p = len(fwd_s)
    orders = [_order_1f1b(rank, p, num_microbatches) for rank in range(p)]
    return _simulate(orders, fwd_s, bwd_s, num_microbatches, boundary_s)


def simulate_interleaved(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    num_microbatches: int,
    vpp: int,
    p2p_s: float | Sequence[float] = 0.0,
) -> PipelineTimes:
    """Event simulation of interleaved 1F1B. Source: Narayanan'21 §2.2.2 and Megatron-LM's
    `forward_backward_pipelining_with_interleaving` (microbatch group size = p).

    fwd_s, bwd_s: per VIRTUAL stage, length p·vpp; virtual stage v = chunk·p + rank, so rank r
    holds v = r, r + p, r + 2p, ... . p2p_s: scalar or one time per virtual-stage boundary
    (length p·vpp - 1; boundary v -> v+1 with v = p - 1 is the wrap from the last rank to
    rank 0). Requires num_microbatches % p == 0, as Megatron does. vpp == 1 runs plain 1F1B
    (Megatron selects the non-interleaved schedule then), without the divisibility rule.
    Megatron releases before megatron-core's `microbatch_group_size_per_vp_stage` ran all
    forwards first when m == p; this follows the current warm-up rule for every m.
    """
    if vpp < 1 or len(fwd_s) % vpp != 0:
        raise ValueError(
            f"vpp must be >= 1 and divide the number of virtual stages; got vpp={vpp}, "
            f"{len(fwd_s)} virtual stages"
        )
    if vpp == 1:
        return simulate_1f1b(fwd_s, bwd_s, num_microbatches, p2p_s)
    boundary_s = _check_inputs(fwd_s, bwd_s, num_microbatches, p2p_s)
    p = len(fwd_s) // vpp
    if num_microbatches % p != 0:
        raise ValueError(
            f"interleaved 1F1B needs num_microbatches % pp == 0 (Megatron processes microbatches "
            f"in groups of pp); got num_microbatches={num_microbatches}, pp={p}"
        )
    orders = [_order_interleaved(rank, p, num_microbatches, vpp) for rank in range(p)]
    return _simulate(orders, fwd_s, bwd_s, num_microbatches, boundary_s)
