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


def test_a_launch_script_over_128_kib_is_refused_before_it_is_split(here):
    """A 3 MiB word (no variables) took minutes in shlex's split, quadratic in a word's length."""
    from autopar.limits import MAX_LAUNCH_SCRIPT_BYTES

    script = here / "train.sh"
    script.write_text("pretrain_gpt.py --num-layers " + "x" * (3 * 2**20) + "\n")
    refused(here, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--from-megatron", script],
            f"{MAX_LAUNCH_SCRIPT_BYTES:,} bytes")
    refused(here, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--from-megatron",
                   "--num-layers " + "7" * MAX_LAUNCH_SCRIPT_BYTES], f"{MAX_LAUNCH_SCRIPT_BYTES:,}")


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


# --------------------------------------------------------------------------- 1. options that would be ignored

_SWEEP = ["sweep", "llama3-8b", "-c", "dgx-h100", "-n", "8,16", "-b", "16", "-s", "2048", "--quiet"]
_EST = ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "2048"]

# (id, argv(folder), words the line must contain); every case is refused before any work.
IGNORED = [
    ("calibrate-reason-without-derive", lambda d: ["calibrate", "--reason", "why", "--out", d / "c.json"],
     ["--reason", "--derive-as"]),
    ("calibrate-derive-gpus-without-derive", lambda d: ["calibrate", "--derive-gpus", "H200", "--out", d / "c.json"],
     ["--derive-gpus"]),
    ("calibrate-gpu-with-runs-file", lambda d: ["calibrate", _runs_file(d, 3), "--gpu", "h100", "--out", d / "c.json"],
     ["--gpu", "calibrate builtin"]),
    ("calibrate-rounds-with-runs-file",
     lambda d: ["calibrate", _runs_file(d, 3), "--rounds", "3", "--out", d / "c.json"], ["--rounds"]),
    ("calibrate-fit-options-with-derive",
     lambda d: ["calibrate", "--derive-as", "x", "--gpu", "h100", "--iters", "5", "--out", d / "c.json"],
     ["--gpu, --iters", "--derive-as"]),
    ("calibrate-runs-file-with-derive",
     lambda d: ["calibrate", _runs_file(d, 3), "--derive-as", "x", "--out", d / "c.json"], ["runs file"]),
    ("plan-max-tp-with-fix-tp", lambda d: _plan("--fix", "tp=2,pp=1", "--max-tp", "4"), ["--max-tp", "--fix"]),
    ("sweep-max-tp-with-fix-tp", lambda d: _SWEEP + ["--fix", " tp = 2", "--max-tp", "4"], ["--max-tp", "--fix"]),
    ("plan-plot-with-json", lambda d: _plan("--plot", d / "t.png", "--json"), ["--plot", "--json"]),
    ("plan-explain-with-json", lambda d: _plan("--explain", "--json"), ["--explain", "--json"]),
    ("plan-export-with-json-without-out", lambda d: _plan("--export", "megatron", "--json"), ["--export", "--out"]),
    ("sweep-plot-with-json", lambda d: _SWEEP + ["--plot", d / "s.png", "--json"], ["--plot", "--json"]),
    ("explain-plot-with-json",
     lambda d: ["explain", "--plan", "tp=1", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8",
                "--plot", d / "e.png", "--json"], ["--plot", "--json"]),
    ("explain-file-and-plan", lambda d: ["explain", d / "plan.json", "--plan", "tp=1"], ["not both"]),
    ("explain-file-with-target", lambda d: ["explain", d / "plan.json", "--model", "llama3-8b", "-n", "16"],
     ["--model, --gpus", "plan file names its own"]),
    ("plan-force-without-outputs", lambda d: _plan("--force"), ["--force", "--out"]),
    ("sweep-force-without-plot", lambda d: _SWEEP + ["--force"], ["--force", "--plot"]),
    ("explain-force-without-plot", lambda d: ["explain", d / "plan.json", "--force"], ["--force", "--plot"]),
    ("export-force-without-out", lambda d: ["export", d / "plan.json", "--force"], ["--force", "--out"]),
    ("estimate-cp-comm-type-at-cp-1", lambda d: _EST + ["--cp-comm-type", "a2a"], ["--cp-comm-type", "--cp"]),
    ("validate-iters-without-loso", lambda d: ["validate", "--iters", "5"], ["--iters", "--leave-one-source-out"]),
    ("validate-loso-with-split-and-cost-model",
     lambda d: ["validate", "--leave-one-source-out", "--split", "fit", "--cost-model", "h100"],
     ["--split, --cost-model", "do not apply"]),
    ("validate-summary-only-with-json", lambda d: ["validate", "--summary-only", "--json"], ["--summary-only"]),
    ("validate-runs-summary-only-with-json",
     lambda d: ["validate", "--runs", _runs_file(d, 3), "--summary-only", "--json"], ["--summary-only"]),
]


@pytest.fixture
def plan_file(here) -> Path:
    """A plan.json in the case's folder (made before the folder is snapshotted)."""
    result = runner.invoke(app, _plan("--out", here / "plan.json"))
    assert result.exit_code == 0, result.output
    return here / "plan.json"


