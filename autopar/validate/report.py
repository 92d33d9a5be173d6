"""`autopar validate`: predict every shipped measured run and summarize the error by hardware and by
source, separately for the fit and the held-out split."""

from __future__ import annotations

from typing import Any

from autopar.cost.params import CostParams, cost_model_for_gpu, load_cost_model
from autopar.validate.dataset import MeasuredRun, load_runs
from autopar.validate.runner import Prediction, _cluster_for, predict, summarize


def _params_for(run: MeasuredRun, cost_model: str | None) -> CostParams:
    if cost_model:
        return load_cost_model(cost_model)[1]
    return cost_model_for_gpu(_cluster_for(run.cluster, run.num_gpus).gpu_name)[1]


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
    return {
        "split": split,
        "rows": [_row(pr) for pr in preds],
        "summary": summarize(preds),
        "by_hardware": _grouped(preds, lambda pr: pr.run.cluster),
        "by_source": _grouped(preds, lambda pr: pr.run.source),
        "by_category": _grouped(preds, lambda pr: category(pr.run)),
        "skipped": skipped,
        "method": "tokens/s/GPU predicted for the fastest fitting plan among the run's unstated settings; "
                  "error = |predicted - measured| / measured",
    }


def category(run: MeasuredRun) -> str:
    """moe (routed experts), long-context (seq >= 8192 or cp > 1), or dense."""
    if run.arch.get("moe"):
        return "moe"
    if run.seq_len >= 8192 or run.cp > 1:
        return "long-context"
    return "dense"


def _grouped(preds: list[Prediction], key) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Prediction]] = {}
    for pr in preds:
        groups.setdefault(key(pr), []).append(pr)
    return {k: summarize(v) for k, v in sorted(groups.items())}


def _row(pr: Prediction) -> dict[str, Any]:
    r = pr.run
    return {"run_id": r.run_id, "source": r.source, "cluster": r.cluster, "gpus": r.num_gpus, "split": r.split,
            "layout": f"tp{r.tp} pp{r.pp} dp{r.dp}" + (f" cp{r.cp}" if r.cp > 1 else ""),
            "chosen": {"mbs": pr.plan.mbs, "vpp": pr.plan.vpp, "recompute": pr.plan.recompute.mode,
                       "tp_comm_overlap": pr.plan.tp_comm_overlap},
            "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu,
            "predicted_tokens_per_s_per_gpu": pr.predicted_tokens_per_s_per_gpu,
            "error": pr.error, "fits": pr.fits, "conversion": r.conversion}
