"""Plan search: enumerate valid layouts (space), bound and score them with the cost model
(driver, costs), balance pipeline stages (partition, a DP), choose per-stage recompute (ilp:
exact stage by stage, with the CP-SAT model as its cross-check) and rank the plans for reading
(rank: distinct alternatives, simplest first within the model's error); brute force over the same
space (brute) for the optimality tests.

    from autopar.search import search
    result = search("llama3-70b", "dgx-h100", 64, seq_len=8192, global_batch=128)
    plan, est = result.plans[0]          # the fastest
    plan, est = result.chosen            # the first distinct alternative (what `autopar plan` picks)
"""

from autopar.search.driver import SearchResult, plan_key, refine_plan, search, search_graph
from autopar.search.space import DEFAULT_MEMORY_MARGIN, SpaceSpec, candidates, space_spec_for

__all__ = ["DEFAULT_MEMORY_MARGIN", "SearchResult", "SpaceSpec", "candidates", "plan_key", "refine_plan", "search",
           "search_graph", "space_spec_for"]