@pytest.fixture
def ds_plan_file(here) -> Path:
    """A plan.json made for DeepSpeed, so that exporting it to DeepSpeed runs it as planned."""
    result = runner.invoke(app, _plan("--framework", "deepspeed", "--out", here / "ds_plan.json"))
    assert result.exit_code == 0, result.output
    return here / "ds_plan.json"


@pytest.mark.parametrize("case", IGNORED, ids=[c[0] for c in IGNORED])
def test_an_option_that_would_be_ignored_is_refused(case, here, plan_file):
    name, argv, words = case
    refused(here, argv(here), *words)


def test_options_that_apply_are_still_accepted(here, plan_file):
    """The refusals leave the combinations where each option does apply alone."""
    for argv in (_plan("--fix", "pp=1", "--max-tp", "4", "--json"), _plan("--out", here / "b.json", "--force"),
                 _EST + ["--cp", "2", "--cp-comm-type", "a2a"], ["export", plan_file, "--out", here / "x", "--force"],
                 ["explain", plan_file, "--cost-model", "h100"]):
        result, _ = _invoke(argv)
        assert result.exit_code == 0, (argv, result.output)


# --------------------------------------------------------------------------- 2. outputs


def _llama_config(folder: Path) -> Path:
    path = folder / "config.json"
    path.write_text(LLAMA8B.read_text())
    return path


