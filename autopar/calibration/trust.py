"""How far the cost model can be trusted on a source it never saw: error bands calibrated at the
source level, and how often it orders two measured plans right.

Bands. A residual r = predicted/measured − 1 of a withheld run (autopar.calibration.loso) means
measured = predicted / (1 + r), so a band [lo, hi] of residuals puts the measured value of a
prediction T in [T / (1 + hi), T / (1 + lo)]. The unit of novelty is a source, so a band is chosen by
how often it holds on a source that did not shape it (nested leave-one-source-out): for every source
of a regime, the band is built from the *other* sources' residuals and scored on that source's runs.
The band of a regime is the narrowest of a fixed family — source-weighted residual quantiles at
(q, 1 − q) for q in QUANTILE_LADDER, each widened about 0 by every factor of WIDEN_LADDER, ordered
by the width they give on the regime's own residuals — whose nested coverage reaches
BAND_COVERAGE_TARGET, both as a share of runs and with every source weighted equally. The
interval always contains 0, so the point estimate is inside its band; a regime whose residuals are
all of one sign is reported with its `bias` (a physics defect to find, not a band
to shift). A regime resting on fewer than MIN_BAND_SOURCES sources takes the union of its band and
the overall band, both widened by the same ladder step, and says so (`widened`). Residuals are source-weighted (each source's runs share
one unit) so 1,440 vTrain runs do not set the band of a regime alone.

Ranking. For every source, each pair of its measured runs with the same model, cluster, GPU count,
global batch and sequence length that differ in layout, precision or framework options is ranked
right when the predicted order of tokens/s/GPU matches the measured one; a measured difference
under RANK_TIE (2 %) counts either way. The error of a predicted ratio between two such plans,
(T_a / T_b) / (M_a / M_b) − 1, is what choosing between plans needs: its source-weighted median
absolute value is the listing's equivalence band (autopar.search.rank.equivalence_band).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

BAND_COVERAGE_TARGET = 0.80
MIN_BAND_SOURCES = 3
QUANTILE_LADDER = (0.10, 0.075, 0.05, 0.025, 0.0)
WIDEN_LADDER = (1.0, 1.25, 1.5, 2.0, 3.0, 5.0)
RANK_TIE = 0.02
MAX_PAIRS_PER_GROUP = 2000  # vTrain's single-node groups hold up to ~100 runs: a deterministic sample


@dataclass(frozen=True, slots=True)
class Residual:
    """One withheld run: its source, primary regime and signed residual predicted/measured − 1."""

    source: str
    regime: str
    value: float


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches q of the total (q = 0: the minimum)."""
    pairs = sorted(zip(values, weights))
    if q <= 0:
        return pairs[0][0]
    total, acc = sum(weights), 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total - 1e-12:
            return v
    return pairs[-1][0]


def _source_weights(rs: Sequence[Residual]) -> list[float]:
    count: dict[str, int] = defaultdict(int)
    for r in rs:
        count[r.source] += 1
    return [1.0 / count[r.source] for r in rs]


def interval(rs: Sequence[Residual], q: float, widen: float) -> tuple[float, float]:
    """Source-weighted residual quantiles (q, 1 − q), widened about 0 by `widen`, always holding 0."""
    values = [r.value for r in rs]
    weights = _source_weights(rs)
    lo = min(0.0, weighted_quantile(values, weights, q)) * widen
    hi = max(0.0, weighted_quantile(values, weights, 1.0 - q)) * widen
    return max(lo, -0.95), hi


