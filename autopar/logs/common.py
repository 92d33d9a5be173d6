"""What every training-log parser returns, the warm-up rule, and the one-line errors.

A log yields a `ParsedLog`: the framework and release whose format it matched, the plan read from
the logged arguments/config through autopar's importers (autopar.export.importers, so the same
rules apply as to --from-megatron / --from-deepspeed), the model (a preset the logged shape
matches, or None when the log does not say), the GPU count, and one speed per logged step line.

Warm-up rule (WARMUP_RULE): the first max(2, ceil(10 %)) step lines are dropped (the first
iterations include compilation, allocator growth and NCCL set-up; Megatron's first line also
holds initialisation), and the step time is the median of the rest. A log whose step lines are
all warm-up is refused.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopar.errors import InputFileError

WARMUP_RULE = "the first max(2, ceil(10 %)) logged step lines are warm-up and dropped; the median of the rest is kept"
FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")


class LogError(InputFileError):
    """A training log autopar cannot read; the message names the file, the line and why."""


@dataclass(frozen=True)
class StepLine:
    """One logged step (or logging interval): its line number and what it measured."""

    line: int
    step: int
    step_time_s: float | None = None  # Megatron's elapsed time per iteration, DeepSpeed's batch / samples/s
    tokens_per_s_per_gpu: float | None = None  # torchtitan's tps
    memory_gib: float | None = None


@dataclass(frozen=True)
class ParsedLog:
    path: str
    framework: str
    release: str
    plan: Any  # ParallelPlan
    gpus: int
    steps: list[StepLine]
    model: str | None = None  # preset the logged shape matches (None: not recorded)
    model_fields: dict[str, Any] = field(default_factory=dict)  # shape the log states, to check --model against
    peak_memory_gib: float | None = None  # the most the log reports (max reserved / allocated)
    memory_kind: str = ""


def warmup_count(n: int) -> int:
    """Step lines dropped as warm-up: max(2, ceil(10 % of n))."""
    return max(2, math.ceil(0.1 * n))


def steady_steps(path: str, steps: list[StepLine]) -> list[StepLine]:
    """The step lines after warm-up; LogError when none are left."""
    if not steps:
        raise LogError(f"log {path} has no step lines; pass the log of a run that trained (the lines its framework "
                       "prints every logging interval)")
    skip = warmup_count(len(steps))
    if len(steps) <= skip:
        raise LogError(f"log {path} has {len(steps)} step line(s), all warm-up ({WARMUP_RULE}); log at least "
                       f"{skip + 1} steps (a smaller logging interval, or more steps)")
    return steps[skip:]


def median(values: list[float]) -> float:
    return statistics.median(values)


def read_lines(path: str) -> list[str]:
    """The log's lines; LogError naming the fix when it cannot be read."""
    from autopar.io import read_text_file

    text = read_text_file(Path(path).expanduser(), "training log", "pass the text log the training job printed")
    return text.splitlines()


def bad_line(path: str, number: int, why: str) -> LogError:
    return LogError(f"log {path} line {number}: {why}")


def preset_for(fields: dict[str, Any]) -> str | None:
    """The model preset whose layers, hidden size, heads, KV heads, FFN size and expert count the
    logged fields match (fields the log leaves out are not compared; no "moe" entry means dense);
    None when no preset or several do."""
    from autopar.model import PRESET_NAMES, load_model

    keys = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size")
    given = {k: fields[k] for k in keys if fields.get(k) is not None}
    if len(given) < 3:
        return None
    given["num_experts"] = (fields.get("moe") or {}).get("num_experts") or 0  # a dense log has no "moe"
    hits = []
    for name in PRESET_NAMES:
        spec = load_model(name).spec
        kv = spec.num_kv_heads or spec.num_attention_heads
        shape = {"num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                 "num_attention_heads": spec.num_attention_heads, "num_kv_heads": kv,
                 "ffn_hidden_size": spec.ffn_hidden_size, "num_experts": spec.moe.num_experts if spec.moe else 0}
        if all(shape[k] == v for k, v in given.items()):
            hits.append(name)
    return hits[0] if len(hits) == 1 else None
