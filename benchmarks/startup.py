"""Start-up time: each command runs in a fresh process, N times; shown are the fastest process wall
time and the least CPU time (user + system, from wait4), the steadier figure on a shared machine.

    python benchmarks/startup.py                                  # 8 runs per command
    python benchmarks/startup.py --runs 10 --baseline /tmp/old    # alternate runs with another checkout

With --baseline, each command runs alternately in this checkout and the baseline checkout (e.g.
`git archive <commit> | tar -x -C /tmp/old`), so both see the same load.

Targets (issue 15), process wall on the development machine: `autopar --help` under 0.25 s,
`autopar models` under 0.3 s. The `plan` rows are the set-up a search pays: importing the CLI, the
search driver and the API as a library does (`import`), a dense `plan --json` with its axes pinned
(a search of a tenth of a second, so the row is nearly all set-up), and the same plan unpinned, with
its wall time outside the search (the search time it reports).
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

ROOT = Path(__file__).resolve().parent.parent
PLAN = ["plan", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
        "--global-batch", "128", "--json", "--quiet"]
# (label, argv after the interpreter)
COMMANDS = [
    ("autopar --help", ["-m", "autopar", "--help"]),
    ("autopar models", ["-m", "autopar", "models"]),
    ("autopar models --json", ["-m", "autopar", "models", "--json"]),
    ("autopar clusters", ["-m", "autopar", "clusters"]),
    ("import autopar.cli, search.driver, api", ["-c", "import autopar.cli, autopar.search.driver, autopar.api"]),
    ("autopar plan llama3-70b (64 H100) --fix tp=2,pp=8,cp=4,mbs=1", ["-m", "autopar", *PLAN, "--fix", "tp=2,pp=8,cp=4,mbs=1"]),
    ("autopar plan llama3-70b (64 H100)", ["-m", "autopar", *PLAN]),
]


def run_once(argv: list[str], root: Path) -> tuple[float, float, float | None]:
    """(wall_s, cpu_s, the search time a `plan --json` reports) of one fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files: so do these runs
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, env=env, cwd=root)
        _, status, usage = os.wait4(proc.pid, 0)  # -m above imports from cwd first
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{' '.join(argv)} in {root} failed: {err.read().decode()}")
        search_s = json.loads(out.read())["search"]["time_s"] if "plan" in argv else None
    return wall, usage.ru_utime + usage.ru_stime, search_s


def best_of(argv: list[str], runs: int, roots: list[Path]) -> list[dict]:
    """Per root, over `runs` processes (the roots taking turns): the smallest wall time, with the
    search time that run reported, and the smallest CPU time."""
    best = [{"wall_s": float("inf"), "cpu_s": float("inf"), "search_s": None} for _ in roots]
    for _ in range(runs):
        for b, root in zip(best, roots):
            wall, cpu, search_s = run_once(argv, root)
            if wall < b["wall_s"]:
                b.update(wall_s=wall, search_s=search_s)
            b["cpu_s"] = min(b["cpu_s"], cpu)
    return best


def cell(row: dict) -> str:
    outside = f" (outside the search {row['wall_s'] - row['search_s']:.3f} s)" if row["search_s"] is not None else ""
    return f"{row['wall_s']:.3f} s{outside} | {row['cpu_s']:.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8, help="Processes per command; the fastest is shown (noisy machines).")
    ap.add_argument("--root", type=Path, default=ROOT, help="Checkout whose autopar to run.")
    ap.add_argument("--baseline", type=Path, help="Another checkout to run alternately, for before/after figures.")
    ap.add_argument("--no-plan", action="store_true", help="Skip the plan rows.")
    args = ap.parse_args()
    roots = [args.root] + ([args.baseline] if args.baseline else [])
    head = "fastest wall | least CPU"
    print(f"| command ({args.runs} runs) | {head} |" + (f" baseline {head} |" if args.baseline else ""))
    print("|---|---|---|" + ("---|---|" if args.baseline else ""))
    for label, argv in COMMANDS:
        if args.no_plan and "plan" in argv:
            continue
        rows = best_of(argv, args.runs, roots)
        print(f"| {label} | " + " | ".join(cell(r) for r in rows) + " |", flush=True)


if __name__ == "__main__":
    main()
