"""Brute force over the search space: `estimate` on every candidate, no bounds, no pruning. For
the optimality tests (small instances only); the driver must agree with it."""

from __future__ import annotations

from autopar.cost.params import CostParams
from autopar.cost.step import Estimate, estimate
from autopar.hardware import Cluster
from autopar.model.graph import ModelGraph
from autopar.schema.plan import ParallelPlan
from autopar.search.driver import plan_key
from autopar.search.space import DEFAULT_MEMORY_MARGIN, SpaceSpec, candidates


def score_all(graph: ModelGraph, cluster: Cluster, p: CostParams, spec: SpaceSpec,
              memory_margin: float = DEFAULT_MEMORY_MARGIN) -> list[tuple[ParallelPlan, Estimate]]:
    """Every candidate with its estimate, fastest first (ties by the plan's axes)."""
    scored = [(plan, estimate(graph, cluster, plan, p, memory_margin)) for plan in candidates(spec)]
    return sorted(scored, key=lambda pe: (pe[1].step_time_s, plan_key(pe[0])))


def brute_force(graph: ModelGraph, cluster: Cluster, p: CostParams, spec: SpaceSpec, top: int = 5,
                memory_margin: float = DEFAULT_MEMORY_MARGIN) -> list[tuple[ParallelPlan, Estimate]]:
    """The `top` fastest candidates that fit, as `search` should return them without refinement."""
    return [pe for pe in score_all(graph, cluster, p, spec, memory_margin) if pe[1].fits][:top]
