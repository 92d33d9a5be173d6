"""`autopar plan` and `autopar compare` through the CLI: JSON contracts, determinism, errors."""

import json

from typer.testing import CliRunner

from autopar.api import estimate_plan, make_plan
from autopar.cli import app

runner = CliRunner()
PLAN_ARGS = ["plan", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]


def test_plan_json_contract_and_best_matches_estimate():
    r = runner.invoke(app, PLAN_ARGS + ["--json", "--top", "3"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["search"]) >= {"candidates", "feasible", "time_s"}
    assert 1 <= len(data["plans"]) <= 3
    steps = [p["estimate"]["step_time_s"] for p in data["plans"]]
    assert steps == sorted(steps) and all(p["estimate"]["fits"] for p in data["plans"])
    best = data["plans"][0]["parallel"]
    plan = make_plan(**{k: best[k] for k in ("tp", "pp", "cp", "vpp", "mbs", "zero", "global_batch", "seq_len",
                                             "recompute", "layers_per_stage")})
    e = estimate_plan("llama3-8b", "dgx-h100", 16, plan)
    assert e.step_time_s == data["plans"][0]["estimate"]["step_time_s"]


def test_plan_out_is_byte_identical_every_run(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert runner.invoke(app, PLAN_ARGS + ["--out", str(a), "--quiet"]).exit_code == 0
    assert runner.invoke(app, PLAN_ARGS + ["--out", str(b), "--quiet"]).exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["schema_version"] == 1


def test_plan_fix_is_respected():
    r = runner.invoke(app, PLAN_ARGS + ["--json", "--fix", "tp=2,pp=2,mbs=1"])
    assert r.exit_code == 0, r.output
    for p in json.loads(r.output)["plans"]:
        assert (p["parallel"]["tp"], p["parallel"]["pp"], p["parallel"]["mbs"]) == (2, 2, 1)


def test_plan_nothing_fits_exit_2():
    r = runner.invoke(app, ["plan", "llama3.1-405b", "--cluster", "dgx-a100-40gb", "--gpus", "8",
                            "--global-batch", "8", "--seq-len", "8192"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "GiB" in r.output


def test_plan_bad_fix_exit_2():
    for fix, needle in (("tp=abc", "whole number"), ("foo=1", "unknown axis"), ("tp=3", "tp")):
        r = runner.invoke(app, PLAN_ARGS + ["--fix", fix])
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_compare_json_in_input_order(tmp_path):
    out = tmp_path / "best.json"
    assert runner.invoke(app, PLAN_ARGS + ["--out", str(out), "--quiet"]).exit_code == 0
    r = runner.invoke(app, ["compare", str(out), "--plan", "tp=8,pp=1", "--plan", "tp=1,pp=2,recompute=full", "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert len(plans) == 3
    assert (plans[1]["parallel"]["tp"], plans[2]["parallel"]["pp"]) == (8, 2)
    assert plans[2]["parallel"]["recompute"]["mode"] == "full"
    # The searched best is no slower than the hand-written alternatives.
    assert plans[0]["estimate"]["step_time_s"] <= min(p["estimate"]["step_time_s"] for p in plans[1:])


def test_compare_needs_inputs():
    r = runner.invoke(app, ["compare"])
    assert r.exit_code == 2 and "nothing to compare" in r.output
    r = runner.invoke(app, ["compare", "--plan", "tp=8"])
    assert r.exit_code == 2 and "--model" in r.output


def test_compare_missing_plan_file():
    r = runner.invoke(app, ["compare", "/nonexistent/plan.json"])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_compare_names_the_switch_two_plans_differ_in(tmp_path):
    """An eager and a compiled torchtitan plan share their layout; the table says what else differs."""
    args = ["plan", "llama3-8b", "--cluster", "grandteton-h100-96gb", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "16", "--framework", "torchtitan", "--top", "1", "--quiet"]
    compiled, eager = tmp_path / "compiled.json", tmp_path / "eager.json"
    assert runner.invoke(app, args + ["--out", str(compiled)]).exit_code == 0
    data = json.loads(compiled.read_text())
    data["parallel"]["torch_compile"] = False
    eager.write_text(json.dumps(data))
    r = runner.invoke(app, ["compare", str(compiled), str(eager)], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "norms, RoPE, activation" in line)
    assert "compiled" in row and "eager (no torch.compile)" in row  # unset = torchtitan's default: compiled
    assert "grouped GEMM" not in r.output and "precision" not in r.output  # the same in both: no row


def test_estimate_header_names_torchaos_cast_recipe():
    """A torchtitan fp8 plan says which float8 casts it is priced with (torchtitan 0.3: rowwise)."""
    args = ["estimate", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "16", "--framework", "torchtitan", "--zero", "3"]
    r = runner.invoke(app, args + ["--precision", "fp8"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    header = " ".join(r.output.split("\nstep ")[0].split())  # the first line, however the console wraps it
    assert header.endswith("fp8 · torchtitan (torchao rowwise float8 casts)")
    bf16 = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert bf16.exit_code == 0 and "float8" not in bf16.output.split("\nstep ")[0]


def test_torchtitan_selective_reads_as_its_per_op_policy():
    """torchtitan's selective AC is its per-op policy whatever the plan's modules say: the label says so."""
    from autopar.schema.plan import ParallelPlan, Recompute
    rec = Recompute(mode="selective", modules=("core_attn",))
    assert rec.label() == rec.label("megatron") == "selective(core_attn)"
    assert rec.label("torchtitan") == "selective(op)"
    assert Recompute(mode="full", num_layers=4).label("torchtitan") == "full(4)"
    args = ["estimate", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "16", "--framework", "torchtitan", "--zero", "3", "--recompute", "selective"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "recompute selective(op)" in " ".join(r.output.split())
    assert ParallelPlan(global_batch=16, seq_len=8192, framework="torchtitan", zero=3,
                        recompute=rec).recompute.modules == ("core_attn",)  # the plan JSON keeps its fields


def test_recompute_layers_without_full_recompute_is_refused():
    # Megatron reads --recompute-num-layers only under --recompute-granularity full: a layer count
    # with selective (the default) or none used to be dropped silently.
    base = ["estimate", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "2048", "--recompute-layers", "3"]
    for extra in ([], ["--recompute", "none"], ["--recompute", "selective"]):
        result = runner.invoke(app, base + extra)
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1 and "--recompute full" in result.stderr
    ok = runner.invoke(app, base + ["--recompute", "full", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["parallel"]["recompute"]["num_layers"] == 3
