"""Prints how long one `estimate` takes: in-process (per call) and the CLI end to end (start-up
included), for a few representative plans. Target (issue 3): the CLI under 1 s wall."""

from __future__ import annotations

import subprocess
import sys
import time

from autopar.api import estimate_plan, make_plan

CASES = [
    ("gpt3-175b", "dgx-a100-80gb", 1024, dict(tp=8, pp=16, global_batch=1536, seq_len=2048)),
    ("llama3-70b", "dgx-h100", 64, dict(tp=8, pp=4, vpp=5, global_batch=128, seq_len=8192)),
    ("llama3.1-405b", "dgx-h100", 16384, dict(tp=8, pp=16, global_batch=2048, seq_len=8192)),
    ("deepseek-v3", "hgx-h800", 2048, dict(tp=1, pp=16, ep=64, global_batch=15360, seq_len=4096)),
]


def main() -> None:
    for model, cluster, gpus, fields in CASES:
        plan = make_plan(**fields)
        estimate_plan(model, cluster, gpus, plan)  # warm caches (model graph, cost model)
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            estimate_plan(model, cluster, gpus, plan)
        per_call_ms = (time.perf_counter() - t0) / n * 1e3
        args = [sys.executable, "-m", "autopar", "estimate", model, "--cluster", cluster, "--gpus", str(gpus),
                "--global-batch", str(fields["global_batch"]), "--seq-len", str(fields["seq_len"]), "--json"]
        args += [x for k in ("tp", "pp", "vpp", "ep") if k in fields for x in (f"--{k}", str(fields[k]))]
        t0 = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        cli_s = time.perf_counter() - t0
        print(f"{model:>14} on {gpus:>5} x {cluster:<14} estimate {per_call_ms:6.2f} ms/call   CLI wall {cli_s:5.2f} s")


if __name__ == "__main__":
    main()
