"""Start-up time: each command runs in a fresh process, N times; shown are the fastest process wall
time and the least CPU time (user + system, from wait4), the steadier figure on a shared machine.

    python benchmarks/startup.py              # 8 runs per command
    python benchmarks/startup.py --runs 3 --root /path/to/baseline/checkout

Targets (issue 15), process wall on the development machine: `autopar --help` under 0.25 s,
`autopar models` under 0.3 s. The `plan` rows are the whole set-up a search pays before it starts:
importing the CLI, the search driver and the API as a library does (`import`), and a dense
`plan --json` end to end, with its wall time outside the search (the search time it reports).
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
    ("autopar plan llama3-70b (64 H100) --json", ["-m", "autopar", *PLAN]),
]


def fastest(argv: list[str], runs: int, root: Path) -> dict:
    """Over `runs` fresh processes: the smallest wall time (`wall_s`, with the search time that run
    reported, for `plan --json`) and the smallest CPU time (`cpu_s`)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files: so do these runs
    best: dict = {"wall_s": float("inf"), "cpu_s": float("inf")}
    for _ in range(runs):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t = time.perf_counter()
            proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, env=env, cwd=root)
            _, status, usage = os.wait4(proc.pid, 0)  # -m above imports from cwd first
            wall = time.perf_counter() - t
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            if proc.returncode:
                raise SystemExit(f"{' '.join(argv)} failed: {err.read().decode()}")
            search_s = json.loads(out.read())["search"]["time_s"] if argv[-1] == "--quiet" else None
        if wall < best["wall_s"]:
            best.update(wall_s=wall, search_s=search_s)
        best["cpu_s"] = min(best["cpu_s"], usage.ru_utime + usage.ru_stime)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8, help="Processes per command; the fastest is shown (noisy machines).")
    ap.add_argument("--root", type=Path, default=ROOT, help="Checkout whose autopar to run (e.g. a baseline).")
    ap.add_argument("--no-plan", action="store_true", help="Skip the end-to-end plan row (its search dominates).")
    args = ap.parse_args()
    print(f"| command ({args.runs} runs) | fastest process wall | least CPU |\n|---|---|---|")
    for label, argv in COMMANDS:
        if args.no_plan and argv[-1] == "--quiet":
            continue
        row = fastest(argv, args.runs, args.root)
        outside = f" (outside the search: {row['wall_s'] - row['search_s']:.3f} s)" if row["search_s"] is not None else ""
        print(f"| {label} | {row['wall_s']:.3f} s{outside} | {row['cpu_s']:.3f} s |", flush=True)

if __name__ == "__main__":
    main()
