"""`autopar profile --device cpu --quick` end to end, and `autopar calibrate` on a user's runs."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.params import load_cost_model

runner = CliRunner()
RUNS = Path(__file__).parent / "fixtures" / "runs" / "user_runs.yaml"


def test_cpu_profile_drives_a_plan(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.json"
    r = runner.invoke(app, ["profile", "--device", "cpu", "--quick", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    f, p = load_cost_model(str(out))  # loads through the schema
    assert f.provenance.method == "profiled" and "torch" in " ".join(f.provenance.sources)
    assert f.provenance.command.startswith("autopar profile")
    assert len(f.gemm_table) >= 8 and max(g.efficiency for g in f.gemm_table) == pytest.approx(1.0)
    ops = {c["op"] for c in f.measurements["collectives"]}
    assert {"all_reduce", "all_gather", "all_to_all", "send_recv"} <= ops
    r = runner.invoke(app, ["plan", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "32",
                            "--seq-len", "4096", "--cost-model", str(out), "--json", "--top", "1"])
    assert r.exit_code == 0, r.output
    # stdout: a CPU profile on an H100 cluster warns on stderr that the model is for another GPU
    assert "warning: cost model" in r.output and json.loads(r.stdout)["plans"][0]["estimate"]["fits"]


def test_gemm_table_interpolation_is_exact_on_measured_shapes():
    from autopar.cost.compute import gemm_efficiency

    f, p = load_cost_model("h100")
    table = ((1024, 1024, 1024, 0.5), (4096, 4096, 4096, 0.8))
    q = p.__class__(**{**{s: getattr(p, s) for s in p.__slots__}, "gemm_table": table})
    assert gemm_efficiency(4096, 4096, 4096, q) == 0.8
    assert 0.5 < gemm_efficiency(2048, 2048, 2048, q) < 0.8


def test_calibrate_user_runs_reports_leave_one_out(tmp_path):
    out = tmp_path / "user.json"
    r = runner.invoke(app, ["calibrate", str(RUNS), "--base", "h100", "--out", str(out), "--iters", "40"])
    assert r.exit_code == 0, r.output
    assert r.output.count("leave-one-out") == 3
    f, _ = load_cost_model(str(out))
    assert f.fit.runs_fit == 3 and f.fit.runs_holdout == 3 and f.fit.mape_holdout is not None
    assert f.provenance.command.startswith("autopar calibrate")


def test_calibrate_bad_runs_file(tmp_path):
    bad = tmp_path / "runs.yaml"
    bad.write_text("runs:\n  - {model: llama3-8b, cluster: dgx-h100}\n")
    r = runner.invoke(app, ["calibrate", str(bad), "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "missing required key" in r.output
