"""The CLI: JSON contracts, and one-line errors with exit code 2 for every bad input."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
HF = Path(__file__).parent / "fixtures" / "hf"


def run(*args):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr if hasattr(result, "stderr") else ""


def test_inspect_deepseek_json_contract():
    code, out, _ = run("inspect", "deepseek-v3", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["total_params"] == 682_636_472_320  # with the MTP module; 671,026,404,352 without
    assert data["params_by_kind"]["mtp"] == 682_636_472_320 - 671_026_404_352
    assert 37e9 < data["active_params"] < 39e9  # DeepSeek-V3 report: 37B activated (+ MTP)
    assert data["flops_per_token"] > 6 * 37e9


def test_inspect_zero_bytes_for_dp():
    code, out, _ = run("inspect", "llama3-8b", "--json", "--dp", "8", "--framework", "deepspeed")
    z = json.loads(out)["model_state_bytes_per_gpu_by_zero"]
    n = 8_030_261_248
    assert z["0"] == 16 * n and z["3"] == pytest.approx(16 * n / 8)


def test_models_and_clusters_json():
    code, out, _ = run("models", "--json")
    assert code == 0 and {m["name"] for m in json.loads(out)["models"]} >= {"gpt3-175b", "deepseek-v3"}
    code, out, _ = run("clusters", "--json")
    assert code == 0 and "dgx-h100" in {c["name"] for c in json.loads(out)["clusters"]}


ESTIMATE_KEYS = {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                 "hardware_tflops_per_gpu", "mfu", "peak_memory_bytes", "memory_capacity_bytes", "fits",
                 "time_breakdown_s", "memory_breakdown_bytes", "stages"}


def test_estimate_json_contract():
    code, out, _ = run("estimate", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
                       "--global-batch", "128", "--tp", "8", "--pp", "4", "--vpp", "5", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert ESTIMATE_KEYS <= set(data)
    assert set(data["time_breakdown_s"]) == {"compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "dp_comm",
                                             "pp_comm", "bubble", "optimizer"}
    assert len(data["stages"]) == 4 and data["parallel"]["dp"] == 2


def test_estimate_table_output():
    code, out, _ = run("estimate", "gpt3-175b", "-c", "dgx-a100-80gb", "-n", "1024", "-b", "1536", "--tp", "8",
                       "--pp", "16")
    assert code == 0 and "tokens/s/GPU" in out and "bubble" in out


BAD = [
    (("inspect", "llama3-8"), "did you mean llama3-8b"),
    (("inspect", "/nonexistent/config.json"), "does not exist"),
    (("inspect", str(HF / "bert.json")), "not supported"),
    (("inspect", "llama3-8b", "--framework", "jax"), "--framework"),
    (("estimate", "llama3-8b", "-c", "dgx-h10", "-n", "8", "-b", "8"), "dgx-h100"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "12", "-b", "12"), "whole nodes"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--tp", "3"), "does not divide"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "9", "--tp", "8", "--mbs", "2"), "global batch 9"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--vpp", "2"), "vpp 2 needs pp > 1"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--sp"), "sequence parallelism needs tp > 1"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "-b", "16", "--tp", "16"), "tensor parallelism must stay inside it"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--recompute", "some"), "--recompute"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--mbs", "0"), "mbs"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--ep", "2"), "dense"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--zero", "1", "--framework", "torchtitan"),
     "zero 1 is not available in torchtitan"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "0", "-b", "8"), "gpus"),
    (("validate", "--split", "half"), "--split"),
    (("estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--cost-model", "nope"), "unknown cost model"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(args, needle):
    result = runner.invoke(app, list(args))
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text
    assert needle.lower() in text.lower()


def test_malformed_yaml_model(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("num_layers: [\n")
    result = runner.invoke(app, ["inspect", str(bad)])
    assert result.exit_code == 2 and "malformed YAML" in result.output
