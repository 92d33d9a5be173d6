"""`autopar validate --runs`: a user's own measured runs, each predicted with the plan it states.

Cross-checks: every predicted figure is `autopar estimate`'s for the same plan; every measured
figure and error is recomputed here by hand from the file's numbers."""

import json

import pytest
from typer.testing import CliRunner

from autopar import api
from autopar.cli import app
from autopar.units import GiB
from autopar.validate.runner import candidate_plans, _graph_for
from autopar.validate.user_runs import load_user_runs

runner = CliRunner()

RUNS = """\
runs:
  - name: l8b-cp2
    model: llama3-8b
    cluster: dgx-h100
    gpus: 8
    seq_len: 8192
    global_batch: 128
    parallel: {cp: 2, recompute: none, precision: fp8}
    step_time_s: 9.49
    source: lab A
  - name: l70b-4x4
    model: llama3-70b
    cluster: dgx-h100
    gpus: 64
    seq_len: 8192
    global_batch: 128
    parallel: {tp: 4, pp: 4, vpp: 5, dp: 4, recompute: {mode: full}}
    step_time_s: 14.0
    peak_memory_gib: 40.0
    source: lab A
  - name: titan-32k
    model: llama3-8b
    cluster: dgx-h100
    gpus: 8
    seq_len: 32768
    global_batch: 8
    parallel: {framework: torchtitan, recompute: full}
    tokens_per_s_per_gpu: 4000
    source: lab B
  - name: mixtral-ep8
    model: mixtral-8x7b
    cluster: dgx-h100
    gpus: 8
    seq_len: 4096
    global_batch: 64
    parallel: {ep: 8, recompute: full}
    step_time_s: 6.0
    source: lab B
"""

# The same plans as estimate options (what `autopar estimate` defaults the rest to).
PLANS = {
    "l8b-cp2": ("llama3-8b", 8, dict(cp=2, recompute={"mode": "none"}, precision="fp8", zero=1)),
    "l70b-4x4": ("llama3-70b", 64, dict(tp=4, pp=4, vpp=5, recompute={"mode": "full"}, zero=1)),
    "titan-32k": ("llama3-8b", 8, dict(framework="torchtitan", recompute={"mode": "full"}, zero=3)),
    "mixtral-ep8": ("mixtral-8x7b", 8, dict(ep=8, recompute={"mode": "full"}, zero=1)),
}
# Measured tokens/s/GPU by hand: global batch · seq / step time / GPUs, or as given.
MEASURED = {"l8b-cp2": 128 * 8192 / 9.49 / 8, "l70b-4x4": 128 * 8192 / 14.0 / 64, "titan-32k": 4000.0,
            "mixtral-ep8": 64 * 4096 / 6.0 / 8}
SEQ_BATCH = {"l8b-cp2": (8192, 128), "l70b-4x4": (8192, 128), "titan-32k": (32768, 8), "mixtral-ep8": (4096, 64)}


@pytest.fixture()
def runs_file(tmp_path):
    p = tmp_path / "runs.yaml"
    p.write_text(RUNS)
    return p


