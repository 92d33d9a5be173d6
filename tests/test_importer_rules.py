"""Importers that check like the framework: --from-megatron applies Megatron-LM's validate_args
(arguments.py, core_v0.14+) in Megatron's words and lists the flags it ignored; --from-deepspeed takes
"auto" batch keys from the command line, refuses CPU offload, and charges no recompute without an
activation_checkpointing section. The Megatron exports of MLA models carry --qk-layernorm and
--no-rope-fusion, and every model field parsed back from an export equals the model's."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.api import load_model
from autopar.errors import InputFileError
from autopar.export import export, megatron_args, plan_from_deepspeed_config, plan_from_megatron_args
from autopar.export.importers import ignored_flags_note, megatron_ignored_flags, model_from_megatron_args
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
from autopar.schema.model import ModelSpec
from autopar.schema.plan import ParallelPlan, Recompute
from autopar.schema.plan_file import PlanFile, PlanTarget
from test_export import ROUND_TRIP, flag, plan_file  # tests/ is on sys.path (rootdir)

HF = Path(__file__).parent / "fixtures" / "hf"

# 40 layers on 4 stages (10 each), a dense model Megatron accepts as it is
BASE = ["--num-layers", "40", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "4096",
        "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "64",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--bf16",
        "--use-distributed-optimizer", "--position-embedding-type", "rope", "--swiglu",
        "--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights"]


def test_the_base_arguments_import():
    plan, model = plan_from_megatron_args(BASE, num_gpus=64)
    assert (plan.tp, plan.pp, plan.vpp, plan.zero) == (2, 4, 1, 1) and model["num_layers"] == 40


@pytest.mark.parametrize("k", ["3", "7", "20"])
def test_layers_per_virtual_stage_must_divide_the_stage_layers(k):
    """Megatron asserts num_layers_per_pipeline_stage % num_layers_per_virtual_pipeline_stage == 0;
    autopar used to score 3 as uneven stages and 7 or 20 as vpp 1."""
    with pytest.raises(InputFileError, match=r"number of layers per pipeline stage must be divisible number of "
                                             rf"layers per virtual pipeline stage' \(10 layers per stage, "
                                             rf"--num-layers-per-virtual-pipeline-stage {k}\)"):
        plan_from_megatron_args(BASE + ["--num-layers-per-virtual-pipeline-stage", k], num_gpus=64)


def test_a_dividing_layers_per_virtual_stage_is_interleaving():
    plan, _ = plan_from_megatron_args(BASE + ["--num-layers-per-virtual-pipeline-stage", "5"], num_gpus=64)
    assert (plan.vpp, plan.layers_per_stage) == (2, None)  # 10 / 5: two chunks of 5 per rank


def test_overlap_param_gather_needs_the_distributed_optimizer():
    args = [a for a in BASE if a != "--use-distributed-optimizer"] + ["--overlap-grad-reduce", "--overlap-param-gather"]
    with pytest.raises(InputFileError, match="Megatron would refuse these arguments: Megatron: '--overlap-param-gather "
                                             "only supported with distributed optimizer or megatron fsdp'"):
        plan_from_megatron_args(args, num_gpus=64)
    with pytest.raises(InputFileError, match="Must use --overlap-param-gather with --overlap-grad-reduce"):
        plan_from_megatron_args(BASE + ["--overlap-param-gather"], num_gpus=64)


def test_an_uneven_first_stage_is_refused_in_megatrons_words():
    """9 first-stage layers leave 31 for 3 ranks: Megatron's own message, not a split the user never wrote."""
    with pytest.raises(InputFileError) as info:
        plan_from_megatron_args(BASE + ["--decoder-first-pipeline-num-layers", "9"], num_gpus=64)
    message = str(info.value)
    assert "number of layers at middle stage: 31 must be divisible by the middle pipeline model parallel size 3" \
        in message
    assert "layers_per_stage" not in message and "(9," not in message
    plan, _ = plan_from_megatron_args(BASE + ["--decoder-first-pipeline-num-layers", "7"], num_gpus=64)
    assert plan.layers_per_stage == (7, 11, 11, 11)


