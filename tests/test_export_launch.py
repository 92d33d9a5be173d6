"""Exports that launch: the DeepSpeed export's training script builds DeepSpeed's engine and trains
on the CPU (a tiny model, gloo, DeepSpeed's CPU accelerator) with the plan's ZeRO stage, recompute,
pipeline, optimizer and LR schedule; its files are found beside the script, not in the working
directory; and a Hugging Face config keeps its name and context length through every export."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import math
import socket
from pathlib import Path

import numpy as np
import pytest

from autopar.export import export
from autopar.export.deepspeed import TRAIN_SCRIPT, optimizer_sections, peak_lr
from autopar.schema.model import ModelSpec
from autopar.schema.plan import ParallelPlan, Recompute
from autopar.schema.plan_file import PlanFile, PlanTarget
from test_export import DS_PLANS, flag, plan_file, run_script  # tests/ is on sys.path (rootdir)

HF = Path(__file__).parent / "fixtures" / "hf"
SEQ = 32
VOCAB = 256


def tiny(tie: bool = False) -> ModelSpec:
    """A Llama-shaped model small enough to train on a CPU in seconds."""
    return ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                     ffn_hidden_size=128, vocab_size=VOCAB, seq_length=SEQ, tie_embeddings=tie)


def tiny_plan(gpus: int = 1, tie: bool = False, **plan) -> PlanFile:
    plan = {"framework": "deepspeed", "global_batch": 2, "mbs": 1, "seq_len": SEQ, **plan}
    return PlanFile(autopar_version="0.1.0", target=PlanTarget(model="tiny.yaml", model_spec=tiny(tie),
                                                               cluster="dgx-h100", gpus=gpus),
                    parallel=ParallelPlan(**plan))


def write_export(pf: PlanFile, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in export(pf, "deepspeed").items():
        (folder / name).write_text(text)
    np.arange(SEQ * 16, dtype=np.uint16).__mod__(VOCAB).astype(np.uint16).tofile(folder / "tokens.bin")
    return folder


def load_script(folder: Path):
    spec = importlib.util.spec_from_file_location("autopar_exported_train_deepspeed", folder / TRAIN_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the files, without DeepSpeed ----------------------------------------------------------------

def test_ds_config_has_the_optimizer_and_schedule_a_megatron_user_expects():
    pf = DS_PLANS["zero3 full"]()
    config = json.loads(export(pf, "deepspeed")["ds_config.json"])
    assert config["optimizer"] == {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-5,
                                                                 "weight_decay": 0.1}}
    assert config["scheduler"] == {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 10000, "warmup_num_steps": 1000, "warmup_type": "linear", "warmup_min_ratio": 0.0,
        "cos_min_ratio": 0.1}}
    assert config["gradient_clipping"] == 1.0
    # Llama 2's peaks: 3e-4 for 7B/13B, 1.5e-4 for 34B/70B; warmup 2000 steps, at most a tenth of the run
    assert (peak_lr(7_000_000_000), peak_lr(70_000_000_000)) == (3e-4, 1.5e-4)
    assert json.loads(export(DS_PLANS["zero2 selective"](), "deepspeed")["ds_config.json"])["optimizer"][
        "params"]["lr"] == 1.5e-4
    assert optimizer_sections(10**9, 100_000)["scheduler"]["params"]["warmup_num_steps"] == 2000
    assert optimizer_sections(10**9, 500)["scheduler"]["params"]["warmup_num_steps"] == 50


def test_launch_script_runs_the_shipped_script_with_paths_beside_it(tmp_path):
    pf = DS_PLANS["pp4 zero1"]()
    files = export(pf, "deepspeed")
    assert set(files) == {"ds_config.json", "launch_deepspeed.sh", "config.json", TRAIN_SCRIPT}
    script = files["launch_deepspeed.sh"]
    assert "MODEL_DIR" not in script and "TRAIN_SCRIPT=" not in script
    for setting in ("DATASET_PATH=", "LR=", "TRAIN_STEPS=", "HOSTFILE="):
        line = next(ln for ln in script.splitlines() if ln.startswith(setting))
        assert "<-- SET" in line, line
    folder = tmp_path / "export"
    folder.mkdir()
    argv = run_script(script, "deepspeed", tmp_path / "run")  # run from another working directory
    here = str(tmp_path / "run")  # run_script writes the script into its own folder
    assert argv[argv.index("--master_port") + 2] == f"{here}/{TRAIN_SCRIPT}"
    assert flag(argv, "--deepspeed_config") == f"{here}/ds_config.json"
    assert flag(argv, "--dataset-path") == "/path/to/tokens.bin" and flag(argv, "--steps") == "10000"
    assert flag(argv, "--lr") == "0.0003" and flag(argv, "--save-dir") == f"{here}/checkpoints"


def test_train_script_carries_the_plan_and_compiles():
    pf = DS_PLANS["zero3 full"]()
    text = export(pf, "deepspeed")[TRAIN_SCRIPT]
    tree = ast.parse(text)
    plan = next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PLAN")
    assert plan == {"seq_len": 8192, "recompute": "full", "recompute_layers": 16, "pp": 1, "steps": 10000,
                    "checkpoint_interval": 1000, "vocab_size": 128256}


def test_the_template_ships_inside_the_package():
    from importlib.resources import files

    assert files("autopar.export").joinpath("templates", TRAIN_SCRIPT).is_file()


# ---- DeepSpeed's engine on the CPU -------------------------------------------------------------

@pytest.fixture
def cpu_world(monkeypatch):
    """One process of a gloo world on DeepSpeed's CPU accelerator. DeepSpeed's CPU backend compiles
    a shared-memory all-reduce kernel at init (a minute of C++ build on two cores); a one-rank world
    never uses it, so it is skipped."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    dist = pytest.importorskip("torch.distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)
    groups = importlib.import_module("deepspeed.utils.groups")  # its process groups outlive a torn-down world
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.strip("_").isupper():
            if value is None or isinstance(value, dict):
                monkeypatch.setattr(groups, name, None if value is None else {})
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def cosine_lr(peak: float, step: int, total: int, warmup: int, floor: float) -> float:
    """DeepSpeed's WarmupCosineLR (lr_schedules.py, 0.19) with linear warmup, at `step` steps taken."""
    last = step - 1
    if last < warmup:
        return peak * last / warmup
    progress = min(1.0, (last - warmup + 1) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * (1 + math.cos(math.pi * progress)) / 2)


