"""`autopar export`, `plan --export` and the importers through the CLI."""

import json

from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
PLAN = ["plan", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64",
        "--quiet"]


def test_plan_export_megatron_round_trips_through_estimate(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, PLAN + ["--export", "megatron", "--out", str(out)])
    assert r.exit_code == 0, r.output
    script = out / "launch_megatron.sh"
    assert script.stat().st_mode & 0o111 and "pretrain_gpt.py" in script.read_text()
    planned = json.loads((out / "plan.json").read_text())
    r = runner.invoke(app, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "--from-megatron", str(script),
                            "--json"])
    assert r.exit_code == 0, r.output
    scored = json.loads(r.output)
    for axis in ("tp", "pp", "cp", "vpp", "mbs", "global_batch", "seq_len", "zero"):
        assert scored["parallel"][axis] == planned["parallel"][axis] or (axis == "zero")
    assert scored["step_time_s"] == planned["estimate"]["step_time_s"]


def test_export_command_prints_and_refuses(tmp_path):
    pj = tmp_path / "plan.json"
    assert runner.invoke(app, PLAN + ["--out", str(pj), "--fix", "tp=1,pp=1,cp=1"]).exit_code == 0
    # Planned for Megatron, it does not fit as DeepSpeed runs it (the Hugging Face model's eager kernels
    # and loss): the export refuses and names the command that re-plans it.
    r = runner.invoke(app, ["export", str(pj), "--format", "deepspeed"])
    assert r.exit_code == 2 and "under deepspeed it needs" in r.output and "--framework deepspeed`" in r.output
    ds = tmp_path / "ds.json"
    assert runner.invoke(app, PLAN + ["--out", str(ds), "--framework", "deepspeed"]).exit_code == 0
    r = runner.invoke(app, ["export", str(ds), "--format", "deepspeed"])
    assert r.exit_code == 0, r.output
    assert "===== ds_config.json" in r.output and "train_batch_size" in r.output
    r = runner.invoke(app, ["export", str(pj), "--format", "horovod"])
    assert r.exit_code == 2 and "--format" in r.output
    r = runner.invoke(app, ["export", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_export_refuses_what_deepspeed_cannot_express(tmp_path):
    pj = tmp_path / "plan.json"
    assert runner.invoke(app, PLAN + ["--out", str(pj), "--fix", "tp=2"]).exit_code == 0
    r = runner.invoke(app, ["export", str(pj), "--format", "deepspeed"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "deepspeed" in r.output.lower()


def test_compare_with_imported_megatron_args(tmp_path):
    args = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
            "--global-batch-size 64 --seq-length 4096 --bf16 --use-distributed-optimizer --sequence-parallel")
    r = runner.invoke(app, ["compare", "--from-megatron", args, "--plan", "tp=1", "--model", "llama3-8b",
                            "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
                            "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert plans[0]["parallel"]["tp"] == 2 and plans[1]["parallel"]["tp"] == 1


def test_export_json(tmp_path):
    pj = tmp_path / "plan.json"
    assert runner.invoke(app, PLAN + ["--out", str(pj)]).exit_code == 0
    r = runner.invoke(app, ["export", str(pj), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["format"] == "megatron" and "launch_megatron.sh" in d["files"] and d["written"] == []
