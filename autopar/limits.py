"""Input limits, checked before any work, and the clipping of echoed values in messages.

Each limit is far above anything trained today and low enough that every search and every
graph build stays bounded in time and memory by construction:

  MAX_GPUS            2**20 GPUs; the largest published runs use about 10**5 (Llama 3 405B:
                      16,384 H100, Dubey et al. 2024). Divisor generators loop to √n ≤ 1,024.
  MAX_LAYERS          4,096 decoder layers (published models: ≤ 128, Megatron-LM 1T).
  MAX_HIDDEN_SIZE     2**17 (published: ≤ 25,600 for the 1T model of Narayanan et al. 2021).
  MAX_FFN_HIDDEN_SIZE 2**20, MAX_VOCAB_SIZE 2**24, MAX_EXPERTS 2**14, MAX_HEADS 2**14.
  MAX_SEQ_LEN         2**24 tokens (published long-context training: ≤ 10**6).
  MAX_GLOBAL_BATCH    2**20 sequences (BERT-LAMB's 65,536 is among the largest used).
  MAX_INPUT_FILE_BYTES  a model, cluster, plan, cost-model, runs or launch file above 4 MiB is
                      refused before it is read (shipped files are under 0.1 MiB).
  MAX_NAME_CHARS      a model or cluster name or path: 1,024 characters, every path part at
                      most 255 bytes (Linux NAME_MAX).
  MAX_LAUNCH_SCRIPT_BYTES  a Megatron launch script (or argument string) to import: at most 2**17
                      bytes, 128 KiB (hand-written scripts are a few KiB; Linux caps one argument
                      at 128 KiB; a 3 MiB word took minutes in the quadratic shlex split).
  MAX_SCRIPT_EXPANSION_CHARS  an imported launch script's variables substitute at most 2**17
                      characters in all (hand-written scripts substitute a few thousand; a
                      variable doubled 24 times would be 16 MiB, and Python's shlex split is
                      quadratic in a word's length: 0.1 s at 2**17, 8 s at 2**20).
  MAX_PARTITION_STEPS the search moves layers between pipeline stages (the partition DP, O(pp ·
                      layers²)) only while pp · decoder layers² ≤ 2**20 (about 0.5 s of Python a
                      candidate; Llama 3 405B's 126 layers reach it at pp 66); above it a plan keeps
                      the even split (`estimate --layers-per-stage` still scores any split).
  MAX_RUNS            a runs file (validate --runs, calibrate) holds at most 5,000 runs (each is
                      predicted in about 2 ms: 10 s in all; YAML aliases make 100,000 rows 0.5 MB).
  MAX_HELD_OUT_FITS   calibrate's held-out error refits at most 10 times: leave-one-out up to 10
                      runs, 10-fold above (the refits grow with the runs, not their square).
  MAX_CALIBRATION_STEPS calibrate on a runs file does at most 2**17 run-iterations (runs · fits ·
                      --iters, each an estimate of about 0.1-0.5 ms; Nelder-Mead usually stops
                      earlier: 59 runs at the default 200 iterations, 11 fits, take about 10 s);
                      2,000 runs would be 4.4 million (with leave-one-out refits, 800 million).
  (The search space's own cap, MAX_RAW_CANDIDATES, lives in autopar.search.space.)
"""

from __future__ import annotations

import math
import operator
from typing import Any

from autopar.errors import SchemaError

MAX_GPUS = 2**20
MAX_LAYERS = 4096
MAX_HIDDEN_SIZE = 2**17
MAX_FFN_HIDDEN_SIZE = 2**20
MAX_HEADS = 2**14
MAX_EXPERTS = 2**14
MAX_VOCAB_SIZE = 2**24
MAX_SEQ_LEN = 2**24
MAX_GLOBAL_BATCH = 2**20
MAX_INPUT_FILE_BYTES = 4 * 2**20
MAX_NAME_CHARS = 1024
MAX_PATH_PART_BYTES = 255
MAX_PARTITION_STEPS = 2**20
MAX_SCRIPT_EXPANSION_CHARS = 2**17
MAX_LAUNCH_SCRIPT_BYTES = 2**17
MAX_RUNS = 5000
MAX_HELD_OUT_FITS = 10
MAX_CALIBRATION_STEPS = 2**17
MAX_ECHO_CHARS = 80


def clip(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """str(value) cut to at most `limit` characters (head and tail kept, '…' between)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def clip_repr(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """repr(value) cut to at most `limit` characters."""
    return clip(repr(value), limit)


def whole_number(value: Any, name: str, low: int, high: int, fix: str = "") -> int:
    """`value` as an int in [low, high]; SchemaError (naming `name` and the range) for a bool, a
    float, a string, a non-finite or an out-of-range number."""
    if isinstance(value, bool) or isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{name} {clip_repr(value)} is not a whole number; use one from {low:,} to {high:,}"
                          + (f" ({fix})" if fix else ""))
    try:
        number = operator.index(value)
    except TypeError:
        raise SchemaError(f"{name} {clip_repr(value)} is not a whole number; use one from {low:,} to {high:,}"
                          + (f" ({fix})" if fix else "")) from None
    if not low <= number <= high:
        raise SchemaError(f"{name} {clip(number)} is out of range; use one from {low:,} to {high:,}"
                          + (f" ({fix})" if fix else ""))
    return number


def check_name(text: str, what: str) -> None:
    """Refuse a name or path the file system cannot hold (too long overall or in one part)."""
    if len(text) > MAX_NAME_CHARS:
        raise SchemaError(f"{what} {clip_repr(text)} is {len(text):,} characters long; names and paths are limited "
                          f"to {MAX_NAME_CHARS:,}, pass a shorter one")
    for part in text.replace("\\", "/").split("/"):
        if len(part.encode("utf-8", "surrogateescape")) > MAX_PATH_PART_BYTES:
            raise SchemaError(f"{what} {clip_repr(text)} has a name part longer than {MAX_PATH_PART_BYTES} bytes, "
                              "which no file system holds; pass a shorter name")
    if "\0" in text:
        raise SchemaError(f"{what} {clip_repr(text)} contains a NUL character; pass a plain name or path")