def test_ignored_flags_are_listed_in_one_line():
    """Flags that cost nothing (data, optimizer values, logging, checkpoints) pass quietly; the rest,
    a misspelt degree or a feature autopar does not model, are named once each."""
    args = BASE + ["--lr", "3e-4", "--data-path", "/data/x", "--tensor-model-paralel-size", "8",
                   "--moe-per-layer-logging", "--tensor-model-paralel-size", "4"]
    assert megatron_ignored_flags(args) == ["--tensor-model-paralel-size", "--moe-per-layer-logging"]
    note = ignored_flags_note(args)
    assert note == ("autopar ignored 2 flags it does not model (no effect on the estimate; check the spelling): "
                    "--tensor-model-paralel-size, --moe-per-layer-logging")
    assert ignored_flags_note(BASE + ["--lr", "1e-4", "--save", "/ck", "--log-interval", "1"]) is None
    for name in ROUND_TRIP:  # autopar's own exports import without a note
        assert ignored_flags_note(export(ROUND_TRIP[name](), "megatron")["launch_megatron.sh"]) is None, name


def test_estimate_from_megatron_prints_the_ignored_flags_once():
    from autopar.cli import app

    script = " ".join(["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
                       "--micro-batch-size", "1", "--global-batch-size", "64", "--seq-length", "4096",
                       "--max-position-embeddings", "8192", "--bf16", "--use-distributed-optimizer", "--lr", "3e-4",
                       "--overlap-moe-expert-parallel-comm", "--sequence-paralel"])
    r = CliRunner().invoke(app, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "64", "--from-megatron", script])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "autopar ignored" in ln]
    assert len(lines) == 1 and lines[0].endswith("--overlap-moe-expert-parallel-comm, --sequence-paralel")


def test_mla_without_qk_layernorm_is_refused():
    args = megatron_args(ROUND_TRIP["deepseek-v3 ep32"]())
    assert "--qk-layernorm" in args
    with pytest.raises(InputFileError, match="without --qk-layernorm builds MLA without the q_a/kv_a norms"):
        plan_from_megatron_args([a for a in args if a != "--qk-layernorm"], num_gpus=2048)


def test_the_model_is_inferred_from_the_scripts_flags():
    pf = ROUND_TRIP["llama3-70b tp8 pp4 vpp5"]()
    spec = model_from_megatron_args(megatron_args(pf), name="from-script")
    expected = pf.target.model_spec
    for field in set(ModelSpec.model_fields) - {"name", "source", "seq_length"}:
        assert getattr(spec, field) == getattr(expected, field), field
    with pytest.raises(InputFileError, match="lack --num-layers, --hidden-size"):
        model_from_megatron_args(["--tensor-model-parallel-size", "8"])


# ---- Megatron exports of MLA: the latent norms and RoPE fusion ---------------------------------

def _deepseek_without_yarn() -> PlanFile:
    spec = load_model("deepseek-v3").spec.model_copy(update={"rope_scaling": None, "name": "deepseek-v3-plain-rope"})
    return PlanFile(autopar_version="0.1.0", target=PlanTarget(model="deepseek-v3", model_spec=spec,
                                                               cluster="dgx-h100", gpus=2048),
                    parallel=ParallelPlan(tp=2, pp=8, ep=32, etp=1, global_batch=4096, seq_len=4096))


def test_mla_export_without_yarn_turns_rope_fusion_off():
    pf = _deepseek_without_yarn()
    args = megatron_args(pf)
    assert flag(args, "--rope-type") == "rope" and "--no-rope-fusion" in args and "--qk-layernorm" in args
    assert megatron_violations(args, 2048) == []
    fused = [a for a in args if a != "--no-rope-fusion"]
    assert "Megatron: 'apply_rope_fusion for MLA only works with YARN RoPE.'" in " ".join(
        megatron_violations(fused, 2048))
    args = megatron_args(ROUND_TRIP["deepseek-v3 ep32"]())  # YaRN: fusion allowed, flag not needed
    assert flag(args, "--rope-type") == "yarn" and "--no-rope-fusion" not in args