def _union(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return min(a[0], b[0]), max(a[1], b[1])


def _band_from(rs_regime: Sequence[Residual], rs_all: Sequence[Residual], q: float, widen: float,
               overall: tuple[float, float]) -> tuple[float, float]:
    """The band of one regime from its residuals; the union with `overall` when it rests on fewer
    than MIN_BAND_SOURCES sources (or none)."""
    if not rs_regime:
        return max(overall[0] * widen, -0.95), overall[1] * widen
    band = interval(rs_regime, q, widen)
    if len({r.source for r in rs_regime}) < MIN_BAND_SOURCES:
        band = _union(band, (max(overall[0] * widen, -0.95), overall[1] * widen))
    return band


def _coverage(hits: Sequence[tuple[str, bool]]) -> tuple[float, float]:
    """(share of runs inside, share with every source weighted equally)."""
    if not hits:
        return math.nan, math.nan
    by_source: dict[str, list[bool]] = defaultdict(list)
    for source, hit in hits:
        by_source[source].append(hit)
    run_share = sum(hit for _, hit in hits) / len(hits)
    source_share = sum(sum(v) / len(v) for v in by_source.values()) / len(by_source)
    return run_share, source_share


def _ladder(width) -> list[tuple[float, float]]:
    """Every (q, widen) of the family, from the narrowest band to the widest by `width(q, widen)`
    (ties: the smaller widening, then the larger q)."""
    steps = [(q, w) for q in QUANTILE_LADDER for w in WIDEN_LADDER]
    return sorted(steps, key=lambda step: (width(*step), step[1], -step[0]))


def _nested_hits(rs: Sequence[Residual], regime: str | None, q: float, widen: float,
                 overall_q: tuple[float, float]) -> list[tuple[str, bool]]:
    """Each run of `regime` (None: every run) scored by the band built without its source."""
    inside = [r for r in rs if regime is None or r.regime == regime]
    hits = []
    for source in sorted({r.source for r in inside}):
        others = [r for r in rs if r.source != source]
        if not others:  # a lone source: nothing to build its band from, so no coverage to report
            continue
        if regime is None:
            band = interval(others, q, widen) if others else (0.0, 0.0)
        else:
            overall = interval(others, *overall_q) if others else (0.0, 0.0)
            band = _band_from([r for r in others if r.regime == regime], others, q, widen, overall)
        hits += [(source, band[0] <= r.value <= band[1]) for r in inside if r.source == source]
    return hits


def _choose(rs: Sequence[Residual], regime: str | None, overall_q: tuple[float, float]) -> tuple[float, float, float]:
    """(q, widen, run coverage) of the narrowest ladder step whose nested coverage reaches the target."""
    inside = [r for r in rs if regime is None or r.regime == regime]
    if regime is None:
        def width(q: float, w: float) -> float:
            lo, hi = interval(rs, q, w)
            return hi - lo
    else:
        def width(q: float, w: float) -> float:
            lo, hi = _band_from(inside, rs, q, w, interval(rs, *overall_q))
            return hi - lo
    last = (0.0, WIDEN_LADDER[-1], math.nan)
    for q, widen in _ladder(width):
        runs, sources = _coverage(_nested_hits(rs, regime, q, widen, overall_q))
        last = (q, widen, runs)
        if runs >= BAND_COVERAGE_TARGET and sources >= BAND_COVERAGE_TARGET:
            return last
    return last


def calibrate_bands(rs: Sequence[Residual], regimes: Sequence[str]) -> dict[str, Any]:
    """The bands file's `bands` and `overall`, and the nested coverage of each (see module docstring)."""
    q_all, w_all, cov_all = _choose(rs, None, (0.10, 1.0))
    overall = interval(rs, q_all, w_all)
    out: dict[str, Any] = {"overall": _entry(rs, overall, q_all, w_all, cov_all, widened=False), "bands": {}}
    hits_all = []
    for regime in regimes:
        inside = [r for r in rs if r.regime == regime]
        if not inside:
            continue
        q, w, cov = _choose(rs, regime, (q_all, w_all))
        hits_all += _nested_hits(rs, regime, q, w, (q_all, w_all))
        sources = len({r.source for r in inside})
        band = _band_from(inside, rs, q, w, overall)
        out["bands"][regime] = _entry(inside, band, q, w, cov, widened=sources < MIN_BAND_SOURCES)
    out["band_coverage"] = _coverage(hits_all)[0]
    return out


def _entry(rs: Sequence[Residual], band: tuple[float, float], q: float, widen: float, coverage: float,
           widened: bool) -> dict[str, Any]:
    weights = _source_weights(rs)
    bias = sum(r.value * w for r, w in zip(rs, weights)) / sum(weights)
    entry = {"low": band[0], "high": band[1], "runs": len(rs), "sources": len({r.source for r in rs}),
             "quantile": q, "widen": widen, "band_coverage": coverage, "bias": bias, "widened": widened}
    if widened:
        entry["note"] = (f"rests on {entry['sources']} source(s), fewer than {MIN_BAND_SOURCES}: "
                         "widened to hold the overall band")
    return entry


# ---------------------------------------------------------------------------------------------
# Plan ranking.


@dataclass(frozen=True, slots=True)
class Scored:
    """A withheld run reduced to what ranking needs."""

    source: str
    group: tuple
    setting: tuple
    predicted: float
    measured: float


def ranking_pairs(scored: Sequence[Scored]) -> list[tuple[Scored, Scored]]:
    """Pairs of runs of one source and group (model, cluster, GPUs, batch, sequence) whose settings
    differ; at most MAX_PAIRS_PER_GROUP per group, taken in a fixed stride."""
    groups: dict[tuple, list[Scored]] = defaultdict(list)
    for s in scored:
        groups[(s.source, s.group)].append(s)
    pairs = []
    for key in sorted(groups, key=repr):
        members = groups[key]
        group_pairs = [(a, b) for a, b in itertools.combinations(members, 2) if a.setting != b.setting]
        stride = max(1, math.ceil(len(group_pairs) / MAX_PAIRS_PER_GROUP))
        pairs += group_pairs[::stride]
    return pairs


def ranked_right(a: Scored, b: Scored) -> bool:
    """Predicted order matches the measured one, or the measured difference is under RANK_TIE."""
    measured = a.measured / b.measured - 1.0
    if abs(measured) < RANK_TIE:
        return True
    return (a.predicted > b.predicted) == (a.measured > b.measured)


def ratio_error(a: Scored, b: Scored) -> float:
    """(T_a / T_b) / (M_a / M_b) − 1: the error of the predicted ratio between two plans."""
    return (a.predicted / b.predicted) / (a.measured / b.measured) - 1.0


def rank_accuracy(scored: Sequence[Scored]) -> dict[str, Any]:
    """`rank_accuracy` of the --json: pairs, correct_share, by source, and the source-weighted
    median |ratio error| (`ratio_error_median`)."""
    pairs = ranking_pairs(scored)
    by_source: dict[str, list[tuple[bool, float]]] = defaultdict(list)
    for a, b in pairs:
        by_source[a.source].append((ranked_right(a, b), abs(ratio_error(a, b))))
    sources = [{"source": s, "pairs": len(v), "correct_share": sum(ok for ok, _ in v) / len(v)}
               for s, v in sorted(by_source.items())]
    errors = [e for v in by_source.values() for _, e in v]
    weights = [1.0 / len(v) for v in by_source.values() for _ in v]
    return {
        "pairs": len(pairs),
        "correct_share": sum(ok for v in by_source.values() for ok, _ in v) / len(pairs) if pairs else math.nan,
        "sources": sources,
        "ratio_error_median": weighted_quantile(errors, weights, 0.5) if errors else math.nan,
    }
