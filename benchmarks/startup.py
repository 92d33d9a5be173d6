"""Start-up time: each command runs in a fresh process; the fastest of N runs is shown with its
process wall time and CPU time (user + system, from wait4), the steadier figure on a shared machine.

    python benchmarks/startup.py              # 8 runs per command
    python benchmarks/startup.py --runs 3 --root /path/to/baseline/checkout

Targets (issue 15), process wall on the development machine: `autopar --help` under 0.25 s,
`autopar models` under 0.3 s. The `plan` rows are the whole set-up a search pays before it starts:
importing the CLI, the search driver and the API (`import`), and a dense `plan --json` end to end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
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


def fastest(argv: list[str], runs: int, root: Path) -> tuple[float, float]:
    """(wall_s, cpu_s) of the run with the smallest wall time among `runs` fresh processes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files: so do these runs
    best: tuple[float, float] | None = None
    for _ in range(runs):
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env, cwd=root)  # -m imports from cwd first
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.read().decode()}")
        proc.stderr.close()
        if best is None or wall < best[0]:
            best = (wall, usage.ru_utime + usage.ru_stime)
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8, help="Processes per command; the fastest is shown (noisy machines).")
    ap.add_argument("--root", type=Path, default=ROOT, help="Checkout whose autopar to run (e.g. a baseline).")
    ap.add_argument("--no-plan", action="store_true", help="Skip the end-to-end plan row (its search dominates).")
    args = ap.parse_args()
    print(f"| command (fastest of {args.runs}) | process wall | CPU |\n|---|---|---|")
    for label, argv in COMMANDS:
        if args.no_plan and argv[-1] == "--quiet":
            continue
        wall, cpu = fastest(argv, args.runs, args.root)
        print(f"| {label} | {wall:.3f} s | {cpu:.3f} s |", flush=True)


if __name__ == "__main__":
    main()
