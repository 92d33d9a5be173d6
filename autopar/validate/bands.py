"""Error bands of a prediction: how far off the cost model has been, in the plan's regime, on
sources it was never fitted on.

The bands are the 10th-90th percentile of the leave-one-source-out residuals (predicted/measured − 1,
autopar.calibration.loso) of each regime, computed once by `python -m autopar.calibration.loso` and
shipped as data (cost_models/bands/error_bands.json, with the command and date that produced them); an
estimate never refits. A residual r means measured = predicted / (1 + r), so the band of a
prediction T is [T / (1 + r90), T / (1 + r10)].

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
    80 % of the withheld runs of that regime."""

    regime: str
    low_factor: float
    high_factor: float
    runs: int

    @property
    def relative(self) -> tuple[float, float]:
        """(low, high) as signed fractions of the prediction, e.g. (-0.12, +0.08)."""
        return self.low_factor - 1.0, self.high_factor - 1.0

    def apply(self, predicted: float) -> tuple[float, float]:
        return predicted * self.low_factor, predicted * self.high_factor


@lru_cache(maxsize=1)
def _bands() -> dict[str, dict]:
    path = data_dir("cost_models") / "bands" / BANDS_FILE
    return json.loads(path.read_text(encoding="utf-8"))["bands"] if path.is_file() else {}


def error_band(regime: str) -> ErrorBand:
    """The shipped band of `regime` (one of autopar.validate.regimes.REGIMES); a regime without
    withheld runs gets the widest shipped band."""
    bands = _bands()
    row = bands.get(regime)
    if row is None:
        if not bands:
            return ErrorBand(regime, 1.0, 1.0, 0)
        row = max(bands.values(), key=lambda b: b["p90"] - b["p10"])
    return ErrorBand(regime, 1.0 / (1.0 + row["p90"]), 1.0 / (1.0 + row["p10"]), row["runs"])


def plan_band(moe: bool, seq_len: int, zero: int, precision: str) -> ErrorBand:
    """The band of a plan's primary regime (autopar.validate.regimes.primary_regime)."""
    return error_band(primary_regime(moe, seq_len, zero, precision))


def estimate_band(plan: ParallelPlan, est: Estimate) -> tuple[float, float]:
    """(low, high) tokens/s/GPU of the estimate of `plan`: the band of the plan's regime applied to
    its tokens/s/GPU."""
    return plan_band(est.moe, plan.seq_len, plan.zero, plan.precision).apply(est.tokens_per_s_per_gpu)


