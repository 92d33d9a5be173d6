"""Hostile inputs, the output and time side: no option silently ignored, no input overwritten by its
own output, no half-written export, no run past the time bound. Each refusal is one line on stderr
naming the fix, exit code 2, within WALL_S, with nothing in the folder written or replaced."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
WALL_S = 20.0  # the bound, on a loaded 2-core machine
REPO = Path(__file__).resolve().parent.parent
LLAMA8B = REPO / "tests" / "fixtures" / "hf" / "llama3-8b.json"
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _invoke(argv: list[str]):
    """The CLI's result and wall time; a run past WALL_S + 10 s is cut off and fails the test."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(WALL_S) + 10)
    start = time.perf_counter()
    try:
        result = runner.invoke(app, [str(a) for a in argv])
    except _Hang:
        pytest.fail(f"{argv[:3]} still running after {WALL_S + 10:.0f} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return result, time.perf_counter() - start


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under `folder` with its bytes (or <dir>/link target) and inode: a replaced file
    differs in inode even when its bytes are equal."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        if p.is_symlink():
            out[str(p.relative_to(folder))] = ("link", os.readlink(p), st.st_ino)
        elif p.is_file():
            out[str(p.relative_to(folder))] = (p.read_bytes(), st.st_ino, st.st_mtime_ns)
        else:
            out[str(p.relative_to(folder))] = ("<dir>", st.st_ino)
    return out


def refused(folder: Path, argv: list[str], *words: str) -> str:
    """Run argv; assert exit 2, one `error:` line containing every word, nothing under `folder`
    changed, and the time bound. Returns the line."""
    before = _snapshot(folder)
    result, wall_s = _invoke(argv)
    assert result.exit_code == 2, (argv, result.exit_code, result.output, repr(result.exception))
    stderr = result.stderr
    assert "Traceback" not in result.output
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    for word in words:
        assert word.lower() in stderr.lower(), (word, stderr)
    assert _snapshot(folder) == before, "an output was written or replaced"
    assert wall_s < WALL_S, f"{argv[:2]} took {wall_s:.1f} s"
    return stderr


def _plan(*extra) -> list[str]:
    return ["plan", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "2048", "--quiet", *extra]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --------------------------------------------------------------------------- 3. time


def test_a_self_doubling_script_variable_is_refused(here):
    """A=x; A=$A$A 24 times would be a 16 MiB word (shlex: minutes); the expansion stops at
    MAX_SCRIPT_EXPANSION_CHARS with the limit and the fix."""
    from autopar.limits import MAX_SCRIPT_EXPANSION_CHARS

    script = here / "train.sh"
    script.write_text("#!/bin/bash\nA=x\n" + "A=$A$A\n" * 24 + "torchrun pretrain_gpt.py --num-layers $A "
                      "--hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
                      "--global-batch-size 8\n")
    refused(here, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--from-megatron", script],
            f"{MAX_SCRIPT_EXPANSION_CHARS:,}", "pass the pretrain_gpt.py arguments")
    many = here / "many.sh"  # many moderate substitutions add up to the same budget
    many.write_text("A=" + "y" * 4000 + "\n" + "".join(f"B{i}=$A\n" for i in range(40)) + "pretrain_gpt.py\n")
    refused(here, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--from-megatron", many],
            f"{MAX_SCRIPT_EXPANSION_CHARS:,}")


def test_a_4096_layer_model_plans_in_bounded_time(here):
    """4,096 small layers on 8 GPUs at batch 8 took 52 s (170 s with more GPUs) in the partition DP
    (O(pp · layers²) per refined candidate); above MAX_PARTITION_STEPS the even split stays."""
    model = here / "deep.yaml"
    model.write_text("name: deep\nnum_layers: 4096\nhidden_size: 256\nnum_attention_heads: 4\n"
                     "ffn_hidden_size: 1024\nvocab_size: 32000\nseq_length: 2048\n")
    for gpus, batch in ((8, 8), (64, 64)):
        result, wall_s = _invoke(["plan", model, "-c", "dgx-h100", "-n", gpus, "-b", batch, "--quiet", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["plans"]
        assert wall_s < WALL_S / 2, wall_s


def test_the_partition_dp_early_exit_is_exact():
    """The DP's scan stops once the stage alone is slower than the best or over memory: on seeded
    random instances (ties from whole numbers, binding memory) it equals brute force."""
    import random

    from autopar.search.partition import StageInputs, brute_force_partition, partition_layers

    rng = random.Random(7)
    for _ in range(400):
        n, head, tail = rng.randint(1, 9), rng.randint(0, 2), rng.randint(0, 2)
        stages = rng.randint(1, min(n, 4))
        size = head + n + tail

        def column(scale: float) -> list[float]:
            return [float(rng.randint(0, 3)) * scale for _ in range(size)]

        inputs = StageInputs(time_s=column(1.0), state_bytes=column(1.0), saved_bytes=column(1.0),
                             work_bytes=column(2.0), is_decoder=[False] * head + [True] * n + [False] * tail,
                             inflight=tuple(range(stages, 0, -1)), usable_bytes=rng.choice([1e9, rng.uniform(2, 30)]),
                             extra_last_bytes=rng.choice([0.0, 1.0]))
        dp, brute = partition_layers(inputs), brute_force_partition(inputs)
        assert (dp is None) == (brute is None)
        if dp is not None:
            assert dp.bottleneck_s == brute.bottleneck_s


def _runs_file(folder: Path, rows: int, name: str = "runs.yaml") -> Path:
    """`rows` runs as YAML aliases of one (100,000 rows in 0.5 MB, under the 4 MiB file limit)."""
    path = folder / name
    path.write_text("runs:\n- &a {model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 2048, global_batch: 8, "
                    "step_time_s: 1.0}\n" + "- *a\n" * (rows - 1))
    return path


def test_a_runs_file_of_100000_rows_is_refused(here):
    from autopar.limits import MAX_RUNS

    runs = _runs_file(here, 100_000)
    refused(here, ["validate", "--runs", runs], "100,000 runs", f"{MAX_RUNS:,}", "split it")
    refused(here, ["calibrate", runs, "--base", "h100", "--out", here / "fit.json"], f"{MAX_RUNS:,}")


def test_calibrate_on_2000_runs_is_refused_before_fitting(here):
    """2,000 runs: 2,001 leave-one-out refits (hours); held-out refits are capped at MAX_HELD_OUT_FITS
    folds, and the whole calibration at MAX_CALIBRATION_STEPS run-iterations, refused up front
    naming how many runs or iterations fit."""
    from autopar.limits import MAX_CALIBRATION_STEPS

    runs = _runs_file(here, 2000)
    line = refused(here, ["calibrate", runs, "--base", "h100", "--out", here / "fit.json"],
                   "2,000 runs", f"{MAX_CALIBRATION_STEPS:,}", "--iters")
    assert "at most 59 of the runs" in line, line  # 59 · 11 fits · 200 iterations ≤ 2**17 < 60 · 11 · 200


def test_held_out_folds_are_leave_one_out_then_k_fold():
    from autopar.calibration.fit import held_out_folds
    from autopar.limits import MAX_HELD_OUT_FITS

    assert held_out_folds(1) == []
    assert [list(f) for f in held_out_folds(3)] == [[0], [1], [2]]
    folds = held_out_folds(25)
    assert len(folds) == MAX_HELD_OUT_FITS
    assert sorted(i for f in folds for i in f) == list(range(25))  # every run held out exactly once