@pytest.mark.parametrize("zero,recompute", [(3, Recompute(mode="full", num_layers=1)), (1, Recompute(mode="none"))])
def test_exported_script_builds_the_engine_and_trains(zero, recompute, cpu_world, tmp_path):
    from deepspeed.runtime.engine import DeepSpeedEngine

    pf = tiny_plan(zero=zero, recompute=recompute)
    folder = write_export(pf, tmp_path / "export")
    train = load_script(folder)
    args = train.parse_args(["--dataset-path", str(folder / "tokens.bin"), "--steps", "20",
                             "--save-dir", str(tmp_path / "ck"), "--deepspeed_config", "ds_config.json"])
    assert args.deepspeed_config == str(folder / "ds_config.json")  # beside the script, not the cwd
    engine, loader, scheduler = train.build_engine(args)
    assert isinstance(engine, DeepSpeedEngine) and engine.zero_optimization_stage() == zero
    assert (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()) == (1, 2)
    layers = train.decoder_layers(engine.module)
    assert [layer.gradient_checkpointing for layer in layers] == ([True, False] if recompute.mode == "full"
                                                                  else [False, False])
    loss = train.train(engine, loader, 3, args.save_dir, checkpoint_interval=2)
    assert abs(loss - math.log(VOCAB)) < 1.0  # a randomly initialised model: about ln(vocab)
    # the schedule was set to --steps 20: warmup min(1000, 20 // 10) = 2 steps, cosine to 10% of 3e-4
    assert scheduler.get_lr()[0] == pytest.approx(cosine_lr(3e-4, 3, 20, 2, 0.1))
    assert {"step2", "step3"} <= {p.name for p in (tmp_path / "ck").iterdir()}