def test_megatron_core_accepts_mla_with_plain_rope_as_exported():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import MLATransformerConfig

    a = parse_megatron_argv(megatron_args(_deepseek_without_yarn()))
    kw = dict(num_layers=4, hidden_size=a["hidden_size"], num_attention_heads=a["num_attention_heads"],
              multi_latent_attention=True, q_lora_rank=a["q_lora_rank"], kv_lora_rank=a["kv_lora_rank"],
              qk_head_dim=a["qk_head_dim"], qk_pos_emb_head_dim=a["qk_pos_emb_head_dim"], v_head_dim=a["v_head_dim"],
              rope_type=a["rope_type"], qk_layernorm=a["qk_layernorm"])
    config = MLATransformerConfig(**kw, apply_rope_fusion=a["apply_rope_fusion"])
    assert config.qk_layernorm and not config.apply_rope_fusion
    with pytest.raises(ValueError, match="apply_rope_fusion for MLA only works with YARN RoPE"):
        MLATransformerConfig(**kw, apply_rope_fusion=True)


@pytest.mark.parametrize("fixture", ["llama3-8b.json", "llama3.1-8b.json", "mistral-7b.json", "qwen2-7b.json",
                                     "qwen3-8b.json", "mixtral-8x7b.json", "qwen3-30b-a3b.json", "deepseek-v3.json"])
def test_every_model_field_parsed_back_from_the_megatron_export_is_the_configs(fixture):
    spec = load_model(str(HF / fixture)).spec
    gpus = 64
    plan = ParallelPlan(tp=1, global_batch=64, seq_len=4096)
    pf = PlanFile(autopar_version="0.1.0", parallel=plan,
                  target=PlanTarget(model=str(HF / fixture), model_spec=spec, cluster="dgx-h100", gpus=gpus))
    _, fields = plan_from_megatron_args(megatron_args(pf), num_gpus=gpus)
    back = ModelSpec(name=spec.name, source=spec.source, seq_length=spec.seq_length, **fields)
    differ = {f: (getattr(back, f), getattr(spec, f)) for f in set(ModelSpec.model_fields) - {"num_kv_heads"}
              if getattr(back, f) != getattr(spec, f)}
    assert differ == {} and back.kv_heads == spec.kv_heads  # MHA: Megatron has no query groups, HF says heads


# ---- DeepSpeed: "auto", offload, recompute -------------------------------------------------------

HF_TRAINER = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
              "zero_optimization": {"stage": 3, "overlap_comm": True}}


def test_auto_batch_keys_take_the_command_lines():
    with pytest.raises(InputFileError, match=r'leaves train_batch_size and train_micro_batch_size_per_gpu "auto" '
                                             r"\(the Hugging Face Trainer fills them\): give --global-batch and --mbs "
                                             r"on the command line, and --seq-len"):
        plan_from_deepspeed_config(HF_TRAINER, 16, seq_len=4096)
    plan = plan_from_deepspeed_config(HF_TRAINER, 16, seq_len=4096, global_batch=128, mbs=2)
    with pytest.raises(InputFileError, match="sets train_batch_size 64 but --global-batch is 128; drop --global-batch"):
        plan_from_deepspeed_config({**HF_TRAINER, "train_batch_size": 64}, 16, seq_len=4096, global_batch=128, mbs=2)
    assert (plan.global_batch, plan.mbs, plan.zero, plan.num_microbatches(16)) == (128, 2, 3, 4)
    assert plan.recompute == Recompute(mode="none")


