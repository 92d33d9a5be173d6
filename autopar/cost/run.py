"""The whole run: days, GPU-hours and cost to a number of training tokens, with interruptions,
checkpoints and restarts priced. Small pure functions in base units (seconds, bytes, counts), then
`run_block`, which puts them together for one plan's estimate.

The failure model: interruptions arrive as a Poisson process at a constant rate per GPU, so a job
of n GPUs is interrupted on average every M = 86,400 / (rate · n) seconds (its MTBF falls as 1/n).
An interruption costs the restart R (relaunch, then reading the last checkpoint back) and the work
done since the last checkpoint. Checkpoints are taken every τ seconds of training and block it for
C seconds each. Ignored: interruptions during a restart, failures that need a person (the Llama 3
paper's "three" of 466), time lost to stragglers and slow nodes, and the data-loader's own state.

Defaults and their sources:
- interruption rate: 466 job interruptions (419 unexpected, 47 planned maintenance) in a 54-day
  snapshot of Llama 3 405B pre-training on 16,384 H100 (Dubey et al. 2024, "The Llama 3 Herd of
  Models", §3.3.4 and Table 5: faulty GPUs 30.1 % and GPU HBM3 17.2 % of the unexpected ones,
  software bugs 12.9 %, network switches and cables 8.4 %, host maintenance 7.6 %, ...): 5.27e-4 per
  GPU-day, one every 2.8 hours on 16,384 GPUs.
- storage bandwidth: 2 TB/s, the sustained throughput of the Tectonic file system Llama 3 wrote its
  checkpoints to (same paper, §3.3.1; 7 TB/s peak), shared by the whole job.
- restart: 10 minutes to relaunch the job on healthy nodes and initialise it (no published figure
  for a job like this one: an assumption, stated as one; set --restart-minutes from your own
  cluster's logs), plus reading the checkpoint back at the storage bandwidth.
- host copy (what an asynchronous save still blocks on): each GPU copies its shard to host memory
  over PCIe x16, 32 GB/s per direction for PCIe 4.0 (A100), 64 GB/s for PCIe 5.0 (H100, H200, B200)
  (PCI-SIG base specifications 4.0 and 5.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.errors import InvalidPlanError

SECONDS_PER_DAY = 86_400.0
DEFAULT_FAILURES_PER_GPU_DAY = 466 / (54 * 16_384)  # Llama 3 paper §3.3.4: 466 interruptions, 54 days, 16K GPUs
DEFAULT_CHECKPOINT_BYTES_PER_S = 2e12  # Tectonic sustained throughput, Llama 3 paper §3.3.1
DEFAULT_RESTART_S = 600.0  # relaunch and initialisation: an assumption (module docstring)
HOST_COPY_BYTES_PER_S = {"ampere": 32e9, "hopper": 64e9, "blackwell": 64e9}  # PCIe 4.0 / 5.0 x16, one way


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What a whole-run estimate needs beyond the plan (CLI --train-tokens and friends)."""

    train_tokens: float
    gpu_hour_cost_usd: float | None = None
    failures_per_gpu_day: float = DEFAULT_FAILURES_PER_GPU_DAY
    checkpoint_bytes_per_s: float = DEFAULT_CHECKPOINT_BYTES_PER_S
    restart_launch_s: float = DEFAULT_RESTART_S
    async_save: bool = False
    checkpoint_interval_s: float | None = None  # None: the interval that maximises goodput


def job_mtbf_s(failures_per_gpu_day: float, num_gpus: int) -> float:
    """Mean time between interruptions of a job on `num_gpus` GPUs: 86,400 / (rate · n) seconds."""
    return SECONDS_PER_DAY / (failures_per_gpu_day * num_gpus)


def checkpoint_bytes(params: float, bytes_per_param: float) -> float:
    """Bytes one checkpoint writes: every parameter's weights and optimizer state as the framework
    saves them (FrameworkSpec.checkpoint_bytes_per_param). Ignores RNG, data-loader and scheduler state."""
    return params * bytes_per_param


def checkpoint_write_s(total_bytes: float, storage_bytes_per_s: float) -> float:
    """A sharded checkpoint's write: every rank writes its own shard at once, so the job's storage
    bandwidth is the limit. Ignores per-node client limits (set the bandwidth to what your nodes reach)."""
    return total_bytes / storage_bytes_per_s


def checkpoint_blocking_s(total_bytes: float, num_gpus: int, storage_bytes_per_s: float, async_save: bool,
                          host_copy_bytes_per_s: float) -> float:
    """What one checkpoint stops training for: the whole write when synchronous; when asynchronous,
    only each GPU's copy of its shard (total / n) to host memory, the write overlapping training."""
    if async_save:
        return total_bytes / num_gpus / host_copy_bytes_per_s
    return checkpoint_write_s(total_bytes, storage_bytes_per_s)


def restart_s(launch_s: float, total_bytes: float, storage_bytes_per_s: float) -> float:
    """One restart: relaunch and initialisation, then reading the last checkpoint back."""
    return launch_s + total_bytes / storage_bytes_per_s


