"""Random argument combinations to every command: exit 0 or 2 with a one-line error, never a traceback."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()

models = st.sampled_from(["llama3-8b", "gpt3-175b", "mixtral-8x7b", "deepseek-v3", "nope", "", "/no/such.yaml",
                          "tests/fixtures/hf/bert.json", "examples/custom-decoder.yaml"])
clusters = st.sampled_from(["dgx-h100", "dgx-a100-80gb", "hgx-h800", "dgx-h10", "", "/no/such.yaml"])
ints = st.one_of(st.integers(-3, 20), st.sampled_from([32, 64, 128, 1024, 10**9, 2**62]))
words = st.sampled_from(["none", "selective", "full", "bf16", "fp8", "megatron", "deepspeed", "torchtitan", "x", ""])


def _no_traceback(args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert "Traceback" not in result.output


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(models, clusters, ints, ints, ints, ints, ints, ints, words, words)
def test_estimate_never_tracebacks(model, cluster, gpus, batch, tp, pp, mbs, seq, recompute, precision):
    _no_traceback(["estimate", model, "--cluster", cluster, "--gpus", gpus, "--global-batch", batch, "--tp", tp,
                   "--pp", pp, "--mbs", mbs, "--seq-len", seq, "--recompute", recompute, "--precision", precision])


@FUZZ
@given(models, ints, ints, words)
def test_inspect_never_tracebacks(model, seq, dp, framework):
    _no_traceback(["inspect", model, "--seq-len", seq, "--dp", dp, "--framework", framework])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "nope"]), clusters, st.sampled_from([1, 4, 8, 16, 12, 0, -1]),
       st.sampled_from([1, 8, 64, 7, 0]), st.sampled_from(["", "tp=2", "tp=3,pp=2", "mbs=0", "q=1", "tp=x", "pp=64"]),
       words)
def test_plan_never_tracebacks(model, cluster, gpus, batch, fix, framework):
    args = ["plan", model, "--cluster", cluster, "--gpus", gpus, "--global-batch", batch, "--seq-len", 2048,
            "--framework", framework, "--quiet"]
    if fix:
        args += ["--fix", fix]
    _no_traceback(args)


@FUZZ
@given(st.sampled_from(["tp=8", "tp=2,pp=2", "tp=0", "dp=3", "recompute=maybe", "sp=on", "a=b", ",,", "tp="]),
       ints, ints)
def test_compare_never_tracebacks(plan, gpus, batch):
    _no_traceback(["compare", "--plan", plan, "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", gpus,
                   "--global-batch", batch])


paths = st.sampled_from(["/no/such.json", "tests/fixtures/hf/llama3-8b.json", "tests/fixtures/hf/bert.json",
                         "README.md", "", "examples/custom-decoder.yaml"])


@FUZZ
@given(paths, st.sampled_from(["megatron", "deepspeed", "torchtitan", "jax", ""]))
def test_export_never_tracebacks(path, fmt):
    _no_traceback(["export", path, "--format", fmt])


@FUZZ
@given(st.one_of(st.none(), paths), st.sampled_from(["tp=8,pp=4", "tp=3", "zz=1", "pp=2,vpp=2", ""]),
       st.sampled_from([None, "llama3-70b", "nope"]), st.sampled_from([8, 64, 0]))
def test_explain_never_tracebacks(path, plan, model, gpus):
    args = ["explain"] + ([path] if path else [])
    if plan:
        args += ["--plan", plan]
    if model:
        args += ["--model", model, "--cluster", "dgx-h100", "--gpus", gpus, "--global-batch", 128]
    _no_traceback(args)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["8,16", "8", "x", "0,8", "", "12"]), st.sampled_from(["64", "64,128", "-1", "a"]))
def test_sweep_never_tracebacks(gpus, batch):
    _no_traceback(["sweep", "llama3-8b", "--cluster", "dgx-h100", "--gpus", gpus, "--global-batch", batch,
                   "--seq-len", "2048", "--quiet"])


@FUZZ
@given(st.sampled_from(["holdout", "fit", "all", "x"]), st.sampled_from([[], ["--source", "nope"],
                                                                          ["--source", "narayanan21"]]),
       st.sampled_from([[], ["--cost-model", "nope"], ["--cost-model", "/no/such.json"]]))
def test_validate_never_tracebacks(split, source, cost):
    _no_traceback(["validate", "--split", split, "--summary-only", *source, *cost])


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["builtin", "/no/such.yaml", "README.md"]), st.sampled_from(["a100", "h100", "tpu"]),
       st.sampled_from(["a100", "nope", "/no/such.json"]))
def test_calibrate_never_tracebacks(runs, gpu, base):
    # --iters 1 keeps a real builtin fit short; errors must still be one line.
    _no_traceback(["calibrate", runs, "--gpu", gpu, "--base", base, "--out", "/tmp/autopar-fuzz.json",
                   "--iters", "1", "--rounds", "1"])


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(["cuda", "tpu"]), st.sampled_from(["llama3-8b", "nope"]))
def test_profile_never_tracebacks(device, model):
    _no_traceback(["profile", "--device", device, "--model", model, "--quick", "--out", "/tmp/autopar-fuzz.json",
                   "--quiet"])


# --- numbers at the edges and unwritable outputs (issue 14): exit 0 or 2, and a 2 is one line ---------

edges = st.sampled_from(["0", "-1", str(2**63), str(10**30), "nan", "inf", "-inf", "true", "1.5", "1e3", "", "8"])
unwritable = st.sampled_from(["/proc/autopar-fuzz/x.json", "/dev/full", "/", "/proc/self/status",
                              "/no/such/dir/" + "x" * 300 + ".json", "/proc/version"])


def _one_line_or_ok(args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), (args, result.stderr)
    return result


EDGE = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@EDGE
@given(st.sampled_from(["--gpus", "--global-batch", "--seq-len", "--tp", "--pp", "--cp", "--mbs", "--vpp", "--zero",
                        "--memory-margin", "--recompute-layers", "--etp", "--ep"]), edges)
def test_estimate_edge_numbers(option, value):
    args = {"--gpus": "8", "--global-batch": "8", "--seq-len": "2048"}
    args[option] = value
    _one_line_or_ok(["estimate", "llama3-8b", "--cluster", "dgx-h100",
                     *[x for kv in args.items() for x in kv]])


@EDGE
@given(st.sampled_from(["--gpus", "--global-batch", "--seq-len", "--top", "--max-tp", "--memory-margin"]), edges,
       st.sampled_from(["", "tp=0", f"tp={2**63}", "mbs=-1", "zero=4", "vpp=nan", "tp=true"]))
def test_plan_edge_numbers(option, value, fix):
    args = {"--gpus": "8", "--global-batch": "8", "--seq-len": "2048"}
    args[option] = value
    extra = ["--fix", fix] if fix else []
    _one_line_or_ok(["plan", "llama3-8b", "--cluster", "dgx-h100", "--quiet", *extra,
                     *[x for kv in args.items() for x in kv]])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unwritable, st.booleans())
def test_unwritable_outputs_are_one_line(path, force):
    result = _one_line_or_ok(["plan", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
                              "--seq-len", "2048", "--quiet", "--out", path, *(["--force"] if force else [])])
    assert result.exit_code == 2
    if path == "/proc/version" and not force:
        assert "exists" in result.stderr and "--force" in result.stderr


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unwritable)
def test_unwritable_calibrate_out(path):
    result = _one_line_or_ok(["calibrate", "--derive-as", "x", "--derive-gpus", "X", "--out", path])
    assert result.exit_code == 2
