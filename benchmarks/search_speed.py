"""Search speed on published-scale cases: each case runs `autopar plan ... --json` in a fresh
process and reports its process wall time (start-up, imports, search, output), the search time
the command reports, the process's CPU time and its peak RSS; then Llama 3 405B's published
layout (tp8 pp16, dp = 16384/128; Dubey et al. 2024 §3.3.2, Table 4) estimated next to the best
plan found.

    python benchmarks/search_speed.py            # every case, 3 runs each (the fastest run shown)
    python benchmarks/search_speed.py --runs 1 --case deepseek-v3

Targets, one core: process wall under 0.6 s for the three dense Megatron cases and under 1.0 s for
DeepSeek-V3 / 2,048 H800 and Qwen3-235B-A22B / 1,024 H100; peak RSS under 200 MiB. Every framework's
search as fast as Megatron's, in process CPU seconds (best of 3): torchtitan Llama-3-70B / 256 H100
and Llama-3.1-405B / 512 H100 under 0.6 s, torchtitan Qwen3-235B-A22B / 1,024 H100 under 1.5 s,
DeepSpeed Llama-3-70B / 64 H100 under 0.6 s; a model the framework cannot train (DeepSeek-V3's MTP
under torchtitan) refused in the same budget. Spaces near the cap (autopar.search.space
MAX_RAW_CANDIDATES): Llama 4 Maverick / 576 GB200 (319,932 raw plans) under 2 s, Kimi K2 / 18,432 GB200
at 128K tokens (2,795,418) under 12 s and 512 MiB. The fastest run of a case is the one with least CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autopar.api import load_cluster, load_model, resolve_cost_model
from autopar.cost.step import estimate
from autopar.schema.plan import ParallelPlan
from autopar.search import refine_plan
from autopar.units import GiB

CASES = [  # (model, cluster, gpus, seq_len, global_batch, framework)
    ("gpt3-175b", "dgx-a100-80gb", 1024, 2048, 1536, "megatron"),
    ("llama3-70b", "dgx-h100", 64, 8192, 128, "megatron"),
    ("llama3.1-405b", "dgx-h100", 16384, 8192, 2048, "megatron"),
    ("deepseek-v3", "hgx-h800", 2048, 4096, 4096, "megatron"),
    ("qwen3-235b-a22b", "dgx-h100", 1024, 4096, 4096, "megatron"),
    ("deepseek-v3", "hgx-h800", 2048, 4096, 15360, "megatron"),  # the report's batch (15,360 sequences)
    ("llama3-8b", "dgx-h100", 64, 131072, 32, "megatron"),  # long context: the search must use CP
    ("llama3-70b", "dgx-h100", 256, 8192, 256, "torchtitan"),
    ("llama3.1-405b", "dgx-h100", 512, 8192, 512, "torchtitan"),
    ("qwen3-235b-a22b", "dgx-h100", 1024, 4096, 4096, "torchtitan"),
    ("llama3-70b", "dgx-h100", 64, 8192, 128, "deepspeed"),
    ("deepseek-v3", "hgx-h800", 2048, 4096, 15360, "torchtitan"),  # refused: torchtitan builds no MTP
    ("llama4-maverick-17b-128e", "gb200-nvl72", 576, 8192, 1152, "megatron"),  # 319,932 raw plans
    ("kimi-k2", "gb200-nvl72", 18432, 131072, 73728, "megatron"),  # 2,795,418: the largest realistic space
]
ROOT = Path(__file__).resolve().parent.parent


def describe(plan: ParallelPlan, gpus: int) -> str:
    split = f" split {list(plan.layers_per_stage)}" if plan.layers_per_stage else ""
    return f"{plan.layout()} dp{plan.dp_for(gpus)} mbs{plan.mbs} zero{plan.zero} recompute {plan.recompute.label(plan.framework)}{split}"


def run_case(model: str, cluster: str, gpus: int, seq: int, gbs: int, framework: str, runs: int,
             root: Path = ROOT) -> dict:
    """The fastest (least CPU) of `runs` fresh `autopar plan --json` processes: process wall, the
    search time it reports, CPU (user + system) and peak RSS of that process (from wait4). A refusal
    (exit 2, one line) is a result too: its row says so."""
    cmd = [sys.executable, "-m", "autopar", "plan", model, "--cluster", cluster, "--gpus", str(gpus),
           "--seq-len", str(seq), "--global-batch", str(gbs), "--framework", framework, "--top", "3", "--json",
           "--quiet"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files: so do these runs
    subprocess.run([sys.executable, "-c", "import autopar.cli, autopar.api, autopar.search"], env=env, cwd=root,
                   check=True)  # untimed: writes the .pyc files the timed runs then read
    best = None
    for _ in range(runs):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=root)  # -m imports from cwd first
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            if proc.returncode == 2:
                data = {"refused": err.read().decode().strip()}
            elif proc.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed: {err.read().decode()}")
            else:
                data = json.loads(out.read())
        row = {"wall_s": wall, "search_s": data.get("search", {}).get("time_s", 0.0),
               "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
               "data": data}
        if best is None or row["cpu_s"] < best["cpu_s"]:
            best = row
    return best


def print_case(case: tuple, row: dict) -> None:
    model, cluster, gpus, seq, gbs, framework = case
    data = row["data"]
    print(f"{model} on {gpus} × {cluster} (seq {seq}, gbs {gbs}, {framework})")
    print(f"  process wall {row['wall_s']:.2f} s, search {row['search_s']:.2f} s, CPU {row['cpu_s']:.2f} s, "
          f"peak RSS {row['rss_mib']:.0f} MiB")
    if "refused" in data:
        print(f"  refused: {data['refused']}")
        return
    best, s = data["plans"][0], data["search"]
    print(f"  candidates {s['candidates']}, pruned {s['pruned']}, scored {s['scored']}, feasible {s['feasible']}, "
          f"refined {s['refined']}")
    print(f"  best: {describe(_plan_from_json(best['parallel']), case[2])}: step {best['estimate']['step_time_s']:.2f} s")


def published_405b(found: ParallelPlan) -> None:
    g = load_model("llama3.1-405b")
    c = load_cluster("dgx-h100", 16384)
    p = resolve_cost_model(c, None)
    print("llama3.1-405b published layout (Llama 3 paper: tp8 pp16 cp1 dp128, seq 8192, gbs 2048) vs found best")
    published = ParallelPlan(tp=8, pp=16, mbs=1, global_batch=2048, seq_len=8192)
    rows = [("published, vpp1", published),
            ("published, v2", published.model_copy(update={"vpp": 2})),
            *[(f"published + DP/ILP #{i + 1}", x) for i, (x, _) in enumerate(refine_plan(g, c, p, published))],
            ("found", found)]
    for label, plan in rows:
        e = estimate(g, c, plan, p, memory_margin=0.1)
        print(f"  {label:24s} {describe(plan, 16384)}: step {e.step_time_s:.2f} s, MFU {e.mfu:.1%}, "
              f"peak {e.peak_memory_bytes / GiB:.1f} GiB, fits {e.fits}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="Processes per case; the fastest is shown (noisy machines).")
    ap.add_argument("--case", action="append", help="Only cases of this model (repeatable).")
    ap.add_argument("--framework", action="append", help="Only cases of this framework (repeatable).")
    ap.add_argument("--root", type=Path, default=ROOT, help="Checkout whose autopar to run (e.g. a baseline).")
    ap.add_argument("--no-published", action="store_true", help="Skip the 405B published-layout comparison.")
    args = ap.parse_args()
    rows = []
    for case in CASES:
        if (args.case and case[0] not in args.case) or (args.framework and case[5] not in args.framework):
            continue
        row = run_case(*case, runs=args.runs, root=args.root)
        print_case(case, row)
        rows.append((case, row))
    print("\n| case | framework | process wall | search | CPU | peak RSS | candidates | fastest plan | chosen (first row) |"
          "\n|---|---|---|---|---|---|---|---|---|")
    for (model, cluster, gpus, seq, gbs, framework), row in rows:
        data = row["data"]
        lead = (f"| {model}, {gpus:,} × {cluster}, seq {seq}, gbs {gbs} | {framework} | {row['wall_s']:.2f} s "
                f"| {row['search_s']:.2f} s | {row['cpu_s']:.2f} s | {row['rss_mib']:.0f} MiB |")
        if "refused" in data:
            print(f"{lead} — | refused before the search | — |")
            continue
        best, s = _plan_from_json(data["plans"][0]["parallel"]), data["search"]
        chosen = _plan_from_json(data["alternatives"][0]["parallel"]).layout() if data.get("alternatives") else "—"
        print(f"{lead} {s['candidates']:,} | {best.layout()} | {chosen} |")
    if not args.no_published and any(c[0] == "llama3.1-405b" and c[5] == "megatron" for c, _ in rows):
        found = next(r for c, r in rows if c[0] == "llama3.1-405b" and c[5] == "megatron")["data"]["plans"][0]["parallel"]
        published_405b(_plan_from_json(found))


def _plan_from_json(parallel: dict) -> ParallelPlan:
    fields = set(ParallelPlan.model_fields)
    return ParallelPlan(**{k: v for k, v in parallel.items() if k in fields})


if __name__ == "__main__":
    main()
