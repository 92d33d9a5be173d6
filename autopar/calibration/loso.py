"""Leave-one-source-out validation (`autopar validate --leave-one-source-out`): for every source of
measured runs, refit the cost model's efficiencies on every *other* source, and score the withheld
source with that refit. A held-out split inside the same sources shares every systematic error of
the fit; a withheld source does not, so this is the honest estimate of the error on a new source.

Refit: the shipped cost models (a100, h100) are the starting point; the efficiencies named in
autopar.calibration.fit.LOSO_FREE_FOR_GPU (peak fractions, network efficiency, fp8 gain, and each
framework's own) are refitted by Nelder-Mead on all splits of the remaining runs of that GPU
family (vTrain's single-node set thinned to every `single_stride`-th run). A framework whose only
runs are withheld loses its own efficiencies (they fall back to Megatron's), since its shipped
values were fitted on the withheld runs. Shape and overhead terms (GEMM half-dim, launch floor)
keep their shipped values: the refit is of the efficiencies a new source would shift. H800 runs
use the refitted H100 efficiencies, as the shipped h800 model is derived from h100. GB200 runs are
refitted on the other GB200 runs; when every GB200 run is withheld (they are all one source's), the
gb200 model keeps its own kernel tables and takes the H100 refit's efficiencies (_TRANSFER_FROM), its
gemm_max carried by the two GPUs' measured matmul ceilings (autopar.calibration.ceilings).

Summary (APE = |predicted − measured| / measured, in percent): `median_ape` and `p90_ape` are
percentiles over all withheld runs with each source weighted equally (a source's runs share its
weight, so 1,440 vTrain single-node runs count as much as 5 MoE runs); per source and per regime
the plain median. `memory`: predicted vs measured peak of every run that measured it. `fit_rate`:
share of measured runs whose predicted plan fits in memory (every one of them really ran).
"""

from __future__ import annotations

import json
import math
from datetime import date
from pathlib import Path
from statistics import median
from typing import Any

from autopar.calibration.ceilings import carried_gemm_max
from autopar.calibration.fit import (
    LOSO_FREE_FOR_GPU, _field, builtin_fit_runs, fit, fittable, with_values, without_frameworks,
)
from autopar.calibration.trust import (
    BAND_COVERAGE_TARGET, MIN_BAND_SOURCES, Residual, Scored, calibrate_bands, rank_accuracy, weighted_quantile,
)
from autopar.cost.params import load_cost_model, params_from_file
from autopar.data import data_dir
from autopar.validate.bands import BANDS_FILE
from autopar.validate.dataset import MeasuredRun, load_runs
from autopar.validate.regimes import REGIMES
from autopar.validate.report import run_gpu_arch, run_regimes
from autopar.validate.runner import Prediction, predict

_FAMILY_OF_CLUSTER = {"vtrain-a100": "a100", "dgx-a100-80gb": "a100", "dgx-a100-40gb": "a100", "gb200-nvl72": "gb200"}
# A family whose every run is withheld takes its fitted efficiencies from this older family's refit
# (the same achieved fractions of its own peaks), keeping its own kernel tables and datasheet: what a
# user planning for new hardware has before its first run.
_TRANSFER_FROM = {"gb200": "h100"}


def gpu_family(cluster: str) -> str:
    """a100 for the A100 clusters, gb200 for GB200 NVL72, h100 (whose fit the H800/H200 models derive
    from) otherwise."""
    return _FAMILY_OF_CLUSTER.get(cluster, "h100")


def refit_without(source: str, family: str, iters: int, single_stride: int):
    """The `family` cost model refitted with every run of `source` withheld (CostParams)."""
    return params_from_file(_refit_file(source, family, iters, single_stride))


