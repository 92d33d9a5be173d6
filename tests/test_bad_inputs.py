"""Every bad input: one line on stderr, exit 2, no traceback, nothing written, bounded time.

One table row per case of issue 14, grouped by the class of failure it had before the fix
(hang, traceback, silently accepted, unhelpful message). Each row runs the CLI in a fresh folder
and checks the exit code, that stderr is exactly one line (no box, no traceback) containing the
expected words, that no file appeared or changed, and that it returned within the time bound
(a hang is also cut off by an alarm, so the suite never waits ten minutes).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.limits import MAX_ECHO_CHARS

runner = CliRunner()
WALL_S = 20.0  # every case returns well inside this on a loaded 2-core machine (the hangs ran > 10 min)
LLAMA8B = Path("tests/fixtures/hf/llama3-8b.json").resolve()
MEGATRON_SCRIPT = Path("tests/fixtures/export/handwritten_megatron.sh").resolve()  # 30 layers, h 4096, 32 heads
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _config(**changes) -> dict:
    cfg = json.loads(LLAMA8B.read_text())
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not None}


def _write_config(folder: Path, name: str, cfg: dict | str, prefix: bytes = b"") -> str:
    path = folder / name
    text = cfg if isinstance(cfg, str) else json.dumps(cfg)
    path.write_bytes(prefix + text.encode())
    return str(path)


def _plan(*extra: str) -> list[str]:
    return ["plan", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "2048", "--quiet", *extra]


def _exported_plan(folder: Path) -> str:
    """A valid plan.json to export (made once per case folder)."""
    result = runner.invoke(app, _plan("--out", str(folder / "made" / "plan.json")))
    assert result.exit_code == 0, result.output
    return str(folder / "made" / "plan.json")


# Each case: (id, class, setup(folder) -> argv, words the one line must contain)
CASES = [
    # --- hangs: each ran for minutes before -----------------------------------------------------
    ("gpus-1e18", "hang", lambda d: ["plan", "llama3-8b", "-c", "dgx-h100", "-n", str(10**18), "-b", "8"],
     ["--gpus", "1048576"]),
    ("gpus-1e30", "hang", lambda d: ["plan", "llama3-8b", "-c", "dgx-h100", "-n", str(10**30), "-b", "8"],
     ["--gpus"]),
    ("gpus-2**63", "hang", lambda d: ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", str(2**63), "-b", "8"],
     ["--gpus"]),
    ("layers-1e7", "hang", lambda d: ["plan", _write_config(d, "config.json", _config(num_hidden_layers=10_000_000)),
                                      "-c", "dgx-h100", "-n", "8", "-b", "8"], ["num_layers", "4096"]),
    ("cluster-dev-zero", "hang", lambda d: ["plan", "llama3-8b", "-c", "/dev/zero", "-n", "8", "-b", "8"],
     ["/dev/zero", "not a regular file"]),
    ("model-dev-zero", "hang", lambda d: ["inspect", "/dev/zero"], ["/dev/zero"]),
    ("huge-file", "hang", lambda d: ["inspect", _write_config(d, "big.json", " " * (5 * 2**20) + "{}")],
     ["MiB"]),
    # --- tracebacks -----------------------------------------------------------------------------
    ("batch-minus-1", "traceback", lambda d: _plan()[:6] + ["-b", "-1"], ["--global-batch"]),
    ("model-name-5000", "traceback", lambda d: ["inspect", "x" * 5000], ["characters"]),
    ("cluster-name-5000", "traceback", lambda d: ["plan", "llama3-8b", "-c", "c" * 5000, "-n", "8", "-b", "8"],
     ["cluster", "characters"]),
    ("model-path-part-300", "traceback", lambda d: ["inspect", str(d / ("m" * 300 + ".json"))], ["255"]),
    ("out-into-proc", "traceback", lambda d: _plan("--out", "/proc/autopar-test/plan.json"), ["/proc/autopar-test"]),
    ("out-onto-directory", "traceback", lambda d: (d / "adir").mkdir() or _plan("--out", str(d / "adir")),
     ["is a directory"]),
    ("out-onto-dev-full", "traceback", lambda d: _plan("--out", "/dev/full", "--force"), ["not a regular file"]),
    ("out-onto-existing", "traceback", lambda d: (d / "p.json").write_text("keep") and _plan("--out", str(d / "p.json")),
     ["exists", "--force"]),
    ("export-out-onto-file", "traceback",
     lambda d: (d / "f").write_text("keep") and _plan("--export", "megatron", "--out", str(d / "f")),
     ["is a file, not a folder"]),
    ("plot-into-proc", "traceback", lambda d: _plan("--plot", "/proc/autopar-test/t.png"), ["/proc/autopar-test"]),
    ("calibrate-out-proc", "traceback",
     lambda d: ["calibrate", "--derive-as", "x", "--derive-gpus", "X", "--out", "/proc/autopar-test.json"],
     ["/proc/autopar-test.json"]),
    ("calibrate-out-existing", "traceback",
     lambda d: (d / "c.json").write_text("keep") and ["calibrate", "--out", str(d / "c.json"), "--iters", "1"],
     ["exists", "--force"]),
    ("profile-out-existing", "traceback",
     lambda d: (d / "p.json").write_text("keep") and ["profile", "--device", "cpu", "--out", str(d / "p.json")],
     ["exists", "--force"]),
    ("unicode-digit-fix", "traceback", lambda d: _plan("--fix", "tp=²"), ["whole number"]),
    ("ds-config-bad-stage", "traceback",
     lambda d: ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--from-deepspeed",
                _write_config(d, "ds.json", {"train_batch_size": 8, "zero_optimization": {"stage": "x"}})],
     ["zero_optimization.stage"]),
    ("hf-dropout-string", "traceback",
     lambda d: ["inspect", _write_config(d, "config.json", {**_config(), "model_type": "gpt_neox",
                                                            "hidden_dropout": "x"})], ["hidden_dropout"]),
    # --- silently accepted ----------------------------------------------------------------------
    ("seq-0", "silent", lambda d: _plan()[:8] + ["-s", "0"], ["--seq-len"]),
    ("fix-twice", "silent", lambda d: _plan("--fix", "tp=8,tp=4"), ["tp twice"]),
    ("plan-string-twice", "silent",
     lambda d: ["compare", "--plan", "pp=2,pp=4", "--model", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8"],
     ["pp twice"]),
    ("megatron-with-tp", "silent",
     lambda d: ["estimate", "gpt-1.7b", "-c", "dgx-h100", "-n", "128", "--from-megatron", str(MEGATRON_SCRIPT),
                "--tp", "2"], ["--tp would be ignored"]),
    ("megatron-with-batch", "silent",
     lambda d: ["estimate", "gpt-1.7b", "-c", "dgx-h100", "-n", "128", "--from-megatron", str(MEGATRON_SCRIPT),
                "-b", "64"], ["--global-batch would be ignored"]),
    ("deepspeed-with-pp", "silent",
     lambda d: ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--pp", "2", "--from-deepspeed",
                _write_config(d, "ds.json", {"train_batch_size": 8})], ["--pp would be ignored"]),
    ("both-imports", "silent",
     lambda d: ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--from-megatron", str(MEGATRON_SCRIPT),
                "--from-deepspeed", _write_config(d, "ds.json", {"train_batch_size": 8})], ["not both"]),
    ("megatron-other-model", "silent",
     lambda d: ["estimate", "llama3-70b", "-c", "dgx-h100", "-n", "128", "--from-megatron", str(MEGATRON_SCRIPT)],
     ["another model", "layers 30", "80"]),
    ("compare-megatron-other-model", "silent",
     lambda d: ["compare", "--model", "llama3-70b", "-c", "dgx-h100", "-n", "128", "--from-megatron",
                str(MEGATRON_SCRIPT)], ["another model"]),
    ("compare-batch-without-plan", "silent",
     lambda d: ["compare", "--model", "gpt-1.7b", "-c", "dgx-h100", "-n", "128", "-b", "64", "--from-megatron",
                str(MEGATRON_SCRIPT)], ["--global-batch apply to --plan strings only"]),
    ("hidden-size-true", "silent", lambda d: ["inspect", _write_config(d, "config.json", _config(hidden_size=True))],
     ["hidden_size", "whole number"]),
    ("layers-float", "silent", lambda d: ["inspect", _write_config(d, "config.json", _config(num_hidden_layers=32.0))],
     ["num_hidden_layers", "whole number"]),
    ("tie-embeddings-string", "silent",
     lambda d: ["inspect", _write_config(d, "config.json", _config(tie_word_embeddings="yes"))], ["true or false"]),
    ("yaml-bool-layers", "silent",
     lambda d: ["inspect", _write_config(d, "m.yaml", "num_layers: true\nhidden_size: 64\nnum_attention_heads: 4\n"
                                                      "ffn_hidden_size: 128\nvocab_size: 100\n")], ["num_layers"]),
    ("cluster-hbm-true", "silent",
     lambda d: ["plan", "llama3-8b", "-c", _write_config(d, "c.yaml", Path("hardware_profiles/dgx-h100.yaml").read_text()
                                                          .replace("hbm_gib: 80", "hbm_gib: true")), "-n", "8", "-b", "8"],
     ["hbm_gib"]),
    ("cluster-nan", "silent",
     lambda d: ["plan", "llama3-8b", "-c", _write_config(d, "c.yaml", Path("hardware_profiles/dgx-h100.yaml").read_text()
                                                          .replace("hbm_gib: 80", "hbm_gib: .nan")), "-n", "8", "-b", "8"],
     ["hbm_gib", "finite"]),
    ("plan-file-gpus-true", "silent", lambda d: ["export", _edit_plan(d, lambda p: p["target"].update(gpus=True))],
     ["gpus"]),
    ("plan-file-tp-float", "silent", lambda d: ["export", _edit_plan(d, lambda p: p["parallel"].update(tp=1.0))],
     ["tp"]),
    ("plan-file-nan", "silent", lambda d: ["export", _write_config(d, "nan.json", '{"schema_version": NaN}')],
     ["NaN"]),
    ("export-into-existing-dir", "silent",
     lambda d: (d / "launch").mkdir() or _export_twice(d), ["exists", "--force"]),
    ("margin-nan", "silent", lambda d: _plan("--memory-margin", "nan"), ["--memory-margin"]),
    ("fix-huge", "silent", lambda d: _plan("--fix", f"tp={2**63}"), ["tp must be from 1"]),
    ("sweep-huge", "silent",
     lambda d: ["sweep", "llama3-8b", "-c", "dgx-h100", "-n", f"8,{10**30}", "-b", "8", "--quiet"], ["--gpus"]),
    # --- unhelpful ------------------------------------------------------------------------------
    ("batch-0", "unhelpful", lambda d: _plan()[:6] + ["-b", "0"], ["--global-batch", "greater than or equal to 1"]),
    ("model-directory", "unhelpful", lambda d: (d / "m").mkdir() or ["inspect", str(d / "m")],
     ["directory without a config.json"]),
    ("model-dev-null", "unhelpful", lambda d: ["inspect", "/dev/null"], ["not a regular file"]),
    ("no-model-type", "unhelpful",
     lambda d: ["inspect", _write_config(d, "config.json", _config(model_type=None))], ["lacks 'model_type'"]),
    ("megabyte-model-type", "unhelpful",
     lambda d: ["inspect", _write_config(d, "config.json", _config(model_type="q" * 2**20))], ["not supported"]),
    ("hidden-1e15", "unhelpful", lambda d: ["inspect", _write_config(d, "config.json", _config(hidden_size=1e15))],
     ["hidden_size", "whole number"]),
    ("hidden-huge-int", "unhelpful",
     lambda d: ["inspect", _write_config(d, "config.json", _config(hidden_size=10**15))], ["hidden_size", "131072"]),
    ("405b-on-8", "unhelpful", lambda d: ["plan", "llama3.1-405b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "8192",
                                          "--quiet"], ["use more GPUs: at least 104 "]),
    ("top-0", "unhelpful", lambda d: _plan("--top", "0"), ["--top"]),
    ("margin-0.95", "unhelpful", lambda d: _plan("--memory-margin", "0.95"), ["--memory-margin", "0.9"]),
    ("gpus-abc", "unhelpful", lambda d: _plan()[:4] + ["-n", "abc", "-b", "8"], ["--gpus", "integer"]),
    ("unknown-option", "unhelpful", lambda d: _plan("--tpp", "2"), ["--tpp"]),
    ("missing-option", "unhelpful", lambda d: ["plan", "llama3-8b", "-n", "8", "-b", "8"], ["--cluster"]),
    ("bad-json-line", "unhelpful", lambda d: ["export", _write_config(d, "p.json", "{\n\"a\": }")], ["line 2"]),
]


def _edit_plan(folder: Path, edit) -> str:
    path = Path(_exported_plan(folder))
    data = json.loads(path.read_text())
    edit(data)
    out = folder / "edited.json"
    out.write_text(json.dumps(data))
    return str(out)


def _export_twice(folder: Path) -> list[str]:
    plan = _exported_plan(folder)
    result = runner.invoke(app, ["export", plan, "-f", "megatron", "-o", str(folder / "launch")])
    assert result.exit_code == 0, result.output
    for f in (folder / "launch").iterdir():
        f.write_text("mine")
    return ["export", plan, "-f", "megatron", "-o", str(folder / "launch")]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>") for p in folder.rglob("*")}


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, tmp_path, monkeypatch):
    name, kind, setup, words = case
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    argv = [str(a) for a in setup(tmp_path)]
    before = _snapshot(tmp_path)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(WALL_S) + 10)
    start = time.perf_counter()
    try:
        result = runner.invoke(app, argv)
    except _Hang:
        pytest.fail(f"{name} ({kind}) still running after {WALL_S + 10:.0f} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    wall_s = time.perf_counter() - start
    stderr = result.stderr
    assert result.exit_code == 2, (name, result.exit_code, result.output, repr(result.exception))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert len(stderr) < 1100, len(stderr)
    for word in words:
        assert word.lower() in stderr.lower(), (word, stderr)
    assert _snapshot(tmp_path) == before, "an output was written or changed"
    assert wall_s < WALL_S, f"{name} took {wall_s:.1f} s"


def test_every_class_is_covered():
    assert {c[1] for c in CASES} == {"hang", "traceback", "silent", "unhelpful"}


def test_echoed_values_are_clipped(tmp_path):
    """A 1 MB model_type comes back as at most 80 characters."""
    path = _write_config(tmp_path, "config.json", _config(model_type="q" * 2**20))
    result = runner.invoke(app, ["inspect", path])
    quoted = [w for w in result.stderr.split() if "qqq" in w]
    assert quoted and all(len(w) <= MAX_ECHO_CHARS + 2 for w in quoted), quoted


def test_bom_config_reads(tmp_path):
    """A UTF-8 byte-order mark (Windows editors write one) is not 'malformed JSON'."""
    path = _write_config(tmp_path, "config.json", _config(), prefix=b"\xef\xbb\xbf")
    result = runner.invoke(app, ["inspect", path, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_params"] == 8_030_261_248


def test_force_overwrites_atomically(tmp_path):
    """--force replaces an existing plan; no temporary file is left beside it."""
    out = tmp_path / "plan.json"
    out.write_text("old")
    result = runner.invoke(app, _plan("--out", str(out), "--force"))
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["schema_version"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_export_into_existing_dir_with_force(tmp_path):
    _export_twice(tmp_path)
    plan = str(tmp_path / "made" / "plan.json")
    result = runner.invoke(app, ["export", plan, "-f", "megatron", "-o", str(tmp_path / "launch"), "--force"])
    assert result.exit_code == 0, result.output
    assert all(f.read_text() != "mine" for f in (tmp_path / "launch").iterdir())


@pytest.mark.skipif(ROOT, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = runner.invoke(app, _plan("--out", str(folder / "plan.json")))
        assert result.exit_code == 2 and "Permission denied" in result.stderr, result.output
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_suggested_gpus_is_the_memory_bound():
    """The advice is the smallest count the shortfall allows: (peak − fixed)/(capacity − fixed)
    times the GPUs, rounded up to whole nodes (hand-worked: 900 GiB peak, 72 GiB usable, 4 GiB fixed
    on 8 GPUs: 8 · 896/68 = 105.4 → 112 on 8-GPU nodes)."""
    from autopar.search.driver import min_gpus_for_memory

    gib = 2**30
    assert min_gpus_for_memory(8, 900 * gib, 72 * gib, 4 * gib, 8) == 112
    assert min_gpus_for_memory(8, 73 * gib, 72 * gib, 0, 8) == 16  # 8.1 GPUs → the next whole node
    assert min_gpus_for_memory(2, 100 * gib, 72 * gib, 0, 8) == 3  # a partial node
    assert min_gpus_for_memory(8, 900 * gib, 4 * gib, 4 * gib, 8) is None


def test_raw_candidate_count_is_exact_and_caps_the_space():
    """count_raw_candidates equals the enumeration (brute force) on small spaces, and a space over
    the cap is refused in well under a second, before a plan is built."""
    from autopar.api import load_cluster, load_model
    from autopar.errors import InvalidPlanError
    from autopar.search.space import MAX_RAW_CANDIDATES, candidates, count_raw_candidates, raw_candidates, space_spec_for

    for model, gpus, seq, batch in (("llama3-8b", 16, 4096, 64), ("mixtral-8x7b", 32, 4096, 64),
                                    ("deepseek-v3", 256, 4096, 512)):
        spec = space_spec_for(load_model(model), load_cluster("dgx-h100", gpus), seq, batch)
        assert count_raw_candidates(spec) == sum(1 for _ in raw_candidates(spec))
    spec = space_spec_for(load_model("kimi-k2"), load_cluster("gb200-nvl72", 147456), 1048576, 332640)
    assert count_raw_candidates(spec) == 9_952_128 > MAX_RAW_CANDIDATES
    start = time.perf_counter()
    with pytest.raises(InvalidPlanError, match="pin axes with --fix"):
        candidates(spec)
    assert time.perf_counter() - start < 2.0


def test_realistic_spaces_are_under_the_cap():
    """The cap refuses no request anyone plans: MoE models on a few hundred GPUs (300,000 raw plans
    and more) up to Kimi K2 on 18,432 GB200 at 128K tokens. Counts by count_raw_candidates, exact
    (test_raw_candidate_count_is_exact_and_caps_the_space)."""
    from autopar.api import load_cluster, load_model
    from autopar.search.space import MAX_RAW_CANDIDATES, count_raw_candidates, space_spec_for

    for model, cluster, gpus, seq, batch, count in (
            ("llama4-maverick-17b-128e", "gb200-nvl72", 576, 8192, 1152, 319_932),
            ("gpt-oss-120b", "gb200-nvl72", 576, 8192, 1152, 301_167),
            ("deepseek-v3", "gb200-nvl72", 4608, 4096, 9216, 525_978),
            ("kimi-k2", "gb200-nvl72", 18432, 131072, 73728, 2_795_418)):
        spec = space_spec_for(load_model(model), load_cluster(cluster, gpus), seq, batch)
        assert count_raw_candidates(spec) == count <= MAX_RAW_CANDIDATES, model


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A write that fails after staging (here: the link or rename into place) removes its temporary
    files and the folders it made; the error is one OutputFileError line naming the path and the reason."""
    from autopar.errors import OutputFileError
    from autopar.io import write_outputs

    def refuse(src, dst, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.setattr(os, "link", refuse)
    target = tmp_path / "new" / "deeper" / "plan.json"
    with pytest.raises(OutputFileError, match="No space left on device") as info:
        write_outputs({target: "{}", tmp_path / "new" / "launch.sh": "#!/bin/sh\n"}, force=False)
    assert "deeper/plan.json" in str(info.value)  # the path, cut in the middle to 80 characters
    assert list(tmp_path.iterdir()) == []


def test_write_outputs_is_all_or_nothing(tmp_path):
    """One existing target refuses the whole set before anything is written."""
    from autopar.errors import OutputFileError
    from autopar.io import write_outputs

    (tmp_path / "b.json").write_text("keep")
    with pytest.raises(OutputFileError, match="exists; pass --force"):
        write_outputs({tmp_path / "a.json": "new", tmp_path / "b.json": "new"}, force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]
    assert (tmp_path / "b.json").read_text() == "keep"
    write_outputs({tmp_path / "a.json": "new", tmp_path / "b.sh": "#!/bin/sh\n"}, force=True)
    assert (tmp_path / "a.json").read_text() == "new"
    assert os.stat(tmp_path / "b.sh").st_mode & 0o100
