"""Exporters and importers: the flags and numbers each framework gets, plan -> export -> import
round trips, Megatron's own validation rules refusing bad plans with Megatron's reason, DeepSpeed
batch-key consistency, and refusals of what a framework cannot express. No framework is needed
here; tests/test_export_frameworks.py feeds the same outputs to the real frameworks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from autopar.api import load_model
from autopar.cost.step import stage_layer_counts
from autopar.errors import ExportError, InputFileError
from autopar.export import EXPORT_FORMATS, export, megatron_args, plan_from_deepspeed_config, plan_from_megatron_args
from autopar.export.deepspeed import deepspeed_launch_command, export_deepspeed
from autopar.export.megatron import moe_layer_freq, pipeline_layout
from autopar.export.megatron_rules import (format_layout, megatron_notes, megatron_violations, parse_int_pattern,
                                           parse_layout, parse_megatron_argv)
from autopar.export.torchtitan import torchtitan_args, torchtitan_launch_command
from autopar.schema.model import ModelSpec
from autopar.schema.plan import ParallelPlan, Recompute
from autopar.schema.plan_file import PlanFile, PlanTarget

FIXTURES = Path(__file__).parent / "fixtures" / "export"


def plan_file(model: str, gpus: int, **plan) -> PlanFile:
    spec = load_model(model).spec
    return PlanFile(autopar_version="0.1.0", target=PlanTarget(model=model, model_spec=spec, cluster="dgx-h100",
                                                               gpus=gpus), parallel=ParallelPlan(**plan))


def flag(args: list[str], name: str) -> str:
    """The value after `name` (exactly one occurrence)."""
    assert args.count(name) == 1, f"{name} appears {args.count(name)} times"
    return args[args.index(name) + 1]


# Plans a user of autopar would export (round-trip subjects).
ROUND_TRIP = {
    "llama3-70b tp8 pp4 vpp5": lambda: plan_file("llama3-70b", 1024, tp=8, pp=4, vpp=5, global_batch=1024,
                                                 seq_len=8192),
    "405b tp8 pp16 uneven": lambda: plan_file("llama3.1-405b", 16384, tp=8, pp=16, global_batch=2048, seq_len=8192,
                                              layers_per_stage=(6,) + (8,) * 14 + (8,),
                                              recompute=Recompute(mode="full")),
    "405b default split": lambda: plan_file("llama3.1-405b", 16384, tp=8, pp=16, global_batch=2048, seq_len=8192),
    "deepseek-v3 ep32": lambda: plan_file("deepseek-v3", 2048, tp=2, pp=8, ep=32, etp=1, global_batch=4096,
                                          seq_len=4096, recompute=Recompute(mode="selective",
                                                                            modules=("core_attn", "mla_up_proj"))),
    "deepseek-v3 shared-expert overlap": lambda: plan_file("deepseek-v3", 2048, tp=2, pp=8, ep=32, etp=1,
                                                           global_batch=4096, seq_len=4096,
                                                           moe_shared_expert_overlap=True),
    "deepseek-v3 deepep": lambda: plan_file("deepseek-v3", 2048, tp=2, pp=8, ep=64, etp=1, global_batch=4096,
                                            seq_len=4096, moe_dispatcher="flex"),
    "llama3-8b cp4 a2a": lambda: plan_file("llama3-8b", 64, tp=2, cp=4, cp_comm_type="a2a", global_batch=64,
                                           seq_len=131072, recompute=Recompute(mode="full")),
    "llama3-70b full K": lambda: plan_file("llama3-70b", 512, tp=8, pp=8, global_batch=512, seq_len=8192,
                                           recompute=Recompute(mode="full", num_layers=4)),
    "llama3-8b fp8 hybrid shard": lambda: plan_file("llama3-8b", 64, tp=4, global_batch=256, seq_len=8192,
                                                    precision="fp8", zero_shard_size=4, tp_comm_overlap=True,
                                                    recompute=Recompute(mode="none")),
    "mixtral capacity": lambda: plan_file("mixtral-8x7b", 64, tp=2, pp=2, cp=2, cp_comm_type="allgather", ep=8,
                                          global_batch=256, seq_len=4096,
                                          moe_dispatcher="allgather", moe_capacity_factor=1.5,
                                          overlap_param_gather=False),
    "qwen3 moe": lambda: plan_file("qwen3-30b-a3b", 32, tp=4, ep=8, etp=1, global_batch=64, seq_len=4096),
    "mixtral padded to capacity, flash attention": lambda: plan_file(
        "mixtral-8x7b", 64, tp=2, ep=8, global_batch=256, seq_len=4096, moe_capacity_factor=1.0,
        moe_pad_to_capacity=True, attention_backend="flash"),
    "qwen3 moe sequential experts": lambda: plan_file("qwen3-30b-a3b", 32, tp=4, ep=8, etp=1, global_batch=64,
                                                      seq_len=4096, moe_grouped_gemm=False),
    "megatron-fsdp zero3": lambda: plan_file("llama3-70b", 256, tp=4, pp=2, global_batch=256, seq_len=8192, zero=3),
    "megatron-fsdp zero2 hsdp": lambda: plan_file("mixtral-8x7b", 64, tp=2, ep=4, global_batch=128, seq_len=4096,
                                                  zero=2, zero_shard_size=8),
    "gpt3 zero0": lambda: plan_file("gpt3-175b", 1024, tp=8, pp=16, vpp=3, global_batch=1536, seq_len=2048, zero=0,
                                    overlap_param_gather=False),
}


# ---- Megatron: flags -------------------------------------------------------------------------

def test_megatron_dense_interleaved_flags():
    args = megatron_args(ROUND_TRIP["llama3-70b tp8 pp4 vpp5"]())
    assert flag(args, "--tensor-model-parallel-size") == "8"
    assert flag(args, "--pipeline-model-parallel-size") == "4"
    assert flag(args, "--num-virtual-stages-per-pipeline-rank") == "5"  # 80 layers = 4·5·4, even: no layout
    assert "--pipeline-model-parallel-layout" not in args
    assert flag(args, "--num-query-groups") == "8" and "--group-query-attention" in args
    assert flag(args, "--ffn-hidden-size") == "28672" and "--swiglu" in args
    assert flag(args, "--normalization") == "RMSNorm" and flag(args, "--position-embedding-type") == "rope"
    assert "--untie-embeddings-and-output-weights" in args and "--disable-bias-linear" in args
    assert {"--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
            "--overlap-param-gather", "--bf16"} <= set(args)
    assert flag(args, "--recompute-granularity") == "selective" and flag(args, "--recompute-modules") == "core_attn"
    assert flag(args, "--micro-batch-size") == "1" and flag(args, "--global-batch-size") == "1024"
    assert flag(args, "--seq-length") == "8192" and "--num-experts" not in args


def test_megatron_uneven_layout_is_exact():
    pf = ROUND_TRIP["405b tp8 pp16 uneven"]()
    layout = flag(megatron_args(pf), "--pipeline-model-parallel-layout")
    assert layout == "Et*6|(t*8|)*14t*8L"
    stages = parse_layout(layout)
    assert [s.count("t") for s in stages] == [6] + [8] * 14 + [8]
    assert stages[0].startswith("E") and stages[-1].endswith("L")


def test_megatron_default_uneven_split_uses_a_layout_with_mtp_before_loss():
    pf = ROUND_TRIP["deepseek-v3 ep32"]()
    args = megatron_args(pf)
    stages = parse_layout(flag(args, "--pipeline-model-parallel-layout"))
    assert tuple(s.count("t") for s in stages) == stage_layer_counts(61, 8)  # 61 over 8: 7 and 8 layers
    assert stages[-1].endswith("mL") and "".join(stages).count("m") == 1
    assert flag(args, "--mtp-num-layers") == "1"


def test_megatron_moe_and_mla_flags():
    pf = ROUND_TRIP["deepseek-v3 ep32"]()
    args, spec = megatron_args(pf), pf.target.model_spec
    assert flag(args, "--num-experts") == "256" and flag(args, "--moe-router-topk") == "8"
    assert flag(args, "--moe-ffn-hidden-size") == "2048"
    assert flag(args, "--moe-shared-expert-intermediate-size") == "2048"
    assert flag(args, "--expert-model-parallel-size") == "32" and flag(args, "--expert-tensor-parallel-size") == "1"
    pattern = parse_int_pattern(flag(args, "--moe-layer-freq"))
    assert pattern == [int(spec.is_moe_layer(i)) for i in range(61)] and pattern[:4] == [0, 0, 0, 1]
    assert "--multi-latent-attention" in args
    assert [flag(args, f) for f in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
                                    "--v-head-dim")] == ["1536", "512", "128", "64", "128"]
    assert flag(args, "--moe-token-dispatcher-type") == "alltoall"


@pytest.mark.parametrize("first_k,freq,layers", [(0, 1, 8), (0, 2, 8), (3, 1, 61), (2, 3, 12), (1, 2, 10)])
def test_moe_layer_freq_matches_the_spec(first_k, freq, layers):
    spec = ModelSpec(name="m", num_layers=layers, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
                     vocab_size=1000, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128,
                                           "first_k_dense": first_k, "layer_freq": freq})
    text = moe_layer_freq(spec.moe, layers)
    expected = [int(spec.is_moe_layer(i)) for i in range(layers)]
    if first_k == 0:  # Megatron's int form: layer i is MoE when i % freq == 0
        assert [int(i % int(text) == 0) for i in range(layers)] == expected
    else:
        assert parse_int_pattern(text) == expected


def test_megatron_recompute_cp_fp8_and_shard_flags():
    args = megatron_args(ROUND_TRIP["llama3-70b full K"]())
    assert [flag(args, f) for f in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers")] == \
        ["full", "block", "4"]
    args = megatron_args(ROUND_TRIP["llama3-8b cp4 a2a"]())
    assert flag(args, "--context-parallel-size") == "4" and flag(args, "--cp-comm-type") == "a2a"
    assert [flag(args, f) for f in ("--recompute-method", "--recompute-num-layers")] == ["uniform", "1"]
    args = megatron_args(ROUND_TRIP["llama3-8b fp8 hybrid shard"]())
    assert flag(args, "--fp8-format") == "hybrid" and "--bf16" in args and "--tp-comm-overlap" in args
    assert flag(args, "--num-distributed-optimizer-instances") == "4"  # dp 16 / shard 4
    assert "--recompute-granularity" not in args
    assert "--moe-grouped-gemm" in megatron_args(ROUND_TRIP["qwen3 moe"]())
    assert "--moe-grouped-gemm" not in megatron_args(ROUND_TRIP["qwen3 moe sequential experts"]())
    args = megatron_args(ROUND_TRIP["mixtral capacity"]())
    assert flag(args, "--moe-token-dispatcher-type") == "allgather"
    assert flag(args, "--moe-expert-capacity-factor") == "1.5"
    assert flag(args, "--cp-comm-type") == "all_gather"  # Transformer Engine's spelling


def test_megatron_gpt_biases_learned_positions_and_tied_embeddings():
    args = megatron_args(ROUND_TRIP["gpt3 zero0"]())
    assert "--disable-bias-linear" not in args and "--untie-embeddings-and-output-weights" not in args
    assert flag(args, "--position-embedding-type") == "learned_absolute"
    assert flag(args, "--normalization") == "LayerNorm" and "--swiglu" not in args
    assert flag(args, "--attention-dropout") == "0.1" and flag(args, "--max-position-embeddings") == "2048"
    assert "--use-distributed-optimizer" not in args and "--overlap-param-gather" not in args


def test_megatron_script_has_marked_paths_cluster_env_and_runs_pretrain():
    text = export(ROUND_TRIP["llama3-70b tp8 pp4 vpp5"](), "megatron")["launch_megatron.sh"]
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    for var in ("DATA_PATH", "TOKENIZER_MODEL", "CHECKPOINT_PATH", "MEGATRON_LM_DIR"):
        assert f'{var}="${{{var}:-' in text and "<-- SET" in text
    for var, default in (("GPUS_PER_NODE", "8"), ("NNODES", "128"), ("NODE_RANK", "0"),
                         ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "6000")):
        assert f'{var}="${{{var}:-{default}}}"' in text
    assert "-ne 1024" in text and "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert '"$MEGATRON_LM_DIR/pretrain_gpt.py"' in text and "torchrun --nproc_per_node" in text


# ---- Megatron: round trips -------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_megatron_round_trip(name, tmp_path):
    pf = ROUND_TRIP[name]()
    script = export(pf, "megatron")["launch_megatron.sh"]
    path = tmp_path / "launch.sh"
    path.write_text(script)
    for source in (path, str(path), script, megatron_args(pf), " ".join(megatron_args(pf))):
        plan, _ = plan_from_megatron_args(source, num_gpus=pf.target.gpus)
        assert plan == pf.parallel
    plan, model = plan_from_megatron_args(path)  # GPU count from the script's GPUS_PER_NODE x NNODES
    assert plan == pf.parallel
    spec = pf.target.model_spec
    back = ModelSpec(name=spec.name, source=spec.source, seq_length=spec.seq_length,
                     **{**model, "max_position_embeddings": spec.max_position_embeddings})
    assert back == spec
    assert model["max_position_embeddings"] >= pf.parallel.seq_len


def test_import_handwritten_script():
    plan, model = plan_from_megatron_args(FIXTURES / "handwritten_megatron.sh")
    assert (plan.tp, plan.pp, plan.vpp, plan.mbs, plan.global_batch, plan.seq_len) == (4, 4, 1, 2, 512, 4096)
    assert plan.layers_per_stage == (6, 9, 9, 6)  # --decoder-first/last-pipeline-num-layers 6, middle 18 / 2
    assert plan.recompute == Recompute(mode="selective") and plan.zero == 1 and plan.sp is None
    assert plan.overlap_grad_reduce and not plan.overlap_param_gather
    assert model["num_layers"] == 30 and model["ffn_hidden_size"] == 16384  # Megatron's default 4h
    assert model["position_embedding"] == "learned" and model["dropout"]  # Megatron defaults: 0.1 dropout


def test_import_refuses_what_autopar_cannot_model():
    base = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
            "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size", "8"]
    for extra, needle in ((["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "2"], "no autopar form"),
                          (["--num-experts", "4", "--moe-layer-freq", "[1,0,0,1,1,0,0,1]"], "not 'k dense layers"),
                          (["--cp-comm-type", "a2a+p2p"], "--cp-comm-type"),
                          (["--use-megatron-fsdp"], "--use-megatron-fsdp"),
                          (["--position-embedding-type", "relative"], "relative")):
        with pytest.raises(InputFileError, match=needle.replace("+", r"\+")):
            plan_from_megatron_args(base + extra, num_gpus=8)
    with pytest.raises(InputFileError, match="--seq-length"):
        plan_from_megatron_args(base[:6] + ["--micro-batch-size", "1", "--global-batch-size", "8"], num_gpus=8)


def test_import_recompute_activations_and_defaults():
    plan, _ = plan_from_megatron_args("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                                      "--max-position-embeddings 128 --micro-batch-size 2 --recompute-activations",
                                      num_gpus=8)
    assert plan.recompute.mode == "selective" and plan.global_batch == 16  # Megatron: mbs · dp when absent
    assert plan.zero == 0 and not plan.overlap_grad_reduce


# ---- Megatron: validate_args rules ------------------------------------------------------------

VALID = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention",
         "--num-query-groups", "8", "--seq-length", "4096", "--max-position-embeddings", "4096",
         "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "4", "--sequence-parallel",
         "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16", "--use-distributed-optimizer",
         "--overlap-grad-reduce", "--overlap-param-gather", "--position-embedding-type", "rope"]


def with_args(base: list[str], **changes: str | None) -> list[str]:
    """`base` with --flag values replaced (None removes the flag; '' makes it a switch)."""
    out, skip = [], False
    names = {"--" + k.replace("_", "-"): v for k, v in changes.items()}
    for i, a in enumerate(base):
        if skip:
            skip = False
            continue
        if a in names:
            skip = i + 1 < len(base) and not base[i + 1].startswith("--")
            continue
        out.append(a)
    for name, value in names.items():
        if value is not None:
            out += [name] + ([value] if value else [])
    return out


def test_valid_arguments_pass_every_rule():
    assert megatron_violations(VALID, 64) == []
    assert megatron_violations(VALID + ["--num-virtual-stages-per-pipeline-rank", "2"], 64) == []


@pytest.mark.parametrize("changes,world,reason", [
    ({}, 40, "world size (40) is not divisible by total_model_size (16)"),
    ({"overlap_grad_reduce": None}, 64, "Must use --overlap-param-gather with --overlap-grad-reduce"),
    ({"use_distributed_optimizer": None}, 64, "--overlap-param-gather only supported with distributed optimizer"),
    ({"tensor_model_parallel_size": "1", "tp_comm_overlap": ""}, 16,
     "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"),
    ({"context_parallel_size": "3", "seq_length": "4100", "max_position_embeddings": "4100"}, 48,
     "seq-length should be a multiple of 2 * context-parallel-size"),
    ({"max_position_embeddings": "2048"}, 64, "max_position_embeddings (2048) must be greater than or equal"),
    ({"num_layers": "30"}, 64, "Number of layers should be divisible by the pipeline-model-parallel size"),
    ({"num_virtual_stages_per_pipeline_rank": "3"}, 64,
     "num_layers_per_pipeline_rank 8 should be divisible by vp_size 3"),
    ({"num_virtual_stages_per_pipeline_rank": "2", "global_batch_size": "8"}, 64, "multiple of pp 4"),
    ({"global_batch_size": "6"}, 64, "global batch size (6) is not divisible by micro batch size (1) times data"),
    ({"recompute_granularity": "selective", "recompute_method": "block"}, 64,
     "recompute method is not yet supported for selective recomputing granularity"),
    ({"recompute_granularity": "full", "recompute_num_layers": "2"}, 64,
     "Using recompute_granularity: full so recompute_method must be"),
    ({"recompute_granularity": "full", "recompute_method": "block"}, 64, "recompute_num_layers must be between 1"),
    ({"recompute_granularity": "selective", "recompute_modules": "moe_act"}, 64,
     "moe_act in recompute_modules is only supported with moe_grouped_gemm"),
    ({"recompute_granularity": "selective", "recompute_modules": "mla_up_proj"}, 64,
     "mla_up_proj in recompute_modules is only supported with multi_latent_attention"),
    ({"num_experts": "6", "expert_model_parallel_size": "4", "disable_bias_linear": ""}, 64,
     "Number of experts should be a multiple of expert model parallel_size"),
    ({"expert_model_parallel_size": "2"}, 64, "num_experts must be non None to use expert model parallelism"),
    ({"num_experts": "8", "moe_router_topk": "1", "disable_bias_linear": ""}, 64,
     "Please use --moe-router-pre-softmax when topk is 1."),
    ({"num_experts": "8"}, 64, "Bias in Moe is only supported when ETP==1"),
    ({"num_query_groups": "3"}, 64, "num_query_groups (3) must be a multiple or divisor"),
    ({"tensor_model_parallel_size": "3"}, 48,
     "num_attention_heads (32) must be a multiple of tensor_model_parallel_size"),
    ({"mtp_num_layers": "1", "position_embedding_type": "learned_absolute"}, 64,
     "Multi-Token Prediction (MTP) is not supported with learned_absolute"),
    ({"pipeline_model_parallel_layout": "Et*8|t*8|t*8|t*7L"}, 64,
     "Number of decoder layers 31 must match num_layers 32"),
    ({"pipeline_model_parallel_layout": "Et*8|t*8|t*8|t*8"}, 64, "The last layer must be loss"),
    ({"pipeline_model_parallel_layout": "Et*8|t*8|t*16L"}, 64, "must be divisible by pipeline_model_parallel_size"),
    ({"pipeline_model_parallel_layout": "Et*8|t*8|x*8|t*8L"}, 64, "invalid layer character 'x'"),
    ({"pipeline_model_parallel_layout": "Et*8|t*8|t*8|t*8L", "num_virtual_stages_per_pipeline_rank": "2"}, 64,
     "No more than one of the following arguments can be set at the same time"),
    ({"pipeline_model_parallel_layout": "Et*4|t*4|t*4|t*4m|t*4|t*4|t*4|t*4L", "mtp_num_layers": "1"}, 64,
     "MTP should be always in the last virtual pipeline stage"),
    ({"num_virtual_stages_per_pipeline_rank": "2", "pipeline_model_parallel_size": "2",
      "no_overlap_p2p_communication": ""}, 32, "pipeline-model-parallel size should be greater than 2"),
])
def test_megatron_rules_refuse_with_megatrons_reason(changes, world, reason):
    problems = megatron_violations(with_args(VALID, **changes), world)
    assert any(reason in p for p in problems), problems


def test_megatron_notes_dropped_sequence_parallelism():
    args = with_args(VALID, tensor_model_parallel_size="1")
    assert megatron_violations(args, 16) == []
    assert any("disables --sequence-parallel" in n for n in megatron_notes(args))


def test_parse_argv_forms_and_unknown_flags():
    a = parse_megatron_argv(["--lr", "3e-4", "--tensor-model-parallel-size=8", "--data-path", "0.5", "a", "0.5", "b",
                             "--recompute-modules", "core_attn", "mlp", "--swiglu"])
    assert a["tensor_model_parallel_size"] == 8 and a["recompute_modules"] == ["core_attn", "mlp"] and a["swiglu"]
    assert a["given"] == {"tensor_model_parallel_size", "recompute_modules", "swiglu"}
    with pytest.raises(InputFileError, match="--micro-batch-size"):
        parse_megatron_argv(["--micro-batch-size", "two"])


@pytest.mark.parametrize("stages", [["Et", "tt", "tt", "tmL"], ["E" + "t" * 7] + ["t" * 8] * 14 + ["t" * 7 + "L"],
                                    ["E", "", "", "tL"], ["Ettt", "tttL"], ["EtL"]])
def test_layout_format_parse_inverse(stages):
    assert parse_layout(format_layout(stages)) == stages


def test_pipeline_layout_places_embedding_mtp_and_loss():
    assert parse_layout(pipeline_layout((3, 4, 4, 2), 1)) == ["Ettt", "tttt", "tttt", "ttmL"]


def test_export_refuses_plans_megatron_rejects():
    pf = plan_file("llama3-8b", 8, global_batch=8, seq_len=4096, zero=0, overlap_param_gather=True)
    with pytest.raises(ExportError, match="--overlap-param-gather only supported with distributed optimizer"):
        export(pf, "megatron")
    pf = plan_file("gpt3-175b", 64, tp=8, pp=8, global_batch=64, seq_len=4096)  # learned table of 2048
    with pytest.raises(ExportError, match=r"max_position_embeddings \(2048\) must be greater than or equal"):
        export(pf, "megatron")
    spec = load_model("llama3-8b").spec.model_copy(update={"mlp_bias": True})
    pf = PlanFile(autopar_version="0.1.0", target=PlanTarget(model="x", model_spec=spec, cluster="dgx-h100", gpus=8),
                  parallel=ParallelPlan(global_batch=8, seq_len=4096))
    with pytest.raises(ExportError, match="--disable-bias-linear"):
        export(pf, "megatron")
    with pytest.raises(ExportError, match="zero 1 is not available in torchtitan"):
        export(plan_file("llama3-8b", 8, global_batch=8, seq_len=4096, zero=1), "torchtitan")


def test_unknown_format_lists_the_formats():
    assert EXPORT_FORMATS == ("megatron", "deepspeed", "torchtitan")
    with pytest.raises(ExportError, match="megatron, deepspeed, torchtitan"):
        export(ROUND_TRIP["llama3-70b tp8 pp4 vpp5"](), "nemo")


# ---- DeepSpeed -------------------------------------------------------------------------------

DS_PLANS = {
    "zero3 full": lambda: plan_file("llama3-8b", 64, global_batch=512, mbs=2, seq_len=8192, zero=3,
                                    framework="deepspeed", recompute=Recompute(mode="full", num_layers=16)),
    "pp4 zero1": lambda: plan_file("llama3-8b", 64, pp=4, global_batch=256, seq_len=4096, zero=1,
                                   framework="deepspeed", recompute=Recompute(mode="full")),
    "zero2 selective": lambda: plan_file("llama3-70b", 128, global_batch=1024, mbs=1, seq_len=4096, zero=2,
                                         framework="deepspeed"),
    "zero0": lambda: plan_file("llama3-8b", 8, global_batch=64, mbs=4, seq_len=2048, zero=0, framework="deepspeed",
                               overlap_grad_reduce=False),
    "zero3 no prefetch": lambda: plan_file("llama3-8b", 32, global_batch=96, mbs=3, seq_len=2048, zero=3,
                                           framework="deepspeed", overlap_param_gather=False),
}


@pytest.mark.parametrize("name", list(DS_PLANS))
def test_deepspeed_batch_keys_are_consistent(name):
    pf = DS_PLANS[name]()
    c, plan = export_deepspeed(pf), pf.parallel
    dp = pf.target.gpus // plan.pp
    assert c["train_batch_size"] == plan.global_batch
    assert c["train_micro_batch_size_per_gpu"] == plan.mbs
    assert c["train_batch_size"] == c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"] * dp
    assert c["zero_optimization"]["stage"] == plan.zero and c["bf16"] == {"enabled": True}
    assert c["zero_optimization"]["overlap_comm"] == plan.overlap_grad_reduce


@pytest.mark.parametrize("name", list(DS_PLANS))
def test_deepspeed_round_trip(name, tmp_path):
    pf = DS_PLANS[name]()
    files = export(pf, "deepspeed")
    assert set(files) == {"ds_config.json", "launch_deepspeed.sh", "config.json",  # config.json: the model
                          "train_deepspeed.py"}  # the training script (tests/test_export_launch.py runs it)
    path = tmp_path / "ds_config.json"
    path.write_text(files["ds_config.json"])
    # selective core_attn is exported as no checkpointing (SDPA keeps no scores), which reads back as none:
    # the Hugging Face model recomputes nothing
    plan = pf.parallel
    expected = plan.model_copy(update={"recompute": Recompute(mode="none")}) if plan.recompute.mode == "selective" \
        else plan
    for source in (path, json.loads(files["ds_config.json"])):
        assert plan_from_deepspeed_config(source, pf.target.gpus, seq_len=pf.parallel.seq_len) == expected


def test_deepspeed_sections():
    c = export_deepspeed(DS_PLANS["zero3 full"]())
    h = 4096
    assert c["zero_optimization"]["reduce_bucket_size"] == h * h
    assert c["zero_optimization"]["stage3_prefetch_bucket_size"] == int(0.9 * h * h)
    assert c["zero_optimization"]["stage3_param_persistence_threshold"] == 10 * h
    assert c["activation_checkpointing"]["number_checkpoints"] == 16 and "pipeline" not in c
    c = export_deepspeed(DS_PLANS["pp4 zero1"]())
    assert c["pipeline"] == {"stages": 4, "activation_checkpoint_interval": 1}
    assert c["gradient_accumulation_steps"] == 16  # 256 / (1 · 16 dp)
    c = export_deepspeed(DS_PLANS["zero2 selective"]())
    assert "activation_checkpointing" not in c and c["zero_optimization"]["allgather_bucket_size"] == 500_000_000
    assert export_deepspeed(DS_PLANS["zero3 no prefetch"]())["zero_optimization"]["stage3_prefetch_bucket_size"] == 0


def test_deepspeed_launch_command():
    pf = DS_PLANS["pp4 zero1"]()
    cmd = deepspeed_launch_command(pf)
    assert cmd.startswith("deepspeed ") and '--num_nodes "${NNODES:-8}"' in cmd and '"${GPUS_PER_NODE:-8}"' in cmd
    assert '--deepspeed_config "$HERE/ds_config.json"' in cmd and '"$HERE/train_deepspeed.py"' in cmd
    script = export(pf, "deepspeed")["launch_deepspeed.sh"]
    assert cmd in script and "pipeline of 4 stages" in script and "sequences of 4096 tokens" in script


@pytest.mark.parametrize("plan,reason", [
    (dict(tp=2, global_batch=32, seq_len=2048, zero=1), "no tensor, context or expert parallelism"),
    (dict(global_batch=32, seq_len=2048, zero=1, precision="fp8"), "fp8"),
    (dict(global_batch=32, seq_len=2048, zero=3, zero_shard_size=4), "removed MiCS"),
    (dict(pp=2, global_batch=32, seq_len=2048, zero=2), "pipeline parallelism works only with zero 0 or 1"),
    (dict(pp=2, vpp=2, global_batch=32, seq_len=2048, zero=1), "interleaved pipeline"),
    (dict(cp=2, global_batch=32, seq_len=2048, zero=1), "has no context parallelism; use megatron or set cp to 1"),
    (dict(global_batch=32, seq_len=2048, zero=1, recompute=Recompute(mode="selective", modules=("mlp",))),
     "selective recompute of mlp"),
    (dict(pp=2, global_batch=32, seq_len=2048, zero=1, recompute=Recompute(mode="full", num_layers=2)),
     "activation_checkpoint_interval"),
    (dict(pp=2, global_batch=32, seq_len=2048, zero=1, layers_per_stage=(15, 17)),
     "partitions the decoder layers evenly"),
])
def test_deepspeed_refusals(plan, reason):
    with pytest.raises(ExportError, match=reason):
        export(plan_file("llama3-8b", 32, framework="deepspeed", **plan), "deepspeed")


def test_deepspeed_import_fills_and_checks_batch_keys():
    plan = plan_from_deepspeed_config(FIXTURES / "handwritten_ds_config.json", 16, seq_len=4096)
    assert (plan.mbs, plan.global_batch, plan.zero, plan.pp) == (4, 4 * 8 * 16, 2, 1)
    assert plan.overlap_grad_reduce and plan.recompute == Recompute(mode="none")  # no checkpointing section
    with pytest.raises(InputFileError, match="inconsistent"):
        plan_from_deepspeed_config({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 4,
                                    "gradient_accumulation_steps": 2}, 16, seq_len=4096)
    with pytest.raises(InputFileError, match="fp16"):
        plan_from_deepspeed_config({"train_batch_size": 64, "fp16": {"enabled": True}}, 16, seq_len=4096)
    with pytest.raises(InputFileError, match="does not exist"):
        plan_from_deepspeed_config(FIXTURES / "missing.json", 16, seq_len=4096)


# ---- torchtitan ------------------------------------------------------------------------------

def titan(model: str, gpus: int, **plan) -> PlanFile:
    return plan_file(model, gpus, framework="torchtitan", **plan)


def test_torchtitan_pipeline_args():
    pf = titan("llama3-70b", 512, tp=8, pp=4, vpp=2, global_batch=512, seq_len=8192, zero=3,
               recompute=Recompute(mode="full"))
    args = torchtitan_args(pf)
    assert args[:4] == ["--module", "autopar_torchtitan", "--config", "autopar_plan"]
    module = export(pf, "torchtitan")["autopar_torchtitan.py"]
    assert "from torchtitan.models.llama3.config_registry import llama3_70b" in module
    assert "model_registry('70B', converters=converters)" in module
    assert flag(args, "--parallelism.tensor-parallel-degree") == "8"
    assert flag(args, "--parallelism.pipeline-parallel-degree") == "4"
    assert flag(args, "--parallelism.pipeline-parallel-schedule") == "Interleaved1F1B"
    assert flag(args, "--parallelism.data-parallel-shard-degree") == "16"
    assert flag(args, "--parallelism.data-parallel-replicate-degree") == "1"
    assert flag(args, "--parallelism.fsdp-reshard-after-forward") == "always"
    assert flag(args, "--training.local-batch-size") == "32"  # 512 / dp 16, split into micro-batches of 1
    assert flag(args, "--parallelism.pipeline-parallel-microbatch-size") == "1"
    assert flag(args, "--training.global-batch-size") == "512" and flag(args, "--training.seq-len") == "8192"
    assert "--parallelism.enable-sequence-parallel" in args and "--training.disable-cuda-graphs" in args
    at = args.index("--parallelism.module-fqns-per-model-part") + 1
    parts = [p.split(",") for p in args[at:at + 8]]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    layers = [m for p in parts for m in p if m.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(80)]
    # torchtitan's own split: 80 + 2 weights over 8 stages = 10 r 2, the first two stages +1,
    # the first and last give up one each for the embedding and the head
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [10, 11, 10, 10, 10, 10, 10, 9]
    assert args[-1] == "activation-checkpoint:full"


def test_torchtitan_data_parallel_mapping():
    def dp_flags(**plan):
        args = torchtitan_args(titan("llama3-8b", 64, global_batch=256, seq_len=4096, **plan))
        return [flag(args, "--parallelism.data-parallel-replicate-degree"),
                flag(args, "--parallelism.data-parallel-shard-degree"),
                flag(args, "--parallelism.fsdp-reshard-after-forward")]
    assert dp_flags(zero=0) == ["64", "1", "default"]
    assert dp_flags(zero=2) == ["1", "64", "never"]
    assert dp_flags(zero=3, zero_shard_size=8) == ["8", "8", "always"]
    args = torchtitan_args(titan("llama3-8b", 64, global_batch=256, mbs=2, seq_len=4096, zero=3))
    assert flag(args, "--training.local-batch-size") == "2" and "--parallelism.module-fqns-per-model-part" not in args
    assert args[-1] == "activation-checkpoint:selective"


def test_torchtitan_launch_and_script():
    pf = titan("llama3-8b", 16, tp=2, global_batch=64, seq_len=4096, zero=2, tp_comm_overlap=True,
               recompute=Recompute(mode="none"))
    cmd = torchtitan_launch_command(pf)
    assert "-m torchtitan.train --module autopar_torchtitan --config autopar_plan" in cmd
    assert cmd.endswith("activation-checkpoint:none") and '--hf-assets-path "$HF_ASSETS_PATH"' in cmd
    assert "--compile.enable-async-tensor-parallel" in cmd
    script = export(pf, "torchtitan")["launch_torchtitan.sh"]
    assert '"${PLAN_ARGS[@]}" "${RUN_ARGS[@]}" activation-checkpoint:none' in script


@pytest.mark.parametrize("model,plan,reason", [
    ("gpt3-175b", dict(tp=8, global_batch=64, seq_len=2048), "no torchtitan 0.3 model_registry flavour"),
    ("deepseek-v3", dict(ep=8, etp=1, global_batch=64, seq_len=4096), "MTP"),
    ("llama3-8b", dict(cp=2, global_batch=64, seq_len=4096, cp_comm_type="p2p"), "cp_comm_type p2p"),
    ("llama3-8b", dict(cp=2, cp_comm_type="allgather", zero=0, global_batch=64, seq_len=4096), "zero 0 with cp"),
    ("llama3-8b", dict(global_batch=64, seq_len=4096, recompute=Recompute(mode="full", num_layers=3)), "every block"),
    ("llama3-8b", dict(global_batch=64, seq_len=4096, zero=1), "zero 1 is not available in torchtitan"),
    ("qwen3-30b-a3b", dict(tp=2, ep=4, global_batch=64, seq_len=4096), "etp 2"),
    ("qwen3-30b-a3b", dict(tp=2, ep=4, etp=1, global_batch=64, seq_len=4096, moe_capacity_factor=1.0), "dropless"),
])
def test_torchtitan_refusals(model, plan, reason):
    plan.setdefault("zero", 2)
    with pytest.raises(ExportError, match=reason):
        export(titan(model, 64, **plan), "torchtitan")


# ---- the scripts themselves: run under bash with a stand-in launcher --------------------------

def run_script(script: str, launcher: str, tmp_path: Path) -> list[str]:
    """Run an exported script with `launcher` replaced by a stub that records its argv."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    record = tmp_path / "argv.txt"
    stub = tmp_path / "bin" / launcher
    stub.parent.mkdir(parents=True)
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "{record}"\n')
    stub.chmod(0o755)
    path = tmp_path / "launch.sh"
    path.write_text(script)
    env = {"PATH": f"{stub.parent}:{os.environ.get('PATH', '')}", "HOME": str(tmp_path)}
    subprocess.run([bash, str(path)], check=True, env=env, cwd=tmp_path, timeout=60)
    return record.read_text().splitlines()