def test_out_onto_the_model_file_is_refused_even_with_force(here):
    """plan --out config.json (the model) overwrote the model; so did ./sub/../config.json and a
    symlink to it."""
    config = _llama_config(here)
    (here / "link.json").symlink_to("config.json")
    (here / "sub").mkdir()
    base = ["plan", config, "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "2048", "--quiet", "--force"]
    for out in (config, "config.json", "sub/../config.json", here / "link.json"):
        refused(here, base + ["--out", out], "is the input", "--force does not apply")
    # plan.json, ds_config.json and config.json; planned for DeepSpeed so that its export runs as planned
    export_dir = base + ["--framework", "deepspeed", "--out", here, "--export", "deepspeed"]
    refused(here, export_dir, "is the input")


def test_out_onto_the_cluster_or_cost_model_is_refused(here):
    cluster = here / "cluster.yaml"
    cluster.write_text((REPO / "hardware_profiles" / "dgx-h100.yaml").read_text())
    cost = here / "cost.json"
    cost.write_text((REPO / "cost_models" / "h100.json").read_text())
    refused(here, ["plan", "llama3-8b", "-c", cluster, "-n", "8", "-b", "8", "--quiet", "--out", cluster, "--force"],
            "is the input")
    refused(here, _plan("--cost-model", cost, "--out", cost, "--force"), "is the input")
    refused(here, ["calibrate", "--base", cost, "--out", cost, "--force"], "is the input")
    refused(here, ["profile", "--device", "cpu", "--base", cost, "--out", cost, "--force"], "is the input")


def test_export_onto_its_own_plan_file_is_refused(here, plan_file, ds_plan_file):
    refused(here, ["export", plan_file, "--out", plan_file, "--force"], "is the input")
    launch = here / "launch"
    launch.mkdir()
    own = launch / "ds_config.json"  # the plan file sits where the export writes ds_config.json
    own.write_text(ds_plan_file.read_text())
    refused(here, ["export", own, "-f", "deepspeed", "--out", launch, "--force"], "is the input")
    refused(here, ["export", own, "-f", "deepspeed", "--out", launch, "--force", "--json"], "is the input")


def test_calibrate_onto_its_runs_file_is_refused(here):
    runs = _runs_file(here, 3)
    refused(here, ["calibrate", runs, "--base", "h100", "--out", runs, "--force"], "is the input")


def test_out_and_plot_naming_one_file_are_refused(here):
    """--out t-memory.png beside --plot t.png: the memory picture would overwrite the plan (or
    the reverse); and --out t.png --plot ./t.png."""
    pytest.importorskip("matplotlib")
    refused(here, _plan("--out", "t-memory.png", "--plot", "t.png"), "t-memory.png", "its own path")
    refused(here, _plan("--out", "t.png", "--plot", "./t.png", "--force"), "t.png", "its own path")
    (here / "out").mkdir()
    refused(here, _plan("--out", "out/t.png", "--plot", "out/../out/t.png"), "one file", "its own path")


def test_an_existing_output_created_after_the_check_is_not_overwritten(here, monkeypatch):
    """Without --force, the existence check and the creation are one step (os.link): a file that
    another process writes between autopar's check and its write is kept, and the command fails."""
    import autopar.io as io

    stage = io._stage

    def other_process_writes_first(target, data, executable, what):
        tmp = stage(target, data, executable, what)
        if target.name == "plan.json" and not target.exists():
            target.write_text("the other process's plan")
        return tmp

    monkeypatch.setattr(io, "_stage", other_process_writes_first)
    result, _ = _invoke(_plan("--out", here / "plan.json"))
    assert result.exit_code == 2 and "another process" in result.stderr, result.output
    assert (here / "plan.json").read_text() == "the other process's plan"
    assert sorted(p.name for p in here.iterdir()) == ["plan.json"]  # no temporary file left


def test_two_writers_of_one_file_never_both_succeed(tmp_path):
    """Threads racing write_output(force=False) at one path: exactly one wins each round."""
    import threading

    from autopar.errors import OutputFileError
    from autopar.io import write_output

    for round_ in range(30):
        target = tmp_path / f"plan{round_}.json"
        barrier = threading.Barrier(2)
        outcome: list[str] = []

        def write(label: str) -> None:
            barrier.wait()
            try:
                write_output(target, label, force=False)
                outcome.append(label)
            except OutputFileError:
                outcome.append("refused")

        threads = [threading.Thread(target=write, args=(label,)) for label in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcome) in (["a", "refused"], ["b", "refused"]), outcome
        assert target.read_text() == next(o for o in outcome if o != "refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"plan{r}.json" for r in range(30))


def test_an_export_set_with_one_unwritable_file_changes_none(here, ds_plan_file):
    """deepspeed writes ds_config.json, launch_deepspeed.sh and config.json: with a directory where
    config.json should go, --force replaces neither of the other two (nor creates them)."""
    launch = here / "launch"
    launch.mkdir()
    (launch / "ds_config.json").write_text("mine")
    (launch / "config.json").mkdir()
    refused(here, ["export", ds_plan_file, "-f", "deepspeed", "--out", launch, "--force"], "config.json",
            "is a directory")
    assert not (launch / "launch_deepspeed.sh").exists()


def test_a_set_failing_at_its_last_file_takes_the_others_back(tmp_path, monkeypatch):
    """The last rename fails after the first file was replaced and the second created: the first
    is restored (the same file: inode and bytes), the second removed, no temporary file left."""
    from autopar.errors import OutputFileError
    from autopar.io import write_outputs

    old = tmp_path / "a.json"
    old.write_text("mine")
    inode = old.stat().st_ino
    replace = os.replace

    def fail_on_c(src, dst):
        if str(dst).endswith("c.json"):
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_c)
    with pytest.raises(OutputFileError, match="No space left"):
        write_outputs({old: "new", tmp_path / "b.json": "new", tmp_path / "c.json": "new"}, force=True)
    assert old.read_text() == "mine" and old.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.parametrize("where", ["/proc/autopar-x.png", "/proc/no-such-folder/x.png", "FILE/x.png", "RO/x.png"])
def test_a_plot_that_cannot_be_written_is_refused_before_the_tables(where, here):
    pytest.importorskip("matplotlib")
    if where.startswith("RO"):
        if ROOT:
            pytest.skip("root writes into read-only folders")
        (here / "RO").mkdir(mode=0o555)
    if where.startswith("FILE"):
        (here / "FILE").write_text("a file, not a folder")
    path = str(here / where) if not where.startswith("/") else where
    for argv in (_plan("--plot", path), _SWEEP + ["--plot", path]):
        before = _snapshot(here)
        result, _ = _invoke(argv)
        assert result.exit_code == 2 and result.stdout == "", result.output  # nothing printed before the refusal
        assert result.stderr.count("\n") == 1 and "cannot write" in result.stderr, result.stderr
        assert _snapshot(here) == before


# --------------------------------------------------------------------------- 4. Ctrl-C


def test_ctrl_c_is_one_line_and_exit_130(here, monkeypatch):
    import autopar.api as api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "search_plans", interrupted)
    result, _ = _invoke(_plan("--out", here / "plan.json"))
    assert result.exit_code == 130, result.output
    assert result.stderr == "error: interrupted\n"
    assert list(here.iterdir()) == []


def test_without_hard_links_a_new_file_is_still_created_exclusively(tmp_path, monkeypatch):
    """A file system that refuses os.link (FAT, some network mounts): the name is taken by an
    exclusive create, so an existing file still fails, and nothing is left behind."""
    import errno

    from autopar.errors import OutputFileError
    from autopar.io import write_output

    def no_links(src, dst, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    import autopar.io as io

    monkeypatch.setattr(os, "link", no_links)
    write_output(tmp_path / "a.json", "new", force=False)
    assert (tmp_path / "a.json").read_text() == "new"
    stage = io._stage

    def other_process_writes_first(target, data, executable, what):
        tmp = stage(target, data, executable, what)
        target.write_text("theirs")
        return tmp

    monkeypatch.setattr(io, "_stage", other_process_writes_first)
    with pytest.raises(OutputFileError, match="another process"):
        write_output(tmp_path / "b.json", "mine", force=False)
    assert (tmp_path / "b.json").read_text() == "theirs"
    monkeypatch.setattr(io, "_stage", stage)
    write_output(tmp_path / "a.json", "forced", force=True)  # the file it replaces is kept as a copy meanwhile
    assert (tmp_path / "a.json").read_text() == "forced"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]