def _validate(path, *extra):
    r = runner.invoke(app, ["validate", "--runs", str(path), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_each_run_is_predicted_with_its_stated_plan_as_estimate_scores_it(runs_file):
    result = _validate(runs_file)
    rows = {row["run_id"]: row for row in result["rows"]}
    assert list(rows) == list(PLANS) and result["runs_file"] == str(runs_file)
    for name, (model, gpus, fields) in PLANS.items():
        seq, batch = SEQ_BATCH[name]
        plan = api.make_plan(global_batch=batch, seq_len=seq, **fields)
        est = api.estimate_plan(model, "dgx-h100", gpus, plan, memory_margin=0.0)
        row = rows[name]
        assert row["predicted_tokens_per_s_per_gpu"] == pytest.approx(est.tokens_per_s_per_gpu, rel=1e-12)
        assert row["measured_tokens_per_s_per_gpu"] == pytest.approx(MEASURED[name], rel=1e-12)
        assert row["error"] == pytest.approx(est.tokens_per_s_per_gpu / MEASURED[name] - 1.0, rel=1e-9)
        assert row["fits"] == est.fits
    assert rows["l70b-4x4"]["chosen"] == {"mbs": 1, "vpp": 5, "recompute": "full", "tp_comm_overlap": False}
    assert rows["titan-32k"]["framework"] == "torchtitan"


def test_groups_by_source_regime_and_framework(runs_file):
    result = _validate(runs_file)
    assert {k: v["count"] for k, v in result["by_source"].items()} == {"lab A": 2, "lab B": 2}
    assert {k: v["count"] for k, v in result["by_framework"].items()} == {"megatron": 3, "torchtitan": 1}
    regimes = {k: v["count"] for k, v in result["by_regime"].items()}
    assert regimes["long-context>=32k"] == 1 and regimes["moe"] == 1 and regimes["fp8"] == 1
    assert regimes["fsdp-zero3"] == 1  # the torchtitan run: FSDP2 full shard by default
    errors = sorted(abs(row["error"]) for row in result["rows"])
    assert result["summary"]["median"] == pytest.approx((errors[1] + errors[2]) / 2)


def test_memory_error_where_the_run_measured_its_peak(runs_file):
    result = _validate(runs_file)
    mem = result["memory"]
    assert mem["runs"] == 1 and mem["rows"][0]["run_id"] == "l70b-4x4"
    plan = api.make_plan(global_batch=128, seq_len=8192, **PLANS["l70b-4x4"][2])
    est = api.estimate_plan("llama3-70b", "dgx-h100", 64, plan, memory_margin=0.0)
    assert mem["rows"][0]["predicted_gib"] == pytest.approx(est.peak_memory_bytes / GiB)
    assert mem["rows"][0]["error"] == pytest.approx(est.peak_memory_bytes / (40.0 * GiB) - 1.0)


def test_user_runs_have_no_free_setting_and_keep_their_framework(runs_file):
    runs = {r.run_id: r for r in load_user_runs(str(runs_file))}
    titan = runs["titan-32k"]
    assert titan.framework == "torchtitan" and titan.zero_stage == 3 and titan.plan.framework.value == "torchtitan"
    mixtral = runs["mixtral-ep8"]
    assert [p.ep for p in candidate_plans(mixtral, _graph_for(mixtral))] == [8]  # ep stated, not searched
    assert runs["l70b-4x4"].dp == 4 and runs["l8b-cp2"].dp == 4


def test_table_output(runs_file):
    r = runner.invoke(app, ["validate", "--runs", str(runs_file)])
    assert r.exit_code == 0, r.output
    assert "l70b-4x4" in r.output and "source lab B" in r.output and "Peak memory" in r.output


@pytest.mark.parametrize("run, message", [
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0, "
     "tokens_per_s_per_gpu: 9.0}", "exactly one of them"),
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8}", "exactly one of them"),
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0, "
     "parallel: {tp_size: 2}}", "run 1 (user_000): invalid plan"),
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0, "
     "parallel: {tp: 3}}", "run 1 (user_000)"),
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0, "
     "parallel: {tp: 2, dp: 8}}", "drop dp (it is derived)"),
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0, "
     "parallel: {framework: jax}}", "framework 'jax' is not one of"),
    ("{model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0, "
     "parallel: {seq_len: 4096}}", "give each as a key of the run itself"),
    ("{model: nosuch, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0}",
     "unknown model 'nosuch'"),
])
def test_bad_runs_get_one_line_and_exit_2(tmp_path, run, message):
    p = tmp_path / "runs.yaml"
    p.write_text(f"runs:\n  - {run}\n")
    r = runner.invoke(app, ["validate", "--runs", str(p)])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_repeated_names_and_shipped_run_options_are_refused(tmp_path, runs_file):
    p = tmp_path / "twice.yaml"
    run = "{name: a, model: llama3-8b, cluster: dgx-h100, gpus: 8, seq_len: 8192, global_batch: 8, step_time_s: 1.0}"
    p.write_text(f"runs:\n  - {run}\n  - {run}\n")
    r = runner.invoke(app, ["validate", "--runs", str(p)])
    assert r.exit_code == 2 and "run names a repeat" in r.output
    r = runner.invoke(app, ["validate", "--runs", str(runs_file), "--source", "narayanan21"])
    assert r.exit_code == 2 and "--source selects among the shipped runs" in r.output
    r = runner.invoke(app, ["validate", "--runs", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_example_runs_match_the_shipped_validator_on_the_same_runs():
    """examples/measured-runs.yaml restates three shipped torchtitan runs with their whole plan: the
    user-run path must predict exactly what the shipped validator predicts for those runs."""
    from pathlib import Path

    from autopar.validate.report import validate

    example = Path(__file__).parent.parent / "examples" / "measured-runs.yaml"
    mine = {row["measured_tokens_per_s_per_gpu"]: row for row in _validate(example)["rows"]}
    shipped = {row["run_id"]: row for row in validate("all", {"torchtitan-2412"})["rows"]}
    pairs = {"torchtitan2412_llama31_8b_8gpu_fsdp_compile_fp8": 8532.0,
             "torchtitan2412_llama31_8b_8gpu_cp1_seq32k": 3890.0, "torchtitan2412_llama31_8b_8gpu_cp4_seq128k": 1071.0}
    for run_id, measured in pairs.items():
        assert mine[measured]["predicted_tokens_per_s_per_gpu"] == pytest.approx(
            shipped[run_id]["predicted_tokens_per_s_per_gpu"], rel=1e-12)
        assert mine[measured]["predicted_memory_gib"] == pytest.approx(shipped[run_id]["predicted_memory_gib"], rel=1e-12)


def test_calibrating_torchtitan_runs_fits_torchtitans_own_gemm_ceiling(tmp_path):
    """A torchtitan run reads torchtitan's own GEMM ceiling (the cost model's frameworks section),
    never the file's: calibrating such runs must fit that one."""
    from pathlib import Path

    from autopar.cost.params import load_cost_model

    example = Path(__file__).parent.parent / "examples" / "measured-runs.yaml"
    out = tmp_path / "mine.json"
    r = runner.invoke(app, ["calibrate", str(example), "--base", "h100", "--out", str(out), "--iters", "20"])
    assert r.exit_code == 0, r.output
    base, _ = load_cost_model("h100")
    mine, _ = load_cost_model(str(out))
    assert "torchtitan.gemm_max" in mine.provenance.notes
    assert mine.frameworks["torchtitan"].compute["gemm_max"] != base.frameworks["torchtitan"].compute["gemm_max"]