def _refit_file(source: str, family: str, iters: int, single_stride: int):
    base, _ = load_cost_model(family)
    runs = builtin_fit_runs(family, split=None, exclude_sources=frozenset({source}), single_stride=single_stride)
    orphaned = {fw for fw in base.frameworks if not any(r.framework == fw for r in runs)}
    base = without_frameworks(base, orphaned)
    if not runs and family in _TRANSFER_FROM:  # the shipped fit saw only the withheld source's runs
        donor_family = _TRANSFER_FROM[family]
        donor = _refit_file(source, donor_family, iters, single_stride)
        values = {name: _field(donor, name) for name in LOSO_FREE_FOR_GPU[family]}
        if "gemm_max" in values:  # the matmul kernels' distance from peak differs by GPU (MAMF table)
            values["gemm_max"] = carried_gemm_max(values["gemm_max"], donor_family, family)
        return with_values(base, values)
    free = fittable(LOSO_FREE_FOR_GPU[family], runs)
    if not runs or not free or iters <= 0:
        return base
    return fit(runs, base, free, rounds=1, iters=iters).file


def leave_one_source_out(iters: int = 40, single_stride: int = 16, sources: set[str] | None = None,
                         max_runs_per_source: int | None = None) -> dict[str, Any]:
    """Score every source (or those in `sources`) with a refit that never saw it. `iters`: Nelder-Mead
    iterations per refit; `max_runs_per_source`: score only the first runs of each source (tests)."""
    return summarize_loso(loso_predictions(iters, single_stride, sources, max_runs_per_source))


def loso_predictions(iters: int = 40, single_stride: int = 16, sources: set[str] | None = None,
                     max_runs_per_source: int | None = None) -> list[Prediction]:
    """Every (selected) run predicted by the refit that withheld its source."""
    all_runs = load_runs(sources)
    by_source: dict[str, list[MeasuredRun]] = {}
    for r in all_runs:
        if sources is None or r.source in sources:
            by_source.setdefault(r.source, []).append(r)
    preds: list[Prediction] = []
    for source, runs in sorted(by_source.items()):
        runs = runs[:max_runs_per_source] if max_runs_per_source else runs
        params = {f: refit_without(source, f, iters, single_stride) for f in sorted({gpu_family(r.cluster) for r in runs})}
        preds += [pr for pr in (predict(r, params[gpu_family(r.cluster)]) for r in runs) if pr is not None]
    return preds


def summarize_loso(preds: list[Prediction]) -> dict[str, Any]:
    """The --json shape: median_ape, p90_ape, sources, regimes, memory, fit_rate (APE in percent)."""
    if not preds:
        return {"median_ape": math.nan, "p90_ape": math.nan, "sources": [], "regimes": [], "hardware": [],
                "memory": {"runs": 0, "median_ape": None}, "fit_rate": math.nan}
    count = {}
    for pr in preds:
        count[pr.run.source] = count.get(pr.run.source, 0) + 1
    apes = [100 * abs(pr.error) for pr in preds]
    weights = [1.0 / count[pr.run.source] for pr in preds]
    sources = [{"source": s, "runs": n, "median_ape": median(100 * abs(pr.error) for pr in preds if pr.run.source == s)}
               for s, n in sorted(count.items())]
    regimes = []
    for regime in REGIMES:
        inside = [100 * abs(pr.error) for pr in preds if regime in run_regimes(pr)]
        if inside:
            regimes.append({"regime": regime, "runs": len(inside), "median_ape": median(inside)})
    mem = [100 * abs(pr.memory_error) for pr in preds if pr.memory_error is not None]
    archs: dict[str, list[float]] = {}
    for pr in preds:
        archs.setdefault(run_gpu_arch(pr.run), []).append(100 * abs(pr.error))
    hardware = [{"gpu_arch": a, "runs": len(v), "median_ape": median(v)} for a, v in sorted(archs.items())]
    trust = calibrate_bands(residuals(preds), REGIMES)
    for row in regimes:
        band = trust["bands"].get(row["regime"])
        if band is not None:  # the regime's own band (its primary-regime runs), nested coverage
            row.update(band_coverage=_or_none(band["band_coverage"]), band_sources=band["sources"])
    return {
        "median_ape": weighted_quantile(apes, weights, 0.5),
        "p90_ape": weighted_quantile(apes, weights, 0.9),
        "sources": sources,
        "regimes": regimes,
        "hardware": hardware,
        "memory": {"runs": len(mem), "median_ape": median(mem) if mem else None,
                   "worst_ape": max(mem) if mem else None},
        "fit_rate": sum(pr.fits for pr in preds) / len(preds),
        "band_coverage": _or_none(trust["band_coverage"]),
        "rank_accuracy": rank_accuracy(scored(preds)),
    }


