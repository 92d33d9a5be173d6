"""A run's inputs: the model graph, the sized cluster and the cost model loaded by name, and the
plan built from its fields.

`autopar.search` and `autopar.report` receive their inputs from here (or as loaded objects); the
library surface `autopar.api` re-exports these functions. Nothing here imports search, report or api,
so the import graph stays one-way: inputs → search / report → api → cli.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autopar.cost.params import CostParams, cost_model_for_gpu, load_cost_model
from autopar.errors import InvalidPlanError
from autopar.limits import clip_repr
from autopar.hardware import Cluster, load_cluster
from autopar.model import PRESET_NAMES, ModelGraph, build_graph, load_model
from autopar.schema import one_line
from autopar.schema.model import ModelSpec
from autopar.schema.plan import ParallelPlan

__all__ = ["load_cluster", "load_inputs", "load_model", "load_target_model", "make_plan", "plan_from_fields",
           "resolve_cost_model"]


def resolve_cost_model(cluster: Cluster, cost_model: str | None) -> CostParams:
    """The named (or file) cost model, else the shipped one for the cluster's GPU."""
    if cost_model:
        return load_cost_model(cost_model)[1]
    if getattr(cluster, "cost_model", None):  # the profile's own (autopar profile --distributed)
        return load_cost_model(cluster.cost_model)[1]
    return cost_model_for_gpu(cluster.gpu_name)[1]


def load_inputs(model: str, cluster: str, gpus: int, cost_model: str | None = None
                ) -> tuple[ModelGraph, Cluster, CostParams]:
    """(graph, sized cluster, cost parameters) for a model name or file, a cluster profile and a GPU count."""
    graph = load_model(model)
    c = load_cluster(cluster, gpus)
    return graph, c, resolve_cost_model(c, cost_model)


def load_target_model(model: str, spec: ModelSpec) -> ModelGraph:
    """A plan file's model: by name or path when it is still there, else from the spec the file recorded."""
    try:
        available = model in PRESET_NAMES or Path(model).expanduser().exists()
    except (OSError, ValueError):  # a name no file system holds (too long, a NUL): use the stored spec
        available = False
    if not available:
        return build_graph(spec)
    graph = load_model(model)
    differ = [f"{f} {getattr(spec, f)} (the model has {getattr(graph.spec, f)})" for f in _SHAPE
              if getattr(spec, f) != getattr(graph.spec, f)]
    if differ:
        raise InvalidPlanError(f"the plan file names model {clip_repr(model)} but its model_spec describes another "
                               f"model: {', '.join(differ)}; re-plan it, or fix model or model_spec in the file")
    return graph


# What a plan file's stored model must share with the model it names (else explain, which reads the
# name, and export, which reads the spec, would describe two models).
_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "head_size", "ffn_hidden_size",
          "vocab_size", "moe", "mla", "tie_embeddings")


def make_plan(**fields: Any) -> ParallelPlan:
    """A ParallelPlan from keyword fields, with one-line errors."""
    try:
        return ParallelPlan(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise InvalidPlanError(one_line(exc, "invalid plan"))


def plan_from_fields(fields: dict[str, Any], gpus: int, global_batch: int, seq_len: int, where: str = "",
                     **defaults: Any) -> ParallelPlan:
    """A plan from plan fields (recompute may be just its mode; dp, if given, must be what the GPUs
    leave), `defaults` filling what they leave out; `where` prefixes the dp message."""
    a = dict(fields)
    dp = a.pop("dp", None)
    rec = a.pop("recompute", None)
    merged = {**defaults, **a, "global_batch": global_batch, "seq_len": seq_len}
    if rec is not None:
        merged["recompute"] = {"mode": rec} if isinstance(rec, str) else rec
    if dp is not None and (isinstance(dp, bool) or not isinstance(dp, int) or dp < 1):
        raise InvalidPlanError(f"{where}dp {clip_repr(dp)} must be a whole number of at least 1 (or drop it: it is "
                               "derived)")
    plan = make_plan(**merged)
    if dp is not None and plan.model_parallel_size() * dp != gpus:
        raise InvalidPlanError(f"{where}dp {dp} · tp·pp·cp {plan.model_parallel_size()} != {gpus} GPUs; "
                               "drop dp (it is derived) or fix the degrees")
    return plan
