"""Megatron-LM training logs: the argument dump, the per-interval iteration line and the memory
report, read from their format strings in Megatron-LM at two releases (read, not copied):

- core_v0.14.0 (23e00ed) megatron/training/arguments.py `_print_args`: a line
  "------------------------ arguments ------------------------", then one line per argument,
  '  {} {} {}'.format(name, '.' * (48 - len(name)), value), sorted by lower-cased name, then
  "-------------------- end of arguments ---------------------";
  megatron/training/training.py `training_log`: " [%Y-%m-%d %H:%M:%S] iteration {:8d}/{:8d} |
  consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | throughput per GPU
  (TFLOP/s/GPU): {:.1f} | ... | global batch size: {:5d} | lm loss: ... |";
  megatron/training/utils.py `report_memory`, after the first logged iteration:
  "[Rank R] (after N iterations) memory (MB) | allocated: .. | max allocated: .. | reserved: .. |
  max reserved: ..".
- main at d98e8a6 (2026-08-22, after core_v0.15.0rc7): the same, with microseconds in the
  timestamp (" [%Y-%m-%d %H:%M:%S.%f]").

The plan comes from the dumped arguments through autopar.export.importers.plan_from_megatron_args
(the dump is turned back into the flags autopar models), the GPU count from `world_size`, the step
time from "elapsed time per iteration (ms)" (Megatron's interval time / iterations), peak memory
from the largest "max reserved" (MB = 2**20 bytes). A launcher prefix such as torchrun's
"[default0]:" is dropped from each line.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from autopar.errors import AutoparError
from autopar.logs.common import LogError, ParsedLog, StepLine, bad_line, preset_for

ARGS_START = re.compile(r"^-{10,} arguments -{10,}\s*$")
ARGS_END = re.compile(r"^-{10,} end of arguments -{10,}\s*$")
ARG_LINE = re.compile(r"^  (\w+) (?:\.+ )?(.*)$")
ITERATION = re.compile(r"^ \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?)\] iteration\s+(\d+)/\s*(\d+) \|")
ELAPSED = re.compile(r"\| elapsed time per iteration \(ms\): ([0-9]+(?:\.[0-9]+)?) \|")
MEMORY = re.compile(r"^\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([0-9.eE+-]+) \| "
                    r"max allocated: ([0-9.eE+-]+) \| reserved: ([0-9.eE+-]+) \| max reserved: ([0-9.eE+-]+)\s*$")
PREFIX = re.compile(r"^\[(?:default|rank)\d+\]:")
MIB = 2 ** 20


def looks_like(lines: list[str]) -> int | None:
    """The 1-based number of the first line only Megatron-LM prints, else None."""
    for i, raw in enumerate(lines, 1):
        line = PREFIX.sub("", raw)
        if ARGS_START.match(line) or (" iteration " in line and "| consumed samples:" in line):
            return i
    return None


def _value(text: str) -> Any:
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text  # a string Megatron printed unquoted (a path, an enum name)


def read_arguments(path: str, lines: list[str]) -> dict[str, Any]:
    """name -> value of the argument dump; LogError when there is none, or it is cut short."""
    start = next((i for i, raw in enumerate(lines) if ARGS_START.match(PREFIX.sub("", raw))), None)
    if start is None:
        raise LogError(f"log {path} has no Megatron-LM argument dump ('---- arguments ----' lines, printed at start "
                       "by rank 0); pass the whole log from the start of the run")
    args: dict[str, Any] = {}
    for number in range(start + 1, len(lines)):
        line = PREFIX.sub("", lines[number])
        if ARGS_END.match(line):
            return args
        m = ARG_LINE.match(line)
        if not m:
            raise bad_line(path, number + 1, "inside the Megatron-LM argument dump but not an '  name ..... value' "
                                             "line; pass the log as Megatron printed it")
        args[m.group(1)] = _value(m.group(2))
    raise LogError(f"log {path}: the Megatron-LM argument dump from line {start + 1} has no 'end of arguments' "
                   "line; pass the whole log")


def argv_from_arguments(args: dict[str, Any]) -> list[str]:
    """The pretrain_gpt.py flags autopar models, rebuilt from the dumped values."""
    from autopar.export.megatron_rules import MEGATRON_FLAGS

    argv: list[str] = []
    for flag, f in MEGATRON_FLAGS.items():
        name = f.dest if f.dest in args else flag[2:].replace("-", "_")
        if name not in args or args[name] is None:
            continue
        value = args[name]
        if name == "expert_tensor_parallel_size" and value == args.get("tensor_model_parallel_size"):
            continue  # validate_args fills it with tp when unset: the dump cannot tell, and tp is the default
        if f.kind == "true":
            argv += [flag] if value is True else []
        elif f.kind == "false":
            argv += [flag] if value is False else []
        elif f.kind in ("list", "floats"):
            argv += [flag, *(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))]
        elif f.kind == "tuple":
            argv += [flag, ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)]
        elif f.kind == "freq" and isinstance(value, (list, tuple)):
            argv += [flag, "[" + ",".join(str(int(v)) for v in value) + "]"]
        else:
            argv += [flag, str(value)]
    return argv


def _steps(path: str, lines: list[str]) -> tuple[list[StepLine], str, float | None]:
    steps: list[StepLine] = []
    release, peak = "", None
    for number, raw in enumerate(lines, 1):
        line = PREFIX.sub("", raw)
        if " iteration " in line and "| consumed samples:" in line:
            m = ITERATION.match(line)
            if not m:
                raise bad_line(path, number, "a Megatron-LM iteration line whose start is not ' [date time] iteration "
                                             "N/ M |'; pass the log as Megatron printed it")
            e = ELAPSED.search(line)
            if not e:
                raise bad_line(path, number, "a Megatron-LM iteration line without 'elapsed time per iteration (ms): "
                                             "<number> |'")
            ms = float(e.group(1))
            if not ms > 0:
                raise bad_line(path, number, f"elapsed time per iteration {ms} ms is not positive")
            release = release or ("main-d98e8a6" if m.group(2) else "core_v0.14.0")
            steps.append(StepLine(line=number, step=int(m.group(3)), step_time_s=ms / 1000.0))
        elif "memory (MB) |" in line and line.startswith("[Rank "):
            mm = MEMORY.match(line)
            if not mm:
                raise bad_line(path, number, "a Megatron-LM memory report that is not '[Rank R] (after N iterations) "
                                             "memory (MB) | allocated: .. | max allocated: .. | reserved: .. | max "
                                             "reserved: ..'")
            peak = max(peak or 0.0, float(mm.group(6)) * MIB / 2 ** 30)
    return steps, release, peak


def parse(path: str, lines: list[str]) -> ParsedLog:
    from autopar.export.importers import megatron_model_fields, plan_from_megatron_args
    from autopar.export.megatron_rules import parse_megatron_argv

    args = read_arguments(path, lines)
    world = args.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise LogError(f"log {path}: the Megatron-LM argument dump has no world_size; pass the log rank 0 printed")
    argv = argv_from_arguments(args)
    try:
        plan, _ = plan_from_megatron_args(argv, num_gpus=world)
    except LogError:
        raise
    except AutoparError as exc:  # an importer refusal: name the log
        raise LogError(f"log {path}: {exc}") from None
    fields = megatron_model_fields(parse_megatron_argv(argv))
    steps, release, peak = _steps(path, lines)
    return ParsedLog(path=path, framework="megatron", release=release or "core_v0.14.0", plan=plan, gpus=world,
                     steps=steps, model=preset_for(fields), model_fields=fields, peak_memory_gib=peak,
                     memory_kind="max reserved (report_memory)")