def _or_none(x: float) -> float | None:
    """None for a coverage that cannot be measured (one source alone has no others to build from)."""
    return None if math.isnan(x) else x


def residuals(preds: list[Prediction]) -> list[Residual]:
    """Each withheld run's source, primary regime and signed residual predicted/measured − 1."""
    from autopar.validate.regimes import primary_regime

    out = []
    for pr in preds:
        r = pr.run
        regime = primary_regime(bool(r.arch.get("moe")), r.seq_len, pr.plan.zero, pr.plan.precision)
        out.append(Residual(r.source, regime, pr.error))
    return out


def scored(preds: list[Prediction]) -> list[Scored]:
    """Each withheld run as ranking needs it: its group (model, cluster, GPUs, batch, sequence) and
    the settings it states (layout, precision, framework options)."""
    out = []
    for pr in preds:
        r, a = pr.run, pr.run.arch
        model = (a.get("num_layers"), a.get("hidden_size"), a.get("ffn_hidden_size"), a.get("num_attention_heads"),
                 a.get("num_kv_heads"), a.get("vocab_size"), repr(a.get("moe")), repr(a.get("model")))
        setting = (r.tp, r.pp, r.dp, r.cp, r.ep, r.etp, r.vpp, r.micro_batch, r.recompute, r.zero_stage, r.precision,
                   r.sequence_parallel, r.framework, r.framework_release, r.compiled)
        out.append(Scored(r.source, (model, r.cluster, r.num_gpus, r.global_batch, r.seq_len), setting,
                          pr.predicted_tokens_per_s_per_gpu, r.measured_tokens_per_s_per_gpu))
    return out


def compute_bands(iters: int = 40) -> tuple[dict, dict]:
    """Run the leave-one-source-out validation once: (bands file content, its --json summary)."""
    preds = loso_predictions(iters=iters)
    trust = calibrate_bands(residuals(preds), REGIMES)
    summary = summarize_loso(preds)
    content = {"provenance": {"command": f"python -m autopar.calibration.loso --iters {iters}",
                              "date": date.today().isoformat(),
                              "method": "autopar.calibration.trust: per regime, the narrowest source-weighted residual "
                                        "interval (quantiles, then widened about 0) whose nested leave-one-source-out "
                                        f"coverage reaches {BAND_COVERAGE_TARGET:.0%} of runs and of sources; "
                                        f"regimes on fewer than {MIN_BAND_SOURCES} sources hold the overall band too",
                              "band_coverage": trust["band_coverage"]},
               "overall": trust["overall"], "bands": trust["bands"]}
    return content, summary


def equivalence_band_content(summary: dict) -> dict:
    """equivalence_band.json's fields from a leave-one-source-out summary: the source-weighted median
    error of predicted ratios between measured plans of one source."""
    rank = summary["rank_accuracy"]
    band = round(rank["ratio_error_median"], 3)
    return {"relative_band": band,
            "source": (f"autopar validate --leave-one-source-out: source-weighted median |error| of the predicted "
                       f"ratio between two measured plans of one source (model, cluster, GPUs and batch equal), "
                       f"{rank['pairs']:,} pairs of {len(rank['sources'])} sources, each predicted by a refit "
                       f"without its source = {100 * band:.1f} % ({date.today().isoformat()})")}


if __name__ == "__main__":
    import sys

    iters = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 40
    content, summary = compute_bands(iters)
    out = data_dir("cost_models") / "bands" / BANDS_FILE
    out.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")
    eq_path = Path(__file__).resolve().parent.parent / "search" / "equivalence_band.json"
    eq = json.loads(eq_path.read_text(encoding="utf-8"))
    eq.update(equivalence_band_content(summary))
    eq.pop("replace_with", None)
    eq_path.write_text(json.dumps(eq, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {eq_path}: relative_band {eq['relative_band']}")
