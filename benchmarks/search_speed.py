"""Search wall time, peak Python memory and candidate counts on four published-scale cases, and
Llama 3 405B's published layout (tp8 pp16, dp = 16384/128; Dubey et al. 2024 §3.3.2, Table 4)
estimated next to the best plan found.

    python benchmarks/search_speed.py
Target: the 16,384-GPU search under 2 s on one core.
"""

from __future__ import annotations

import resource
import time

from autopar.api import load_cluster, load_model, resolve_cost_model
from autopar.cost.step import estimate
from autopar.schema.plan import ParallelPlan
from autopar.search import refine_plan, search
from autopar.units import GiB

CASES = [  # (model, cluster, gpus, seq_len, global_batch)
    ("gpt3-175b", "dgx-a100-80gb", 1024, 2048, 1536),
    ("llama3-70b", "dgx-h100", 64, 8192, 128),
    ("llama3.1-405b", "dgx-h100", 16384, 8192, 2048),
    ("deepseek-v3", "hgx-h800", 2048, 4096, 15360),
    ("llama3-8b", "dgx-h100", 64, 131072, 32),  # long context: the search must use CP
]


def describe(plan: ParallelPlan, gpus: int) -> str:
    split = f" split {list(plan.layers_per_stage)}" if plan.layers_per_stage else ""
    return f"{plan.layout()} dp{plan.dp_for(gpus)} mbs{plan.mbs} zero{plan.zero} recompute {plan.recompute.label()}{split}"


def run_case(model: str, cluster: str, gpus: int, seq: int, gbs: int):
    load_model(model)  # building the layer graph is not search time
    t = time.perf_counter()
    result = search(model, cluster, gpus, seq, gbs)
    wall = time.perf_counter() - t
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    plan, est = result.plans[0]
    print(f"{model} on {gpus} × {cluster} (seq {seq}, gbs {gbs})")
    print(f"  wall {wall:.2f} s, process peak RSS so far {peak_rss_mib:.0f} MiB")
    print(f"  candidates {result.candidates}, pruned {result.pruned} (time {result.pruned_time}, memory "
          f"{result.pruned_memory}), scored {result.scored}, feasible {result.feasible}, refined {result.refined}")
    print(f"  best: {describe(plan, gpus)}: step {est.step_time_s:.2f} s, MFU {est.mfu:.1%}, "
          f"peak {est.peak_memory_bytes / GiB:.1f} GiB")
    return result


def published_405b(best: tuple[ParallelPlan, object]) -> None:
    g = load_model("llama3.1-405b")
    c = load_cluster("dgx-h100", 16384)
    p = resolve_cost_model(c, None)
    print("llama3.1-405b published layout (Llama 3 paper: tp8 pp16 cp1 dp128, seq 8192, gbs 2048) vs found best")
    published = ParallelPlan(tp=8, pp=16, mbs=1, global_batch=2048, seq_len=8192)
    rows = [("published, vpp1", published),
            ("published, v2", published.model_copy(update={"vpp": 2})),
            *[(f"published + DP/ILP #{i + 1}", x) for i, (x, _) in enumerate(refine_plan(g, c, p, published))],
            ("found", best[0])]
    for label, plan in rows:
        e = estimate(g, c, plan, p, memory_margin=0.1)
        print(f"  {label:24s} {describe(plan, 16384)}: step {e.step_time_s:.2f} s, MFU {e.mfu:.1%}, "
              f"peak {e.peak_memory_bytes / GiB:.1f} GiB, fits {e.fits}")


def main() -> None:
    results = {}
    for case in CASES:
        results[case[0]] = run_case(*case)
    published_405b(results["llama3.1-405b"].plans[0])


if __name__ == "__main__":
    main()
