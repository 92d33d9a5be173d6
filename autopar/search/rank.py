"""The listing a person reads: the search's plans ranked for choosing, not only by time.

1. Equivalent within the model's error: plans whose step time is within `equivalence_band()` of
   the fastest cannot be told apart by the cost model, so they are ordered by SIMPLICITY (room in
   memory first, then fewer virtual stages, no cp, smaller tp, less recompute; then time) and
   marked equivalent. "Room in memory": a plan whose peak is within the memory model's error of
   the usable memory (`tight_memory_fraction()`) is at the limit, a risk nobody would choose when
   an equivalent plan has room, so it is listed after every equivalent plan that has room.
2. Distinct alternatives: one row per family (tp, pp, cp, ep, recompute mode); plans that differ
   only in vpp, micro batch or ZeRO are variants of the row above them, not alternatives. So the
   same run listed twice (zero 0 and zero 1 at dp 1, where there is nothing to shard; zero 2 and
   3 priced alike) is one row, the first in the order above.

The raw ranking (fastest first) stays in SearchResult.plans; this module only orders for reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from autopar.schema.plan import ParallelPlan

_BAND_PATH = Path(__file__).resolve().parent / "equivalence_band.json"
SIMPLICITY = "room in memory, fewer virtual stages, no cp, smaller tp, less recompute"
_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


@lru_cache(maxsize=1)
def equivalence_band() -> float:
    """Relative step-time band inside which two plans are equivalent within the model's error:
    `relative_band` of equivalence_band.json (its `source` is the validated error it comes from).
    The one place the band is read; per-regime bands replace the number there (issue 12)."""
    return float(json.loads(_BAND_PATH.read_text(encoding="utf-8"))["relative_band"])


@lru_cache(maxsize=1)
def tight_memory_fraction() -> float:
    """`tight_memory_fraction` of equivalence_band.json: the worst validated error of predicted
    peak memory (its `tight_memory_source`); a peak this much higher would not fit."""
    return float(json.loads(_BAND_PATH.read_text(encoding="utf-8"))["tight_memory_fraction"])


def headroom_bytes(est) -> float:
    """Usable memory left free at the plan's predicted peak (negative: over)."""
    return est.usable_memory_bytes - est.peak_memory_bytes


def at_memory_limit(est, fraction: float | None = None) -> bool:
    """Whether the predicted peak, raised by the memory model's error, exceeds the usable memory.
    An estimate that does not carry the usable memory is never at the limit."""
    usable = getattr(est, "usable_memory_bytes", None)
    if usable is None:
        return False
    return est.peak_memory_bytes * (1.0 + (tight_memory_fraction() if fraction is None else fraction)) > usable


def family(plan: ParallelPlan) -> tuple:
    """What makes two plans different alternatives: tp, pp, cp, ep and the recompute mode."""
    return plan.tp, plan.pp, plan.cp, plan.ep, plan.recompute.mode


def simplicity_key(plan: ParallelPlan) -> tuple:
    """SIMPLICITY as a sort key: vpp, cp > 1, tp, recompute (none < selective < full(K) < full)."""
    r = plan.recompute
    layers = (0 if r.num_layers is None else -1) if r.mode != "full" else (r.num_layers or 10**9)
    return plan.vpp, plan.cp > 1, plan.tp, _RECOMPUTE_ORDER[r.mode], layers


@dataclass(frozen=True)
class Row:
    plan: ParallelPlan
    estimate: object  # autopar.cost.step.Estimate
    equivalent_to_best: bool


def within_band(step_time_s: float, best_s: float, band: float) -> bool:
    return step_time_s <= best_s * (1.0 + band)


def distinct_rows(plans: list[tuple], top: int, band: float) -> list[Row]:
    """Up to `top` rows from `plans` (every fitting plan the search found): the equivalent ones
    first in SIMPLICITY order, the rest fastest first, one row per family.

    Each family's row is chosen without regard to memory (its simplest member in the band, as the
    search prices them, autopar.search.driver._price_equivalents); then the equivalent rows at the
    memory limit (at_memory_limit) move after the equivalent rows with room, keeping their order."""
    if not plans:
        return []
    kept = list(plans)
    best_s = min(est.step_time_s for _, est in kept)
    equivalent = [x for x in kept if within_band(x[1].step_time_s, best_s, band)]
    others = sorted((x for x in kept if not within_band(x[1].step_time_s, best_s, band)), key=lambda x: x[1].step_time_s)
    equivalent.sort(key=lambda x: (simplicity_key(x[0]), x[1].step_time_s))
    rows: list[Row] = []
    seen: set[tuple] = set()
    for plan, est in equivalent + others:
        if family(plan) in seen:
            continue
        seen.add(family(plan))
        rows.append(Row(plan, est, within_band(est.step_time_s, best_s, band)))
        if len(rows) == top:
            break
    roomy = [r for r in rows if r.equivalent_to_best and not at_memory_limit(r.estimate)]
    tight = [r for r in rows if r.equivalent_to_best and at_memory_limit(r.estimate)]
    return roomy + tight + [r for r in rows if not r.equivalent_to_best]
