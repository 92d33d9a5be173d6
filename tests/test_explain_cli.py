"""`autopar explain`, `autopar sweep` and `plan --explain --plot` through the CLI."""

import json

from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
BASE = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "128", "--seq-len", "8192"]


def test_explain_json_sums_and_neighbours():
    r = runner.invoke(app, ["explain", "--plan", "tp=8,pp=4,vpp=5", *BASE, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    step = d["estimate"]["step_time_s"]
    for row in d["stage_time_s"]:
        parts = {k: v for k, v in row.items() if k not in ("rank", "layers", "total", "bottleneck")}
        assert abs(sum(v for v in parts.values() if isinstance(v, (int, float))) - step) < 1e-6 * step
    changes = " ".join(a["change"] if isinstance(a["change"], str) else json.dumps(a["change"]) for a in d["alternatives"])
    assert "tp" in changes and "pp" in changes and "mbs" in changes and "zero" in changes
    tp16 = [a for a in d["alternatives"] if a["verdict"] == "invalid"]
    assert any("GPUs of the scale-up domain" in a["reason"] for a in tp16)


def test_plan_explain_and_plot(tmp_path):
    png = tmp_path / "plan.png"
    r = runner.invoke(app, ["plan", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
                            "--global-batch", "128", "--explain", "--plot", str(png), "--quiet"])
    assert r.exit_code == 0, r.output
    assert "Neighbouring plans" in r.output
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "autopar[plot]" in r.output
    else:
        assert png.stat().st_size > 10_000 and (tmp_path / "plan-memory.png").stat().st_size > 10_000


def test_sweep_json_points():
    r = runner.invoke(app, ["sweep", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8,16,32", "--global-batch", "64",
                            "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    pts = json.loads(r.output)["points"]
    assert [p["gpus"] for p in pts] == [8, 16, 32]


def test_explain_without_plan_exit_2():
    r = runner.invoke(app, ["explain"])
    assert r.exit_code == 2 and "needs a plan" in r.output
    r = runner.invoke(app, ["sweep", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8,x", "--global-batch", "8"])
    assert r.exit_code == 2 and "Traceback" not in r.output
