"""`autopar validate`: predict every shipped measured run and summarize the error by hardware and by
source, separately for the fit and the held-out split."""

from __future__ import annotations

from typing import Any

from autopar.cost.params import CostParams, cost_model_for_gpu, load_cost_model
from autopar.validate.dataset import MeasuredRun, load_runs
from statistics import median

from autopar.units import GiB
from autopar.validate.regimes import REGIMES, regimes_of
from autopar.validate.runner import Prediction, _cluster_for, predict, summarize


def _params_for(run: MeasuredRun, cost_model: str | None) -> CostParams:
    if cost_model:
        return load_cost_model(cost_model)[1]
    cluster = _cluster_for(run.cluster, run.num_gpus)
    if cluster.cost_model:  # the profile's own, measured by `autopar profile --distributed`
        return load_cost_model(cluster.cost_model)[1]
    return cost_model_for_gpu(cluster.gpu_name)[1]


def validate(split: str = "holdout", sources: set[str] | None = None, cost_model: str | None = None) -> dict[str, Any]:
    """Rows and summaries. split: "holdout", "fit" or "all"."""
    preds: list[Prediction] = []
    skipped = []
    for run in load_runs(sources):
        if split != "all" and run.split != split:
            continue
        pr = predict(run, _params_for(run, cost_model))
        if pr is None:
            skipped.append(run.run_id)
        else:
            preds.append(pr)
    return _report(preds, split, skipped)


def validate_runs(path: str, cost_model: str | None = None) -> dict[str, Any]:
    """`autopar validate --runs`: a user's own measured runs (autopar/schema/runs.py), each predicted
    with exactly the plan it states; the same rows and summaries as `validate`, plus `runs_file`."""
    from autopar.validate.user_runs import load_user_runs

    result = validate_stated(load_user_runs(path), cost_model)
    result["runs_file"] = path
    return result


def validate_stated(runs: list[MeasuredRun], cost_model: str | None = None) -> dict[str, Any]:
    """Runs that state their plan (a runs file's, or training logs' through autopar.logs), each
    predicted with exactly that plan: validate's rows and summaries."""
    preds = [predict(run, _params_for(run, cost_model)) for run in runs]
    result = _report([pr for pr in preds if pr is not None], "all", [])
    result["method"] = ("tokens/s/GPU predicted for the plan each run states (estimate's defaults for what it leaves "
                        "out); error = (predicted - measured) / measured")
    return result


def _report(preds: list[Prediction], split: str, skipped: list[str]) -> dict[str, Any]:
    return {
        "split": split,
        "rows": [_row(pr) for pr in preds],
        "summary": summarize(preds),
        "by_hardware": _grouped(preds, lambda pr: pr.run.cluster),
        "by_source": _grouped(preds, lambda pr: pr.run.source),
        "by_category": _grouped(preds, lambda pr: category(pr.run)),
        "by_regime": by_regime(preds),
        "by_framework": _grouped(preds, lambda pr: pr.run.framework),
        "by_gpu_arch": _grouped(preds, lambda pr: run_gpu_arch(pr.run)),
        "memory": memory_summary(preds),
        "skipped": skipped,
        "method": "tokens/s/GPU predicted for the fastest fitting plan among the run's unstated settings; "
                  "error = |predicted - measured| / measured",
    }


def run_gpu_arch(run: MeasuredRun) -> str:
    """The hardware family a run ran on (autopar.hardware.gpu_arch: ampere, hopper, blackwell, cdna3,
    cdna4), from its cluster profile's GPU."""
    from autopar.hardware import gpu_arch

    return gpu_arch(_cluster_for(run.cluster, run.num_gpus).gpu_name)


def category(run: MeasuredRun) -> str:
    """moe (routed experts), long-context (seq >= 8192 or cp > 1), or dense."""
    if run.arch.get("moe"):
        return "moe"
    if run.seq_len >= 8192 or run.cp > 1:
        return "long-context"
    return "dense"


def run_regimes(pr: Prediction) -> list[str]:
    """The regimes of a predicted run (autopar.validate.regimes), from its chosen plan."""
    r = pr.run
    return regimes_of(bool(r.arch.get("moe")), r.seq_len, pr.plan.zero, pr.plan.precision)


def by_regime(preds: list[Prediction]) -> dict[str, dict[str, float]]:
    """Error summary of every regime (a run counts in each regime it belongs to)."""
    return {regime: summarize([pr for pr in preds if regime in run_regimes(pr)]) for regime in REGIMES
            if any(regime in run_regimes(pr) for pr in preds)}


def memory_summary(preds: list[Prediction]) -> dict[str, Any]:
    """Predicted vs measured peak memory of every run that measured it (the chosen plan's peak)."""
    rows = [pr for pr in preds if pr.memory_error is not None]
    errs = sorted(abs(pr.memory_error) for pr in rows)
    return {"runs": len(rows), "median_ape": 100 * median(errs) if errs else None,
            "worst_ape": 100 * errs[-1] if errs else None,
            "rows": [{"run_id": pr.run.run_id, "measured_gib": pr.run.measured_memory_gib,
                      "predicted_gib": pr.peak_memory_bytes / GiB, "error": pr.memory_error} for pr in rows]}


def _grouped(preds: list[Prediction], key) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Prediction]] = {}
    for pr in preds:
        groups.setdefault(key(pr), []).append(pr)
    return {k: summarize(v) for k, v in sorted(groups.items())}


def _row(pr: Prediction) -> dict[str, Any]:
    r = pr.run
    return {"run_id": r.run_id, "source": r.source, "cluster": r.cluster, "gpus": r.num_gpus, "split": r.split,
            "layout": f"tp{r.tp} pp{r.pp} dp{r.dp}" + (f" cp{r.cp}" if r.cp > 1 else "")
                      + (f" ep{r.ep}" if r.ep > 1 else ""),
            "chosen": {"mbs": pr.plan.mbs, "vpp": pr.plan.vpp, "recompute": pr.plan.recompute.mode,
                       "tp_comm_overlap": pr.plan.tp_comm_overlap},
            "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu,
            "predicted_tokens_per_s_per_gpu": pr.predicted_tokens_per_s_per_gpu,
            "error": pr.error, "fits": pr.fits, "conversion": r.conversion, "framework": r.framework,
            "regimes": run_regimes(pr), "measured_memory_gib": r.measured_memory_gib,
            "predicted_memory_gib": pr.peak_memory_bytes / GiB}
