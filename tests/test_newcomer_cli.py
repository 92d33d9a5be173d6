"""What a new user runs into (issue 32): `--version`, repeated `--fix`, `--plot` without matplotlib,
`plan --out x.json --export`, memory headroom among equivalent plans, and explain's cp, vpp, ep and
etp neighbours."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.report.explain import explain
from autopar.schema.plan import ParallelPlan, Recompute
from autopar.search.rank import at_memory_limit, distinct_rows, tight_memory_fraction
from autopar.units import GiB

runner = CliRunner()
PLAN = ["llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192", "--global-batch", "128"]


def test_version_is_the_installed_one():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"autopar {version('autopar')}"


def test_repeated_fix_pins_every_axis():
    r = runner.invoke(app, ["plan", *PLAN, "--fix", "tp=8", "--fix", "pp=4", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)["plans"]
    assert plans and {(p["parallel"]["tp"], p["parallel"]["pp"]) for p in plans} == {(8, 4)}
    same = runner.invoke(app, ["plan", *PLAN, "--fix", "tp=8,pp=4", "--fix", "tp=8", "--top", "3", "--json"])
    assert same.exit_code == 0 and json.loads(same.stdout)["plans"] == plans  # the same pin twice is one


def test_conflicting_fix_is_refused_in_one_line():
    for command in (["plan", *PLAN], ["sweep", "llama3-70b", "-c", "dgx-h100", "-n", "64,128", "-b", "128"]):
        r = runner.invoke(app, command + ["--fix", "tp=8", "--fix", "tp=4"])
        assert r.exit_code == 2
        assert r.output.strip() == "error: --fix pins tp twice, to 8 and 4; give one --fix tp=VALUE"


def test_plot_without_matplotlib_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec("matplotlib") is None
    picture, plan_json = tmp_path / "x.png", tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", *PLAN, "--quiet", "--plot", str(picture), "--out", str(plan_json)])
    assert r.exit_code == 2
    assert "pip install 'autopar[plot]'" in r.output and len(r.output.strip().splitlines()) == 1
    assert not picture.exists() and not plan_json.exists() and list(tmp_path.iterdir()) == []


def test_plan_out_json_with_export_is_refused_and_makes_no_directory(tmp_path):
    target = tmp_path / "x.json"
    r = runner.invoke(app, ["plan", *PLAN, "--quiet", "--out", str(target), "--export", "deepspeed"])
    assert r.exit_code == 2 and not target.exists()
    assert "give --out DIR" in r.output and "autopar export x.json --format deepspeed --out DIR" in r.output
    folder = tmp_path / "run"
    ok = runner.invoke(app, ["plan", *PLAN, "--quiet", "--out", str(folder), "--export", "megatron"])
    assert ok.exit_code == 0, ok.output  # a folder: the plan JSON and the launch files in it
    assert (folder / "plan.json").is_file() and len(list(folder.iterdir())) > 1


def _est(step_s: float, peak_gib: float, usable_gib: float = 72.0):
    return SimpleNamespace(step_time_s=step_s, peak_memory_bytes=peak_gib * GiB, usable_memory_bytes=usable_gib * GiB)


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(global_batch=2048, seq_len=8192, recompute=Recompute(mode="none"), **kw)


def test_a_plan_at_the_memory_limit_is_not_listed_first():
    """The issue's Llama-3.1-405B case, hand-worked with the shipped 9.2 % (the worst validated
    peak-memory error): tp4·pp32·v2·cp4 at 69.5 of 72 GiB usable would need 69.5 × 1.092 = 75.9 GiB
    if the model is off by its worst: at the limit. tp8·pp32·v2·cp4 at 35.9 GiB (39.2 GiB) has
    room, is as fast within the band, and comes first though its tp is larger; a plan at 65.5 GiB
    (71.5 GiB) still has room and keeps its simplicity place."""
    assert tight_memory_fraction() == 0.092
    tight = (_plan(tp=4, pp=32, vpp=2, cp=4), _est(6.939, 69.5))
    roomy = (_plan(tp=8, pp=32, vpp=2, cp=4), _est(6.790, 35.9))
    assert at_memory_limit(tight[1]) and not at_memory_limit(roomy[1]) and not at_memory_limit(_est(1.0, 65.5))
    rows = distinct_rows([roomy, tight], top=5, band=0.064)
    assert [r.plan.tp for r in rows] == [8, 4] and all(r.equivalent_to_best for r in rows)
    roomy_tp4 = (_plan(tp=4, pp=32, vpp=2, cp=4), _est(6.939, 65.5))
    assert [r.plan.tp for r in distinct_rows([roomy, roomy_tp4], top=5, band=0.064)] == [4, 8]
    slow = (_plan(tp=8, pp=16), _est(9.0, 20.0))  # outside the band: after both, headroom or not
    assert [r.plan.tp for r in distinct_rows([slow, tight, roomy], top=5, band=0.064)] == [8, 4, 8]


def test_405b_on_16384_h100_chooses_the_plan_with_room():
    r = runner.invoke(app, ["plan", "llama3.1-405b", "-c", "dgx-h100", "-n", "16384", "-s", "8192", "-b", "2048",
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    first = data["alternatives"][0]["estimate"]
    assert first["peak_memory_bytes"] * (1 + tight_memory_fraction()) <= first["usable_memory_bytes"]
    times = [p["estimate"]["step_time_s"] for p in data["plans"]]
    assert times == sorted(times)  # --json keeps the raw ranking, fastest first


def test_explain_shows_cp_and_vpp_neighbours_with_the_oom():
    """Llama-3-70B tp4·pp4·cp2 on 64 H100: cp 2→1 doubles each rank's sequence and runs out of
    memory (the issue's neighbour nobody saw); cp 2→4 halves dp."""
    plan = ParallelPlan(tp=4, pp=4, cp=2, global_batch=128, seq_len=8192, recompute=Recompute(mode="none"))
    ex = explain("llama3-70b", "dgx-h100", 64, plan)
    by_name = {a.name: a for a in ex.alternatives}
    assert by_name["cp 2→1 (dp 2→4)"].verdict == "oom" and by_name["cp 2→1 (dp 2→4)"].plan.cp == 1
    assert by_name["cp 2→4 (dp 2→1)"].plan.cp == 4
    assert {a.plan.vpp for a in ex.alternatives if a.axis == "vpp"} == {2}
    assert not any(a.axis in ("ep", "etp") for a in ex.alternatives)  # a dense model
    assert ex.to_dict()["alternatives"][0]["change"] == {"tp": 8}


def test_explain_shows_ep_and_etp_neighbours_for_moe():
    plan = ParallelPlan(tp=2, pp=1, ep=4, global_batch=256, seq_len=4096, recompute=Recompute(mode="none"))
    ex = explain("mixtral-8x7b", "dgx-h100", 64, plan)
    moves = {(a.axis, a.plan.ep, a.plan.expert_tp) for a in ex.alternatives if a.axis in ("ep", "etp")}
    assert moves == {("ep", 8, 2), ("ep", 2, 2), ("etp", 4, 4), ("etp", 4, 1)}
    ep16 = ParallelPlan(tp=1, pp=1, ep=8, global_batch=256, seq_len=4096)
    up = next(a for a in explain("mixtral-8x7b", "dgx-h100", 64, ep16).alternatives if a.name == "ep 8→16")
    assert up.verdict == "invalid" and "8 experts" in up.reason


@pytest.mark.parametrize("axis", ["cp", "vpp", "ep", "etp"])
def test_explain_json_change_names_the_new_degree(axis):
    plan = ParallelPlan(tp=2, pp=2, ep=4, global_batch=256, seq_len=4096, recompute=Recompute(mode="none"))
    ex = explain("mixtral-8x7b", "dgx-h100", 64, plan)
    for a, d in zip(ex.alternatives, ex.to_dict()["alternatives"]):
        if a.axis == axis:
            want = {"cp": a.plan.cp, "vpp": a.plan.vpp, "ep": a.plan.ep, "etp": a.plan.expert_tp}[axis]
            assert d["change"] == {axis: want}


EXAMPLE_RUNS = __import__("pathlib").Path(__file__).parent.parent / "examples" / "measured-runs.yaml"  # H100 96 GB


def test_calibrate_h100_runs_starts_from_the_h100_base_and_is_named_after_it(tmp_path):
    from autopar import api
    from autopar.cost.params import load_cost_model

    out = tmp_path / "mine.json"
    r = runner.invoke(app, ["calibrate", str(EXAMPLE_RUNS), "--out", str(out), "--iters", "20"])
    assert r.exit_code == 0, r.output
    mine, _ = load_cost_model(str(out))
    h100, _ = load_cost_model("h100")
    assert mine.name == "h100-calibrated" and "Base file: h100 " in mine.provenance.notes
    assert set(mine.gpus) == set(h100.gpus) | {"H100 SXM 96GB HBM2e 500W"}
    # warned exactly when the held-out error is worse than the uncalibrated h100 model's on these runs
    worse = mine.fit.mape_holdout > api.uncalibrated_error(str(EXAMPLE_RUNS), None)
    assert ("warning: the calibration's held-out error" in r.output) == worse
    if worse:
        assert "worse than the uncalibrated h100 model's" in r.output


def test_a_cost_model_for_another_gpu_is_warned_about(tmp_path):
    args = ["estimate", "llama3-8b", "-n", "8", "-b", "8", "-s", "4096", "--cost-model", "h100"]
    other = runner.invoke(app, [*args, "-c", "dgx-a100-80gb"])
    assert other.exit_code == 0, other.output
    assert "warning: cost model h100 (h100) is for H100 SXM5 80GB" in " ".join(other.output.split())
    assert "dgx-a100-80gb has A100 SXM4 80GB" in " ".join(other.output.split())
    own = runner.invoke(app, [*args, "-c", "dgx-h100"])
    assert own.exit_code == 0 and "warning" not in own.output


def test_calibrating_runs_of_two_gpu_families_is_refused(tmp_path):
    text = EXAMPLE_RUNS.read_text()
    first = text.split("  - name: ")[1]
    mixed = tmp_path / "mixed.yaml"
    a100 = first.replace("cluster: grandteton-h100-96gb", "cluster: dgx-a100-80gb").replace(
        "llama3.1-8b-fsdp8-compile-fp8", "a100-run").replace("precision: fp8", "precision: bf16")
    mixed.write_text("runs:\n  - name: " + first + "  - name: " + a100)
    r = runner.invoke(app, ["calibrate", str(mixed), "--out", str(tmp_path / "x.json"), "--iters", "5"])
    assert r.exit_code == 2 and "different cost models" in r.output and "--base" in r.output
    assert not (tmp_path / "x.json").exists()


def test_a_base_for_another_gpu_is_warned_about(tmp_path):
    out = tmp_path / "x.json"
    r = runner.invoke(app, ["calibrate", str(EXAMPLE_RUNS), "--base", "a100", "--out", str(out), "--iters", "5"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "warning: --base a100 is for A100 SXM4 40GB, A100 SXM4 80GB, and the runs are on H100 SXM 96GB" in text
    same = runner.invoke(app, ["calibrate", str(EXAMPLE_RUNS), "--base", "h100", "--out", str(out), "--force",
                               "--iters", "5"])
    assert same.exit_code == 0 and "--base h100 is for" not in same.output
