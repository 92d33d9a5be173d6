"""Error bands of a prediction: how far off the cost model has been, in the plan's regime, on
sources it was never fitted on.

A band is an interval [low, high] of leave-one-source-out residuals (predicted/measured − 1,
autopar.calibration.loso) chosen so that it held the measured value for at least 80 % of the runs
of sources that did not shape it (autopar.calibration.trust: nested leave-one-source-out, source
level). It is computed once by `python -m autopar.calibration.loso` and shipped as data
(cost_models/bands/error_bands.json, with the command, date and coverage); an estimate never refits.
A residual r means measured = predicted / (1 + r), so the band of a prediction T is
[T / (1 + high), T / (1 + low)]; low ≤ 0 ≤ high, so T is always inside. `sources` says how many
sources a band rests on; one resting on fewer than three holds the overall band as well (`widened`).

The cost model knows nothing of its bands: the records and tables an estimate is shown in attach
its band (estimate_band), from the plan and model it was made for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from autopar.data import data_dir
from autopar.validate.regimes import primary_regime

if TYPE_CHECKING:  # no import at run time: the tables that show a band load no cost model for it
    from autopar.cost.step import Estimate
    from autopar.schema.plan import ParallelPlan

BANDS_FILE = "error_bands.json"


@dataclass(frozen=True, slots=True)
class ErrorBand:
    """Relative band of one regime: measured lies in [low_factor, high_factor] × predicted for
    at least 80 % of the withheld runs of sources the band was not built from."""

    regime: str
    low_factor: float
    high_factor: float
    runs: int
    sources: int = 0
    widened: bool = False

    @property
    def relative(self) -> tuple[float, float]:
        """(low, high) as signed fractions of the prediction, e.g. (-0.12, +0.08)."""
        return self.low_factor - 1.0, self.high_factor - 1.0

    def apply(self, predicted: float) -> tuple[float, float]:
        return predicted * self.low_factor, predicted * self.high_factor


@lru_cache(maxsize=1)
def _file() -> dict:
    path = data_dir("cost_models") / "bands" / BANDS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def error_band(regime: str) -> ErrorBand:
    """The shipped band of `regime` (one of autopar.validate.regimes.REGIMES); a regime without
    withheld runs gets the overall band."""
    content = _file()
    row = content.get("bands", {}).get(regime) or content.get("overall")
    if row is None:
        return ErrorBand(regime, 1.0, 1.0, 0)
    return ErrorBand(regime, 1.0 / (1.0 + row["high"]), 1.0 / (1.0 + row["low"]), row["runs"], row["sources"],
                     row["widened"])


def plan_band(moe: bool, seq_len: int, zero: int, precision: str) -> ErrorBand:
    """The band of a plan's primary regime (autopar.validate.regimes.primary_regime)."""
    return error_band(primary_regime(moe, seq_len, zero, precision))


def estimate_band(plan: ParallelPlan, est: Estimate) -> tuple[float, float]:
    """(low, high) tokens/s/GPU of the estimate of `plan`: the band of the plan's regime applied to
    its tokens/s/GPU."""
    return plan_band(est.moe, plan.seq_len, plan.zero, plan.precision).apply(est.tokens_per_s_per_gpu)


def estimate_band_sources(plan: ParallelPlan, est: Estimate) -> int:
    """How many sources the band of the estimate's regime rests on."""
    return plan_band(est.moe, plan.seq_len, plan.zero, plan.precision).sources