def test_estimate_from_an_hf_trainer_config_uses_global_batch(tmp_path):
    import json

    from autopar.cli import app

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(HF_TRAINER))
    r = CliRunner().invoke(app, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "--from-deepspeed", str(path),
                                 "--global-batch", "64", "--mbs", "2", "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    parallel = json.loads(r.stdout)["parallel"]
    assert (parallel["global_batch"], parallel["mbs"], parallel["zero"], parallel["framework"]) == (
        64, 2, 3, "deepspeed")
    r = CliRunner().invoke(app, ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "16", "--from-deepspeed", str(path),
                                 "--global-batch", "64"])
    assert r.exit_code == 2 and "give --mbs on the command line" in r.output


@pytest.mark.parametrize("key,what", [("offload_optimizer", "optimizer states"), ("offload_param", "parameters")])
def test_cpu_offload_is_refused_in_one_line(key, what):
    config = {"train_batch_size": 64, "zero_optimization": {"stage": 3, key: {"device": "cpu", "pin_memory": True}}}
    with pytest.raises(InputFileError, match=rf"zero_optimization.{key} \(device 'cpu'\) keeps the {what} in host "
                                             "memory"):
        plan_from_deepspeed_config(config, 16, seq_len=4096)
    config["zero_optimization"][key] = {"device": "none"}
    assert plan_from_deepspeed_config(config, 16, seq_len=4096).zero == 3


def test_no_checkpointing_section_charges_no_recompute_and_full_is_full():
    plain = {"train_batch_size": 64, "zero_optimization": {"stage": 2}}
    assert plan_from_deepspeed_config(plain, 16, seq_len=4096).recompute == Recompute(mode="none")
    ckpt = {**plain, "activation_checkpointing": {"number_checkpoints": 4}}
    assert plan_from_deepspeed_config(ckpt, 16, seq_len=4096).recompute == Recompute(mode="full", num_layers=4)
    pf = plan_file("llama3-8b", 16, framework="deepspeed", global_batch=64, seq_len=4096, zero=2,
                   recompute=Recompute(mode="none"))
    import json

    assert plan_from_deepspeed_config(json.loads(export(pf, "deepspeed")["ds_config.json"]), 16,
                                      seq_len=4096) == pf.parallel


def test_estimate_from_megatron_without_a_model_uses_the_scripts_flags(tmp_path):
    import json

    from autopar.cli import app

    pf = ROUND_TRIP["llama3-70b tp8 pp4 vpp5"]()
    script = tmp_path / "launch.sh"
    script.write_text(export(pf, "megatron")["launch_megatron.sh"])
    named = CliRunner().invoke(app, ["estimate", "llama3-70b", "-c", "dgx-h100", "-n", "1024", "--from-megatron",
                                     str(script), "--json"])
    inferred = CliRunner().invoke(app, ["estimate", "-c", "dgx-h100", "-n", "1024", "--from-megatron", str(script),
                                        "--json"])
    assert named.exit_code == 0 and inferred.exit_code == 0, inferred.output
    a, b = json.loads(named.stdout), json.loads(inferred.stdout)
    assert b["step_time_s"] == a["step_time_s"] and b["peak_memory_bytes"] == a["peak_memory_bytes"]
    r = CliRunner().invoke(app, ["estimate", "-c", "dgx-h100", "-n", "8", "--global-batch", "8"])
    assert r.exit_code == 2 and "give MODEL" in r.output


@pytest.mark.parametrize("precision", ["fp8", "mxfp8", "nvfp4"])
def test_megatron_import_reads_the_low_precision_recipe_back(precision):
    # An export's --fp8-recipe mxfp8 / --fp4-format e2m1 --fp4-recipe nvfp4 is that precision again,
    # not fp8 or bf16 (megatron/training/arguments.py, core_r0.14+).
    pf = PlanFile(autopar_version="0.1.0",
                  parallel=ParallelPlan(tp=4, pp=2, global_batch=64, seq_len=8192, precision=precision),
                  target=PlanTarget(model="llama3-70b", model_spec=load_model("llama3-70b").spec,
                                    cluster="gb200-nvl72", gpus=64))
    script = next(iter(export(pf, "megatron").values()))
    plan, _ = plan_from_megatron_args(script, 64)
    assert plan.precision == precision
