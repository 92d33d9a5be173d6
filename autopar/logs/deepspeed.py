"""DeepSpeed training logs: the engine's configuration print and the throughput timer's line,
read from their format strings in deepspeedai/DeepSpeed v0.19.5 (cf44300; read, not copied):

- deepspeed/utils/logging.py formats "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:
  %(funcName)s] %(message)s";
- deepspeed/runtime/config.py `DeepSpeedConfig.print("DeepSpeedEngine configuration")` (from
  runtime/engine.py): "DeepSpeedEngine configuration:", then '  {} {} {}'.format(name,
  '.' * (29 - len(name)), value) for every attribute (world_size among them: the data-parallel
  size), then `print_user_config`: "  json = " + json.dumps(config, sort_keys=True, indent=4,
  separators=(",", ":")) over several lines;
- deepspeed/utils/timer.py `ThroughputTimer.stop` every steps_per_print steps:
  "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={},
  MemAllocated={}GB, MaxMemAllocated={}GB" (batch_size is train_batch_size, memory in GiB:
  bytes / 1024**3).

The plan comes from the printed config through autopar.export.importers.plan_from_deepspeed_config
on world_size x pipeline stages GPUs (DeepSpeed's world_size is the data-parallel size once a
pipeline module is used); a config does not record the sequence length, so it is the caller's
(--seq-len, else the model's). Step time = train_batch_size / CurrSamplesPerSec; every rank may
print the timer, so one line per global step is kept; peak memory is the largest MaxMemAllocated.
"""

from __future__ import annotations

import json
import re

from autopar.errors import AutoparError
from autopar.logs.common import LogError, ParsedLog, StepLine, bad_line

ENGINE = "DeepSpeedEngine configuration:"
ATTR = re.compile(r"\]\s{1,2}(?:\[Rank \d+\] )?  (\w+) (?:\.+ )?(.*)$")
TIMER = re.compile(r"epoch=(\d+)/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=([0-9.eE+-]+|nan), "
                   r"CurrSamplesPerSec=([0-9.eE+-]+|nan|inf), MemAllocated=([0-9.eE+-]+)GB, "
                   r"MaxMemAllocated=([0-9.eE+-]+)GB")


def looks_like(lines: list[str]) -> int | None:
    for i, line in enumerate(lines, 1):
        if ENGINE in line or "RunningAvgSamplesPerSec=" in line:
            return i
    return None


def _engine_print(path: str, lines: list[str]) -> tuple[dict[str, str], dict]:
    start = next((i for i, line in enumerate(lines) if line.rstrip().endswith(ENGINE)), None)
    if start is None:
        raise LogError(f"log {path} has no '{ENGINE}' print (DeepSpeed logs it when the engine starts); pass the "
                       "whole log from the start of the run")
    attrs: dict[str, str] = {}
    for number in range(start + 1, len(lines)):
        line = lines[number]
        if "  json = {" in line:
            chunk = [line[line.index("  json = ") + len("  json = "):]]
            for more in lines[number + 1:number + 100_000]:
                chunk.append(more)
                if more.startswith("}"):
                    break
            try:
                return attrs, json.loads("\n".join(chunk))
            except ValueError as exc:
                raise bad_line(path, number + 1, f"DeepSpeed's printed config JSON does not parse ({exc}); pass the "
                                                 "log as DeepSpeed printed it") from None
        m = ATTR.search(line)
        if m:
            attrs[m.group(1)] = m.group(2).strip()
        elif line.strip():
            raise bad_line(path, number + 1, "inside DeepSpeed's engine configuration print but not an '  name ..... "
                                             "value' line; pass the log as DeepSpeed printed it")
    raise LogError(f"log {path}: the DeepSpeed engine configuration from line {start + 1} has no '  json = {{' "
                   "config; pass the whole log")


def _steps(path: str, lines: list[str], batch: int) -> tuple[list[StepLine], float | None]:
    steps, seen, peak = [], set(), None
    for number, line in enumerate(lines, 1):
        if "RunningAvgSamplesPerSec=" not in line:
            continue
        m = TIMER.search(line)
        if not m:
            raise bad_line(path, number, "a DeepSpeed throughput line that is not 'epoch=E/micro_step=M/global_step=G, "
                                         "RunningAvgSamplesPerSec=.., CurrSamplesPerSec=.., MemAllocated=..GB, "
                                         "MaxMemAllocated=..GB'")
        step = int(m.group(3))
        samples = float(m.group(5))
        if not 0 < samples < float("inf"):
            raise bad_line(path, number, f"CurrSamplesPerSec={m.group(5)} is not a positive number")
        peak = max(peak or 0.0, float(m.group(7)))
        if step in seen:
            continue
        seen.add(step)
        steps.append(StepLine(line=number, step=step, step_time_s=batch / samples, memory_gib=float(m.group(7))))
    return steps, peak


def parse(path: str, lines: list[str], seq_len: int) -> ParsedLog:
    from autopar.export.importers import plan_from_deepspeed_config

    attrs, config = _engine_print(path, lines)
    try:
        world = int(float(attrs.get("world_size", "")))
    except ValueError:
        raise LogError(f"log {path}: the DeepSpeed engine configuration has no world_size; pass the log rank 0 "
                       "printed") from None
    stages = config.get("pipeline", {}).get("stages", 1) if isinstance(config.get("pipeline"), dict) else 1
    gpus = world * (stages if isinstance(stages, int) and stages > 1 else 1)
    try:
        plan = plan_from_deepspeed_config(config, gpus, seq_len=seq_len)
    except AutoparError as exc:
        raise LogError(f"log {path}: {exc}") from None
    steps, peak = _steps(path, lines, plan.global_batch)
    return ParsedLog(path=path, framework="deepspeed", release="v0.19.5", plan=plan, gpus=gpus, steps=steps,
                     model=None, peak_memory_gib=peak, memory_kind="max allocated (throughput timer)")