def goodput(interval_s: float, blocking_s: float, mtbf_s: float, restart: float) -> float:
    """Useful training time ÷ wall time. A period is τ of training and C of checkpoint; an
    interruption, at a uniform point of a period, loses half a period and the restart R:
    wall · (1 − (R + (τ + C)/2) / M) = useful · (τ + C)/τ, so
    goodput = τ/(τ + C) · (1 − (R + (τ + C)/2) / M), floored at 0 (no progress)."""
    period = interval_s + blocking_s
    return max(0.0, interval_s / period * (1.0 - (restart + period / 2.0) / mtbf_s))


def optimal_interval_s(blocking_s: float, mtbf_s: float, restart: float) -> float:
    """The τ that maximises `goodput`: with P = τ + C, goodput = (1 − C/P)(A − P/(2M)), A = 1 − R/M,
    whose derivative vanishes at P² = 2·M·C·A, so τ* = √(2·C·(M − R)) − C. For R ≪ M and C ≪ M this is
    Young's first-order optimum √(2·C·M) (Young 1974) less C (Daly 2006's first correction)."""
    return max(math.sqrt(2.0 * blocking_s * max(mtbf_s - restart, 0.0)) - blocking_s, 0.0)


def run_block(*, params: float, num_gpus: int, tokens_per_step: float, step_s: float, tokens_per_s_low: float,
              tokens_per_s_high: float, bytes_per_param: float, gpu_arch: str, opts: RunOptions) -> dict:
    """The whole run of one plan (the `run` block of --json): steps to the token count, the
    checkpoint interval that maximises goodput (whole steps), days, GPU-hours, cost and what
    interruptions take. tokens_per_s_low/high: the estimate's throughput band (whole job)."""
    steps = math.ceil(opts.train_tokens / tokens_per_step)
    total = checkpoint_bytes(params, bytes_per_param)
    host = HOST_COPY_BYTES_PER_S.get(gpu_arch, HOST_COPY_BYTES_PER_S["hopper"])
    blocking = checkpoint_blocking_s(total, num_gpus, opts.checkpoint_bytes_per_s, opts.async_save, host)
    mtbf = job_mtbf_s(opts.failures_per_gpu_day, num_gpus)
    restart = restart_s(opts.restart_launch_s, total, opts.checkpoint_bytes_per_s)
    wanted = opts.checkpoint_interval_s if opts.checkpoint_interval_s is not None else \
        optimal_interval_s(blocking, mtbf, restart)
    if opts.checkpoint_interval_s is not None and opts.checkpoint_interval_s < step_s:
        raise InvalidPlanError(f"a checkpoint every {opts.checkpoint_interval_s / 60:g} minutes is shorter than one "
                               f"step ({step_s:.3g} s); give --checkpoint-minutes of at least {step_s / 60:.3g}")
    interval_steps = max(1, round(wanted / step_s))
    interval = interval_steps * step_s
    g = goodput(interval, blocking, mtbf, restart)
    if g <= 0.0:
        raise InvalidPlanError(f"this job never finishes: it is interrupted every {mtbf / 60:.3g} minutes and a "
                               f"restart and the lost work take longer ({restart / 60:.3g} minutes to restart); "
                               "lower --failure-rate or --restart-minutes, or use fewer GPUs")
    useful_s = steps * step_s
    wall_s = useful_s / g
    days = wall_s / SECONDS_PER_DAY
    tokens = steps * tokens_per_step
    days_low = tokens / tokens_per_s_high / g / SECONDS_PER_DAY if tokens_per_s_high > 0 else days
    days_high = tokens / tokens_per_s_low / g / SECONDS_PER_DAY if tokens_per_s_low > 0 else days
    gpu_hours = days * 24.0 * num_gpus
    return {
        "train_tokens": opts.train_tokens, "steps": steps, "days": days, "days_low": days_low, "days_high": days_high,
        "gpu_hours": gpu_hours,
        "cost_usd": gpu_hours * opts.gpu_hour_cost_usd if opts.gpu_hour_cost_usd is not None else None,
        "interruptions": wall_s / mtbf, "mtbf_hours": mtbf / 3600.0, "checkpoint_bytes": total,
        "checkpoint_write_s": blocking, "checkpoint_interval_steps": interval_steps,
        "checkpoint_interval_s": interval, "restart_s": restart, "goodput": g,
    }


_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_tokens(text: str) -> float:
    """'15.6T', '500B', '2e12', '1_000_000' -> a token count; InvalidPlanError for anything else or
    a count that is not positive and finite."""
    raw = str(text).strip().replace("_", "").replace(",", "")
    scale = 1.0
    if raw[-1:].upper() in _SUFFIXES:
        scale, raw = _SUFFIXES[raw[-1].upper()], raw[:-1]
    try:
        value = float(raw) * scale if raw and len(raw) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 1.0 <= value <= 1e18):
        shown = str(text)[:40]
        raise InvalidPlanError(f"--train-tokens {shown!r} is not a token count from 1 to 1e18; write it as 15.6T, "
                               "500B or 2e12")
    return value