@pytest.mark.parametrize("name", ["llama3-70b tp8 pp4 vpp5", "deepseek-v3 ep32", "405b tp8 pp16 uneven"])
def test_megatron_script_passes_exactly_the_arguments(name, tmp_path):
    pf = ROUND_TRIP[name]()
    argv = run_script(export(pf, "megatron")["launch_megatron.sh"], "torchrun", tmp_path)
    assert argv[:10] == ["--nproc_per_node", "8", "--nnodes", str(pf.target.gpus // 8), "--node_rank", "0",
                         "--master_addr", "localhost", "--master_port", "6000"]
    at = argv.index("/path/to/Megatron-LM/pretrain_gpt.py") + 1
    expected = megatron_args(pf)
    assert argv[at:at + len(expected)] == expected
    assert flag(argv, "--data-path") == "/path/to/corpus_text_document"


def test_script_refuses_a_different_world_size(tmp_path):
    script = export(ROUND_TRIP["llama3-70b tp8 pp4 vpp5"](), "megatron")["launch_megatron.sh"]
    with pytest.raises(subprocess.CalledProcessError):
        run_script(script.replace('NNODES="${NNODES:-128}"', 'NNODES="${NNODES:-127}"'), "torchrun", tmp_path)


def test_torchtitan_and_deepspeed_scripts_pass_their_arguments(tmp_path):
    pf = titan("llama3-70b", 512, tp=8, pp=4, vpp=2, global_batch=512, seq_len=8192, zero=3)
    argv = run_script(export(pf, "torchtitan")["launch_torchtitan.sh"], "torchrun", tmp_path / "tt")
    at = argv.index("torchtitan.train") + 1
    expected = torchtitan_args(pf)
    assert argv[at:at + len(expected) - 1] == expected[:-1] and argv[-1] == expected[-1]
    assert flag(argv, "--hf-assets-path") == "/path/to/hf_assets"
    pf = DS_PLANS["pp4 zero1"]()
    argv = run_script(export(pf, "deepspeed")["launch_deepspeed.sh"], "deepspeed", tmp_path / "ds")
    assert flag(argv, "--num_nodes") == "8" and flag(argv, "--num_gpus") == "8"
    assert argv[-11:-8] == ["--deepspeed", "--deepspeed_config", str(tmp_path / "ds" / "ds_config.json")]


# ---- Megatron: router, RoPE and Megatron-FSDP rules --------------------------------------------

MOE = VALID + ["--num-experts", "8", "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
               "--disable-bias-linear", "--moe-grouped-gemm"]


@pytest.mark.parametrize("changes,reason", [
    ({"moe_router_enable_expert_bias": ""}, "Expert bias for aux-loss-free routing only supports sigmoid"),
    ({"moe_router_group_topk": "2"}, "moe_router_num_groups must be specified"),
    ({"moe_router_score_function": "sigmoid", "moe_router_num_groups": "3", "moe_router_group_topk": "2"},
     "must split into moe_router_num_groups"),
    ({"moe_router_load_balancing_type": "aux_loss seq_aux_loss"}, "same length"),
    ({"moe_router_dtype": "bf16"}, "not fp32 or fp64"),
    ({"rope_type": "yarn"}, "Common attention only support rope_type"),
    ({"use_megatron_fsdp": "", "data_parallel_sharding_strategy": "optim_grads_params"},
     "Megatron FSDP only supports fsdp_dtensor checkpoint format"),
    ({"ckpt_format": "fsdp_dtensor"}, "fsdp_dtensor is only tested with Megatron FSDP"),
    ({"use_megatron_fsdp": "", "ckpt_format": "fsdp_dtensor", "data_parallel_sharding_strategy": "zero3"},
     "is not one of no_shard"),
])
def test_megatron_router_rope_and_fsdp_rules(changes, reason):
    args = with_args(MOE, **{k: v for k, v in changes.items() if " " not in v})
    for k, v in changes.items():
        if " " in v:
            args += ["--" + k.replace("_", "-"), *v.split()]
    assert megatron_violations(MOE, 64) == []
    assert any(reason in v for v in megatron_violations(args, 64)), megatron_violations(args, 64)


def test_megatron_writes_the_models_settings():
    args = megatron_args(ROUND_TRIP["deepseek-v3 ep32"]())
    assert flag(args, "--rotary-base") == "10000" and flag(args, "--norm-epsilon") == "1e-06"
    assert flag(args, "--rope-type") == "yarn" and flag(args, "--rotary-scaling-factor") == "40.0"
    assert flag(args, "--moe-router-score-function") == "sigmoid" and "--moe-router-enable-expert-bias" in args
    assert flag(args, "--moe-router-topk-scaling-factor") == "2.5" and flag(args, "--moe-router-dtype") == "fp32"
    assert flag(args, "--moe-router-load-balancing-type") == "seq_aux_loss"
    args = megatron_args(ROUND_TRIP["405b default split"]())
    assert flag(args, "--rotary-base") == "500000" and "--use-rope-scaling" in args
    args = megatron_args(ROUND_TRIP["mixtral capacity"]())
    assert flag(args, "--moe-aux-loss-coeff") == "0.02" and flag(args, "--rotary-base") == "1000000"


def test_export_to_another_framework_names_the_replan_command():
    pf = ROUND_TRIP["llama3-70b tp8 pp4 vpp5"]()
    with pytest.raises(ExportError, match=r"made for megatron and deepspeed would not run it as planned: .*tp 8: the "
                                          r"DeepSpeed engine has no tensor.*; re-plan it for deepspeed with `autopar plan llama3-70b "
                                          r"--cluster dgx-h100 --gpus 1024 --seq-len \d+ --global-batch 1024 "
                                          r"--framework deepspeed`"):
        export(pf, "deepspeed")
    with pytest.raises(ExportError, match="--framework torchtitan`"):
        export(pf, "torchtitan")