def test_exported_pipeline_builds_deepspeeds_pipeline_engine(cpu_world, tmp_path):
    """pp 2 with tied embeddings, run as one stage (a CPU test has one process): the pipeline
    engine over the HF model's embedding, decoder layers and head, the tied weight shared."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    pf = tiny_plan(gpus=2, tie=True, pp=2, zero=1, recompute=Recompute(mode="full"))
    folder = write_export(pf, tmp_path / "export")
    config = json.loads((folder / "ds_config.json").read_text())
    assert config["pipeline"] == {"stages": 2, "activation_checkpoint_interval": 1}
    config["pipeline"]["stages"] = 1  # the one CPU process is the whole pipeline
    config |= {"train_batch_size": 2, "gradient_accumulation_steps": 2}
    (folder / "ds_config.json").write_text(json.dumps(config))
    train = load_script(folder)
    assert train.PLAN["pp"] == 2
    args = train.parse_args(["--dataset-path", str(folder / "tokens.bin"), "--steps", "2",
                             "--save-dir", str(tmp_path / "ck")])
    engine, loader, _ = train.build_engine(args)
    assert isinstance(engine, PipelineEngine)
    module = engine.module
    assert module.activation_checkpoint_interval == 1 and list(module.tied_modules) == ["embed"]
    assert sum(type(layer).__name__ == "_Layer" for layer in module.forward_funcs) == 2
    loss = train.train(engine, loader, 2, args.save_dir, checkpoint_interval=10)
    assert abs(loss - math.log(VOCAB)) < 1.0


# ---- a Hugging Face config keeps its name and context length -----------------------------------

def test_hf_config_keeps_max_position_embeddings_in_every_export():
    from autopar.api import load_model

    spec = load_model(str(HF / "mistral-7b.json")).spec
    assert spec.max_position_embeddings == 32768 and spec.name == "mistral-7b"
    pf = PlanFile(autopar_version="0.1.0", target=PlanTarget(model=str(HF / "mistral-7b.json"), model_spec=spec,
                                                             cluster="dgx-h100", gpus=8),
                  parallel=ParallelPlan(framework="deepspeed", global_batch=64, seq_len=4096, zero=3))
    model = json.loads(export(pf, "deepspeed")["config.json"])
    assert model["max_position_embeddings"] == 32768 and model["_name_or_path"] == "mistral-7b"
    from autopar.export import megatron_args

    args = megatron_args(pf.model_copy(update={"parallel": ParallelPlan(tp=8, global_batch=64, seq_len=4096)}))
    assert flag(args, "--max-position-embeddings") == "32768"


@pytest.mark.parametrize("where,name", [
    ("models--Qwen--Qwen2.5-7B/snapshots/a09a35458c702b33eeacc393d103063234e8bc28/config.json", "Qwen/Qwen2.5-7B"),
    ("Qwen2.5-14B/config.json", "Qwen2.5-14B"),
    ("qwen2.5-0.5b.json", "qwen2.5-0.5b"),
    ("snapshots/5f0b02c75b57c5855da9ae460ce51323ea669d8a/config.json", "Qwen2ForCausalLM"),
])
def test_each_qwen25_size_keeps_its_name(where, name, tmp_path):
    from autopar.model import load_spec

    path = tmp_path / "store" / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((HF / "qwen2-7b.json").read_text())
    assert load_spec(str(path)).name == name
    config = json.loads((HF / "qwen2-7b.json").read_text())
    path.write_text(json.dumps({**config, "_name_or_path": "Qwen/Qwen2.5-7B-Instruct"}))
    assert load_spec(str(path)).name == "Qwen/Qwen2.5-7B-Instruct"  # the config's own name comes first


# ---- torchtitan: data and learning rate marked, a shape it has no flavour for refused with its need ---

def test_torchtitan_marks_the_dataset_and_learning_rate(tmp_path):
    from test_export import titan

    pf = titan("llama3-70b", 64, tp=8, global_batch=64, seq_len=8192, zero=3)
    files = export(pf, "torchtitan")
    script, module = files["launch_torchtitan.sh"], files["autopar_torchtitan.py"]
    assert 'DATASET="${DATASET:-c4}"' in script and "<-- SET" in next(
        ln for ln in script.splitlines() if ln.startswith("DATASET="))
    lr_line = next(ln for ln in module.splitlines() if ln.startswith("LR = "))
    assert lr_line.startswith("LR = 0.00015  # <-- SET")  # Llama 2's 34B/70B peak
    assert "group.optimizer_kwargs['lr'] = LR" in module
    argv = run_script(script, "torchrun", tmp_path)
    assert flag(argv, "--dataloader.dataset") == "c4" and flag(argv, "--dataloader.dataset-path") == "/path/to/dataset"


@pytest.mark.parametrize("framework,zero", [("megatron", 1), ("torchtitan", 2)])
def test_torchtitan_refuses_a_shape_it_has_no_flavour_for_with_what_it_would_need(framework, zero):
    from autopar.errors import ExportError

    pf = plan_file(str(HF / "qwen2-7b.json"), 8, tp=2, global_batch=64, seq_len=4096, framework=framework,
                   zero=zero)
    with pytest.raises(ExportError) as info:
        export(pf, "torchtitan")
    message = str(info.value)
    assert "autopar plan" not in message and "re-plan it" not in message  # a re-plan would refuse the same way
    assert ("torchtitan would need a model_registry flavour with n_layers 28, dim 3584, n_heads 28, n_kv_heads 4, "
            "head_dim 128, hidden_dim 18944, vocab_size 152064") in message
    assert "qkv bias" in message and "\n" not in message


def test_a_pipeline_of_a_gpt2_style_decoder_is_refused_by_the_search_and_the_export():
    """The training script pipelines Llama-family decoders only; the refusal is the framework's, so
    `plan --framework deepspeed` never offers what the export would refuse."""
    from autopar.errors import ExportError
    from autopar.frameworks import plan_refusals

    pf = plan_file("gpt3-175b", 64, framework="deepspeed", pp=2, global_batch=128, seq_len=2048, zero=1)
    reasons = plan_refusals(pf.target.model_spec, 64, pf.parallel)
    assert any("PipelineModule takes a decoder with rotary embeddings" in r for r in reasons)
    with pytest.raises(ExportError, match="set pp 1 or export to megatron"):
        export(pf, "deepspeed")
    llama = plan_file("llama3-8b", 64, framework="deepspeed", pp=2, global_batch=128, seq_len=2048, zero=1)
    assert not plan_refusals(llama.target.model_spec, 64, llama.parallel)
