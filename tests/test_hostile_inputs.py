"""Hostile inputs: names that would inject shell commands into launch scripts, numbers that overflow,
values that are zero, negative, astronomically large or of the wrong kind, YAML keys that are not
names or are given twice, a terminal that cannot print Unicode. Each ends in one line naming the
fix and exit code 2 (or, for a name, a script where it is inert), never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = "evil\ntouch {marker}\n$(touch {marker})`touch {marker}`\"; touch {marker}; #\u2028"


def _one_line_exit_2(args: list[str], needle: str = "") -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.output)
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert needle in r.output, r.output
    return r.output


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan"])
def test_hostile_names_cannot_inject_commands_into_exports(tmp_path, framework):
    """A model name (config.json _name_or_path), a cluster name and an autopar version from a plan file
    that carry newlines, command substitutions and quotes land in the scripts as inert text: `bash -n`
    accepts each script, and running its header lines creates nothing."""
    marker = tmp_path / "INJECTED"
    config = json.loads((FIXTURES / "hf" / "llama3-8b.json").read_text())
    config["_name_or_path"] = HOSTILE.format(marker=marker)
    model = tmp_path / "config.json"
    model.write_text(json.dumps(config))
    plan_file = tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", str(model), "-c", "dgx-h100", "-n", "16", "-b", "64", "-s", "4096", "-q",
                            "--top", "1", "--framework", framework, "--out", str(plan_file)])
    assert r.exit_code == 0, r.output
    data = json.loads(plan_file.read_text())
    data["autopar_version"] = HOSTILE.format(marker=marker)
    plan_file.write_text(json.dumps(data))
    out = tmp_path / "out"
    r = runner.invoke(app, ["export", str(plan_file), "--format", framework, "--out", str(out)])
    assert r.exit_code == 0, r.output
    for script in out.glob("*.sh"):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        header = script.read_text().split("set -euo pipefail")[0]  # the comment lines carrying the names
        subprocess.run(["bash", "-c", header], capture_output=True, timeout=10)
        lines = [ln for ln in script.read_text().splitlines() if "touch" in ln]
        assert all(ln.lstrip().startswith("#") for ln in lines), lines
    for module in out.glob("*.py"):
        compile(module.read_text(), str(module), "exec")  # the name stays inside the docstring
    assert not marker.exists()


def test_only_the_scripts_own_variables_stay_unquoted():
    from autopar.export.common import shell_word

    assert shell_word('"$DATA_PATH"') == '"$DATA_PATH"'
    assert shell_word('"$(rm -rf /)"') == "'\"$(rm -rf /)\"'"
    assert shell_word("$HOME") == "'$HOME'"


def _profile(tmp_path: Path, old: str, new: str) -> str:
    text = (Path(__file__).parent.parent / "hardware_profiles" / "dgx-h100.yaml").read_text()
    assert old in text
    path = tmp_path / "cluster.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("old,new,field", [
    ("hbm_gib: 80", "hbm_gib: 1.0e300", "hbm_gib"),
    ("bf16: 989 ", "bf16: 1.0e-300 ", "bf16"),
    ("gpus_per_node: 8", "gpus_per_node: 1" + "0" * 400, "gpus_per_node"),
    ("nic_gbit_per_s: 400", "nic_gbit_per_s: 0.0", "nic_gbit_per_s"),
])
def test_profile_numbers_out_of_any_hardware_are_refused(tmp_path, old, new, field):
    cluster = _profile(tmp_path, old, new)
    _one_line_exit_2(["plan", "llama3-8b", "-c", cluster, "-n", "16", "-b", "64", "-s", "4096", "-q"], field)


def test_yaml_keys_that_are_not_names_or_repeat_are_refused(tmp_path):
    cluster = _profile(tmp_path, "name: dgx-h100", "name: dgx-h100\nname: other")
    _one_line_exit_2(["plan", "llama3-8b", "-c", cluster, "-n", "16", "-b", "64", "-s", "4096", "-q"],
                     "appears twice")
    model = tmp_path / "model.yaml"
    model.write_text("1: 2\nname: x\n")
    _one_line_exit_2(["inspect", str(model)], "is not a name")


@pytest.mark.parametrize("args,needle", [
    ("--tensor-model-parallel-size 0", "--tensor-model-parallel-size 0"),
    ("--pipeline-model-parallel-size 1000000000000", "--pipeline-model-parallel-size"),
    ("--micro-batch-size 0", "--micro-batch-size 0"),
    ("--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers -5", "-5"),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout E|(t*10000000000000000000)|L", "layers"),
])
def test_megatron_values_out_of_range_are_refused(args, needle):
    base = "--global-batch-size 64 --seq-length 4096 --micro-batch-size 1 "
    _one_line_exit_2(["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "--from-megatron", base + args], needle)


@pytest.mark.parametrize("config,needle", [
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu"),
    ({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 0}}, "pipeline.stages"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 7}}, "stage"),
])
def test_deepspeed_values_out_of_range_are_refused(tmp_path, config, needle):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    _one_line_exit_2(["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "--from-deepspeed", str(path)], needle)


def test_integers_of_thousands_of_digits_are_refused():
    big = "1" * 5000
    _one_line_exit_2(["sweep", "llama3-8b", "-c", "dgx-h100", "-n", f"8,{big}", "-b", "64", "-s", "4096", "-q"],
                     "--gpus")
    _one_line_exit_2(["plan", "llama3-8b", "-c", "dgx-h100", "-n", "16", "-b", "64", "-s", "4096", "-q",
                      "--fix", f"tp={big}"], "tp must be from")


def test_a_runs_file_with_a_mapping_for_dp_is_refused(tmp_path):
    runs = tmp_path / "runs.yaml"
    runs.write_text("runs:\n  - name: a\n    model: llama3-8b\n    cluster: dgx-h100\n    gpus: 8\n"
                    "    global_batch: 8\n    seq_len: 2048\n    step_time_s: 1.0\n    parallel: {dp: {a: 1}}\n")
    _one_line_exit_2(["validate", "--runs", str(runs)], "dp")


def test_a_step_too_small_for_json_is_refused(tmp_path):
    runs = tmp_path / "runs.yaml"
    runs.write_text("runs:\n  - name: a\n    model: llama3-8b\n    cluster: dgx-h100\n    gpus: 8\n"
                    "    global_batch: 8\n    seq_len: 2048\n    step_time_s: 5.0e-324\n")
    _one_line_exit_2(["validate", "--runs", str(runs), "--json"], "step_time_s")


def test_fp8_on_a_gpu_without_fp8_is_refused():
    for command in ("estimate", "plan"):
        _one_line_exit_2([command, "llama3-8b", "-c", "dgx-a100-80gb", "-n", "16", "-b", "64", "-s", "4096",
                          "--precision", "fp8", *(["-q"] if command == "plan" else [])], "no fp8 tensor cores")


def test_plan_files_that_contradict_themselves_are_refused(tmp_path):
    plan_file = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", "llama3-8b", "-c", "dgx-h100", "-n", "16", "-b", "64", "-s", "4096", "-q",
                               "--top", "1", "--out", str(plan_file)]).exit_code == 0
    data = json.loads(plan_file.read_text())
    other = {**data, "target": {**data["target"], "model": "llama3-70b"}}
    (tmp_path / "other.json").write_text(json.dumps(other))
    for command in (["export", str(tmp_path / "other.json")], ["explain", str(tmp_path / "other.json")]):
        _one_line_exit_2(command, "describes another model")
    negative = {**data, "parallel": {**data["parallel"], "pp": 2, "layers_per_stage": [-5, 37]}}
    (tmp_path / "negative.json").write_text(json.dumps(negative))
    _one_line_exit_2(["export", str(tmp_path / "negative.json")], "layers_per_stage")


@pytest.mark.parametrize("override,needle", [({"compute": {"gemm_max": 0}}, "gemm_max"),
                                             ({"compute": {"bogus": 0.5}}, "bogus")])
def test_framework_cost_model_overrides_are_validated(tmp_path, override, needle):
    data = json.loads((Path(__file__).parent.parent / "cost_models" / "h100.json").read_text())
    data["frameworks"]["torchtitan"] = {**override, "source": "test"}
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    _one_line_exit_2(["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "-b", "64", "-s", "4096",
                      "--framework", "torchtitan", "--cost-model", str(path)], needle)


def test_an_ascii_terminal_gets_escapes_not_a_traceback():
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    r = subprocess.run(["python", "-m", "autopar", "plan", "llama3-8b", "-c", "dgx-h100", "-n", "16", "-b", "64",
                        "-s", "4096", "-q", "--top", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "\\u2248" in r.stdout or "tp" in r.stdout
