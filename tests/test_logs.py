"""Runs from training logs: Megatron-LM (core_v0.14.0, main d98e8a6), torchtitan (v0.2.0, main
b5bcd76) and DeepSpeed (v0.19.5) logs written with those releases' format strings
(tests/fixtures/logs/generate.py); the plan each states, the median step after warm-up worked by
hand, peak memory; validate/calibrate --from-log; and every bad log in one line, exit 2."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.logs import read_log, runs_from_logs
from autopar.logs.common import LogError, warmup_count

runner = CliRunner()
LOGS = Path(__file__).parent / "fixtures" / "logs"
MEG_014 = LOGS / "megatron-core_v0.14.0.log"
MEG_MAIN = LOGS / "megatron-main-d98e8a6.log"
TT_020 = LOGS / "torchtitan-v0.2.0.log"
TT_MAIN = LOGS / "torchtitan-main-b5bcd76.log"
DS = LOGS / "deepspeed-v0.19.5.log"


def test_fixtures_are_what_the_generator_writes(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", LOGS / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert MEG_014.read_text() == gen.megatron_log(micro=False)
    assert TT_MAIN.read_text() == gen.titan_log("main")
    assert DS.read_text() == gen.deepspeed_log()


def test_warmup_rule():
    assert [warmup_count(n) for n in (1, 10, 20, 21, 30, 31, 100)] == [2, 2, 2, 3, 3, 4, 10]


@pytest.mark.parametrize("path, release", [(MEG_014, "core_v0.14.0"), (MEG_MAIN, "main-d98e8a6")])
def test_megatron_logs(path, release):
    (run,), (read,) = runs_from_logs([str(path)], "dgx-h100")
    assert (read["framework"], read["release"], read["model"], read["gpus"]) == ("megatron", release, "llama3-8b", 8)
    # 10 intervals, 2 dropped: median of 15397.6 ... 15404.0 ms = (15400.8 + 15401.5) / 2
    assert (read["step_lines"], read["steps_used"]) == (10, 8)
    assert run.measured_step_time_s == pytest.approx(15.40115)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(128 * 8192 / 15.40115 / 8)
    assert run.measured_memory_gib == pytest.approx(60.0)  # max reserved 61440 MB
    p = run.plan
    assert (p.tp, p.pp, p.cp, p.mbs, p.global_batch, p.seq_len, p.zero, p.framework.value) == (
        2, 1, 1, 1, 128, 8192, 1, "megatron")
    assert run.dp == 4


def test_megatron_dump_gives_the_plan_the_importer_gives_the_script():
    from autopar.export.importers import plan_from_megatron_args

    script = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
              "--group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 "
              "--max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 128 "
              "--tensor-model-parallel-size 2 --swiglu --normalization RMSNorm --position-embedding-type rope "
              "--untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0.0 "
              "--hidden-dropout 0.0 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
              "--sequence-parallel --bf16 --rotary-base 500000")
    expected, _ = plan_from_megatron_args(script.split(), num_gpus=8)
    assert read_log(str(MEG_014)).plan == expected


def test_launcher_prefixes_are_dropped(tmp_path):
    log = tmp_path / "prefixed.log"
    log.write_text("".join(f"[default0]:{line}\n" for line in MEG_014.read_text().splitlines()))
    (run,), _ = runs_from_logs([str(log)], "dgx-h100")
    assert run.measured_step_time_s == pytest.approx(15.40115)


@pytest.mark.parametrize("path, release, gbs, tp, mbs, recompute", [
    (TT_020, "v0.2.0", 8, 2, 2, "selective"), (TT_MAIN, "main-b5bcd76", 16, 1, 1, "none")])
def test_torchtitan_logs(path, release, gbs, tp, mbs, recompute):
    (run,), (read,) = runs_from_logs([str(path)], "dgx-h100")
    assert (read["framework"], read["release"], read["model"], read["gpus"]) == ("torchtitan", release, "llama3-8b", 8)
    assert (read["step_lines"], read["steps_used"]) == (20, 18)
    assert run.measured_tokens_per_s_per_gpu == 7000.0  # tps is per device (metrics.py)
    assert run.measured_step_time_s == pytest.approx(gbs * 8192 / (7000.0 * 8))
    assert run.measured_memory_gib == pytest.approx(62.13)
    p = run.plan
    assert (p.tp, p.global_batch, p.mbs, p.zero, p.recompute.mode.value, p.torch_compile) == (
        tp, gbs, mbs, 3, recompute, True)


def test_deepspeed_log():
    (run,), (read,) = runs_from_logs([str(DS)], "dgx-h100", model="llama3-8b", seq_len=4096)
    assert (read["framework"], read["release"], read["gpus"]) == ("deepspeed", "v0.19.5", 8)
    assert (read["step_lines"], read["steps_used"]) == (10, 8)  # one line per global step, of two ranks' lines
    assert run.measured_step_time_s == pytest.approx(6.4)  # 64 / 10.0 samples/s
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(64 * 4096 / 6.4 / 8)
    assert run.measured_memory_gib == pytest.approx(48.75)  # the larger rank's MaxMemAllocated
    p = run.plan
    assert (p.zero, p.mbs, p.global_batch, p.seq_len, p.framework.value) == (3, 4, 64, 4096, "deepspeed")


def test_validate_from_logs_json():
    r = runner.invoke(app, ["validate", "--from-log", str(MEG_014), "--from-log", str(TT_020), "--cluster",
                            "dgx-h100", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [x["run_id"] for x in d["logs"]] == ["megatron-core_v0.14.0", "torchtitan-v0.2.0"]
    assert "max(2, ceil(10 %))" in d["warmup_rule"]
    assert d["summary"]["count"] == 2
    measured = sorted(row["measured"] if "measured" in row else row["measured_tokens_per_s_per_gpu"]
                      for row in d["rows"])
    assert measured == pytest.approx(sorted([128 * 8192 / 15.40115 / 8, 7000.0]))


def test_validate_from_logs_table():
    r = runner.invoke(app, ["validate", "--from-log", str(DS), "-c", "dgx-h100", "--model", "llama3-8b", "-s", "4096"])
    assert r.exit_code == 0, r.output
    assert "deepspeed v0.19.5, llama3-8b on 8 GPUs, 8 of 10 step lines, median step 6.4 s" in " ".join(r.output.split())


def test_calibrate_from_logs(tmp_path):
    from autopar.cost.params import load_cost_model

    out = tmp_path / "fit.json"
    r = runner.invoke(app, ["calibrate", "--from-log", str(MEG_014), "--from-log", str(TT_020), "--from-log", str(DS),
                            "--model", "llama3-8b", "--seq-len", "4096", "--cluster", "dgx-h100", "--iters", "20",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.count("leave-one-out") == 3
    f, _ = load_cost_model(str(out))
    assert f.fit.runs_fit == 3 and f.provenance.sources[0].startswith("training logs: ")
    assert "(DeepSpeed v0.19.5)" in f.provenance.sources[0]


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _megatron_without(tmp_path, drop_steps=False, keep_steps=None, bad=None):
    lines = MEG_014.read_text().splitlines()
    steps = [i for i, line in enumerate(lines) if " iteration " in line and "| consumed samples:" in line]
    if drop_steps:
        lines = [line for i, line in enumerate(lines) if i not in steps]
    elif keep_steps is not None:
        lines = [line for i, line in enumerate(lines) if i not in steps[keep_steps:]]
    if bad is not None:
        lines[steps[3]] = lines[steps[3]].replace("elapsed time per iteration (ms): ", "elapsed time per iteration: ")
    return _write(tmp_path, "run.log", "\n".join(lines) + "\n"), (steps[3] + 1 if bad is not None else None)


def _one_line_error(r):
    lines = [line for line in r.output.strip().splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    return lines[0]


def test_a_log_of_another_framework_than_the_flag(tmp_path):
    r = runner.invoke(app, ["validate", "--from-log", str(MEG_014), "--framework", "torchtitan", "-c", "dgx-h100"])
    line = _one_line_error(r)
    assert "--framework torchtitan, but" in line and "is a Megatron-LM log (line 2)" in line


def test_a_log_with_no_step_lines(tmp_path):
    path, _ = _megatron_without(tmp_path, drop_steps=True)
    line = _one_line_error(runner.invoke(app, ["validate", "--from-log", path, "-c", "dgx-h100"]))
    assert "has no step lines" in line


def test_a_log_of_warmup_only(tmp_path):
    path, _ = _megatron_without(tmp_path, keep_steps=2)
    line = _one_line_error(runner.invoke(app, ["calibrate", "--from-log", path, "-c", "dgx-h100",
                                               "--out", str(tmp_path / "x.json")]))
    assert "has 2 step line(s), all warm-up" in line and "log at least 3 steps" in line
    assert not (tmp_path / "x.json").exists()


def test_an_unparseable_line_is_named(tmp_path):
    path, number = _megatron_without(tmp_path, bad=True)
    line = _one_line_error(runner.invoke(app, ["validate", "--from-log", path, "-c", "dgx-h100"]))
    assert f"line {number}:" in line and "without 'elapsed time per iteration (ms)" in line


@pytest.mark.parametrize("text, message", [
    ("hello\nworld\n", "is not a Megatron-LM, torchtitan or DeepSpeed training log"),
    ("------------------------ arguments ------------------------\n  num_layers ........ 32\n",
     "has no 'end of arguments' line"),
    ("------------------------ arguments ------------------------\nnot an argument\n",
     "line 2: inside the Megatron-LM argument dump"),
    ("[titan] 2026-11-20 09:00:00,000 - root - INFO - step:  1  loss: 12.0\n", "has no torchtitan config dump"),
])
def test_bad_logs(tmp_path, text, message):
    path = _write(tmp_path, "bad.log", text)
    line = _one_line_error(runner.invoke(app, ["validate", "--from-log", path, "-c", "dgx-h100"]))
    assert message in line


def test_torchtitan_bad_step_line(tmp_path):
    lines = TT_020.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if "tps:" in line and "loss:" in line)
    lines[i] = lines[i].replace("tps:", "tokens:")
    path = _write(tmp_path, "tt.log", "\n".join(lines) + "\n")
    line = _one_line_error(runner.invoke(app, ["validate", "--from-log", path, "-c", "dgx-h100"]))
    assert f"line {i + 1}: a torchtitan step line" in line


@pytest.mark.parametrize("args, message", [
    (["validate", "--from-log", str(MEG_014)], "--from-log needs --cluster"),
    (["validate", "--cluster", "dgx-h100"], "--cluster applies only with --from-log"),
    (["validate", "--from-log", str(MEG_014), "-c", "dgx-h100", "--runs", "x.yaml"], "--runs selects the runs"),
    (["validate", "--from-log", str(DS), "-c", "dgx-h100"], "does not record the sequence length"),
    (["validate", "--from-log", str(DS), "-c", "dgx-h100", "-s", "4096"], "pass --model"),
    (["validate", "--from-log", str(MEG_014), "-c", "dgx-h100", "--model", "llama3-70b"],
     "trains another model than llama3-70b"),
    (["calibrate", "runs.yaml", "--from-log", str(MEG_014), "-c", "dgx-h100"], "give a runs file"),
])
def test_log_option_refusals(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line_error(runner.invoke(app, args))
    assert message in line


def test_log_errors_are_input_errors():
    with pytest.raises(LogError):
        read_log(str(MEG_014), "deepspeed")


def _config_from_torchtitan_export(script: str) -> dict:
    """The config dict torchtitan would log for an exported launch script's PLAN_ARGS (flags
    --section.key-name value, booleans --x / --no-x) and activation-checkpoint subcommand."""
    body = script.split("PLAN_ARGS=(", 1)[1].split("\n)", 1)[0].split()
    config: dict = {}
    i = 0
    while i < len(body):
        flag = body[i]
        i += 1
        if "." not in flag:
            i += 1  # --module / --config and their value
            continue
        section, key = flag[2:].split(".", 1)
        values = []
        while i < len(body) and not body[i].startswith("--"):
            values.append(body[i])
            i += 1
        key = key.replace("-", "_")
        if not values:
            value, key = (False, key[3:]) if key.startswith("no_") else (True, key)
        else:
            value = [v.split(",") for v in values] if key == "module_fqns_per_model_part" else (
                int(values[0]) if values[0].lstrip("-").isdigit() else values[0])
        config.setdefault(section, {})[key] = value
    ac = script.rsplit("activation-checkpoint:", 1)[1].split()[0]
    config["activation_checkpoint"] = {"none": None, "selective": {"force_recompute_mm_shapes_by_fqns": []},
                                       "full": {"preserve_rng_state": True}}[ac]
    return config


@pytest.mark.parametrize("fix, gpus, batch", [("tp=2,pp=2", 16, 64), ("tp=1,pp=1,zero=3", 8, 32),
                                              ("tp=4,pp=1,zero=3,recompute=full", 8, 16)])
def test_torchtitan_config_maps_back_to_the_exported_plan(tmp_path, fix, gpus, batch):
    """plan_fields is the inverse of autopar.export.torchtitan: the config an export sets gives back
    the plan it was exported from."""
    from autopar.logs.torchtitan import plan_fields
    from autopar.schema.plan import ParallelPlan

    out = tmp_path / "run"
    r = runner.invoke(app, ["plan", "llama3-8b", "-c", "dgx-h100", "-n", str(gpus), "-b", str(batch),
                            "--framework", "torchtitan", "--fix", fix, "--export", "torchtitan", "--out", str(out)])
    assert r.exit_code == 0, r.output
    planned = json.loads((out / "plan.json").read_text())["parallel"]
    config = _config_from_torchtitan_export((out / "launch_torchtitan.sh").read_text())
    back = ParallelPlan(**plan_fields(config, gpus))
    for key in ("tp", "pp", "cp", "ep", "vpp", "mbs", "global_batch", "seq_len", "zero"):
        assert getattr(back, key) == planned[key], key
    assert back.recompute.mode.value == (planned["recompute"]["mode"] if isinstance(planned["recompute"], dict)
                                         else planned["recompute"])
