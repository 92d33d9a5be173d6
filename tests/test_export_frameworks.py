"""The exported launch configurations, fed to the real frameworks on the CPU.

Each test imports its framework with pytest.importorskip, so the suite passes without them; CI
installs them (megatron-core 0.16, deepspeed 0.19, torchtitan 0.3 over the CPU torch wheel):
- megatron-core: TransformerConfig / MLATransformerConfig accept the exported model, parallel,
  recompute and pipeline-layout values (the layout is validated by megatron-core itself);
  initialize_model_parallel on torch's fake process group at the plan's world size gives the
  plan's dp, expert dp and virtual stages; get_num_layers_to_build gives the plan's layers per
  stage; the micro-batch calculator gives the plan's micro-batch count; and arguments that our
  rules refuse are refused by megatron-core too.
- deepspeed: DeepSpeedConfig parses ds_config.json with the plan's data-parallel size (a stub
  mpu over a fake process group) and reads back its batch keys, ZeRO and checkpointing settings.
- torchtitan: its ConfigManager parses the exported arguments against the named config_registry
  entry (whose model has the plan's layer count), and ParallelDims accepts the world size.
"""

from __future__ import annotations

import importlib
import json
import warnings

import pytest

from autopar.export import export, megatron_args, torchtitan_args
from autopar.export.common import layer_counts
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
from autopar.schema.plan import Recompute
from test_export import DS_PLANS, ROUND_TRIP, VALID, titan, with_args  # tests/ is on sys.path (rootdir)

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")


@pytest.fixture
def fake_world():
    """torch.distributed on the fake backend (no communication), torn down after the test."""
    dist = pytest.importorskip("torch.distributed")
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")

    def start(world_size: int) -> None:
        dist.init_process_group("fake", rank=0, world_size=world_size, store=fake_pg.FakeStore())

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- megatron-core ---------------------------------------------------------------------------

@pytest.fixture
def mcore():
    core = pytest.importorskip("megatron.core")
    from megatron.core import parallel_state

    yield core
    parallel_state.destroy_model_parallel()


def transformer_config(a: dict):
    """megatron-core's config from Megatron's namespace, as megatron/training's
    core_transformer_config_from_args builds it (the fields autopar exports)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    tp, vpp = a["tensor_model_parallel_size"], a["num_virtual_stages_per_pipeline_rank"]
    gran = "selective" if a["recompute_activations"] else a["recompute_granularity"]
    kw = dict(
        num_layers=a["num_layers"], hidden_size=a["hidden_size"], num_attention_heads=a["num_attention_heads"],
        ffn_hidden_size=a["ffn_hidden_size"], kv_channels=a["kv_channels"],
        num_query_groups=a["num_query_groups"] if a["group_query_attention"] else None,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=a["pipeline_model_parallel_size"],
        context_parallel_size=a["context_parallel_size"], expert_model_parallel_size=a["expert_model_parallel_size"],
        expert_tensor_parallel_size=a["expert_tensor_parallel_size"],
        sequence_parallel=a["sequence_parallel"] and tp > 1,
        virtual_pipeline_model_parallel_size=vpp if vpp and vpp > 1 else None,
        pipeline_model_parallel_layout=a["pipeline_model_parallel_layout"],
        pipeline_dtype=torch.bfloat16, params_dtype=torch.bfloat16, bf16=a["bf16"], fp8=a["fp8"],
        normalization=a["normalization"], add_bias_linear=a["add_bias_linear"],
        add_qkv_bias=a["add_qkv_bias"] or a["add_bias_linear"], qk_layernorm=a["qk_layernorm"],
        attention_dropout=a["attention_dropout"], hidden_dropout=a["hidden_dropout"],
        gated_linear_unit=a["swiglu"], activation_func=F.silu if a["swiglu"] else F.gelu,
        recompute_granularity=gran, recompute_method=a["recompute_method"],
        recompute_num_layers=a["recompute_num_layers"], recompute_modules=a["recompute_modules"],
        tp_comm_overlap=a["tp_comm_overlap"], mtp_num_layers=a["mtp_num_layers"],
        layernorm_epsilon=a["layernorm_epsilon"], window_size=a["window_size"])
    if a["attention_backend"] != "auto":  # arguments.py parses it into the enum
        from megatron.core.transformer.enums import AttnBackend

        kw["attention_backend"] = AttnBackend[a["attention_backend"]]
    if a["context_parallel_size"] > 1:
        kw["cp_comm_type"] = a["cp_comm_type"][0]
    if a["num_experts"]:
        kw |= dict(num_moe_experts=a["num_experts"], moe_router_topk=a["moe_router_topk"],
                   moe_ffn_hidden_size=a["moe_ffn_hidden_size"], moe_layer_freq=a["moe_layer_freq"],
                   moe_shared_expert_intermediate_size=a["moe_shared_expert_intermediate_size"],
                   moe_grouped_gemm=a["moe_grouped_gemm"], moe_token_dispatcher_type=a["moe_token_dispatcher_type"],
                   moe_expert_capacity_factor=a["moe_expert_capacity_factor"],
                   moe_pad_expert_input_to_capacity=a["moe_pad_expert_input_to_capacity"],
                   moe_shared_expert_overlap=a["moe_shared_expert_overlap"],
                   moe_router_score_function=a["moe_router_score_function"],
                   moe_router_pre_softmax=a["moe_router_pre_softmax"],
                   moe_router_enable_expert_bias=a["moe_router_enable_expert_bias"],
                   moe_router_num_groups=a["moe_router_num_groups"], moe_router_group_topk=a["moe_router_group_topk"],
                   moe_router_topk_scaling_factor=a["moe_router_topk_scaling_factor"],
                   moe_router_dtype=a["moe_router_dtype"], **_one_or_list(a))
    if a["multi_latent_attention"]:
        mla = dict(q_lora_rank=a["q_lora_rank"], kv_lora_rank=a["kv_lora_rank"], qk_head_dim=a["qk_head_dim"],
                   qk_pos_emb_head_dim=a["qk_pos_emb_head_dim"], v_head_dim=a["v_head_dim"],
                   rotary_base=a["rotary_base"], rotary_percent=a["rotary_percent"],
                   rotary_scaling_factor=a["rotary_scaling_factor"], mscale=a["mscale"],
                   mscale_all_dim=a["mscale_all_dim"])
        if a["rope_type"] is not None:  # as core_transformer_config_from_args: None keeps the class default
            mla["rope_type"] = a["rope_type"]
        return MLATransformerConfig(**kw, **mla)
    return TransformerConfig(**kw)


def _one_or_list(a: dict) -> dict:
    """--moe-router-load-balancing-type / --moe-aux-loss-coeff take nargs='+': one value is a scalar."""
    types, coeffs = a["moe_router_load_balancing_type"], a["moe_aux_loss_coeff"]
    return dict(moe_router_load_balancing_type=types[0] if len(types) == 1 else types,
                moe_aux_loss_coeff=coeffs[0] if len(coeffs) == 1 else coeffs)


def initialize(a: dict, config, world_size: int) -> None:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=a["tensor_model_parallel_size"],
        pipeline_model_parallel_size=a["pipeline_model_parallel_size"],
        virtual_pipeline_model_parallel_size=config.virtual_pipeline_model_parallel_size,
        context_parallel_size=a["context_parallel_size"], expert_model_parallel_size=a["expert_model_parallel_size"],
        expert_tensor_parallel_size=a["expert_tensor_parallel_size"],
        num_distributed_optimizer_instances=a["num_distributed_optimizer_instances"],
        create_gloo_process_groups=False)


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_megatron_core_accepts_the_export(name, mcore, fake_world):
    from megatron.core import parallel_state as ps
    from megatron.core.num_microbatches_calculator import (destroy_num_microbatches_calculator, get_num_microbatches,
                                                           init_num_microbatches_calculator)
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pf = ROUND_TRIP[name]()
    plan, gpus = pf.parallel, pf.target.gpus
    a = parse_megatron_argv(megatron_args(pf))
    config = transformer_config(a)
    fake_world(gpus)
    initialize(a, config, gpus)

    dp = plan.dp_for(gpus)
    assert ps.get_data_parallel_world_size() == dp
    assert ps.get_tensor_model_parallel_world_size() == plan.tp
    assert ps.get_pipeline_model_parallel_world_size() == plan.pp
    assert ps.get_context_parallel_world_size() == plan.cp
    assert ps.get_virtual_pipeline_model_parallel_world_size() == (plan.vpp if plan.vpp > 1 else None)
    assert ps.get_expert_model_parallel_world_size() == plan.ep
    assert ps.get_expert_tensor_parallel_world_size() == plan.expert_tp
    assert ps.get_expert_data_parallel_world_size() == gpus // (plan.expert_tp * plan.ep * plan.pp)

    layout = config.pipeline_model_parallel_layout  # megatron-core parsed and validated our layout string
    count = layout.get_num_layers_to_build if layout is not None else \
        lambda vp_stage, pp_rank: get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    built = [count(vp_stage=v if plan.vpp > 1 else None, pp_rank=r) for v in range(plan.vpp) for r in range(plan.pp)]
    assert tuple(built) == layer_counts(pf)

    init_num_microbatches_calculator(0, None, plan.global_batch, plan.mbs, dp)
    try:
        assert get_num_microbatches() == plan.num_microbatches(gpus)
    finally:
        destroy_num_microbatches_calculator()


def _cluster_pf(model: str, cluster: str, gpus: int, **plan):
    from autopar.api import load_model
    from autopar.schema.plan import ParallelPlan
    from autopar.schema.plan_file import PlanFile, PlanTarget

    return PlanFile(autopar_version="0.1.0", parallel=ParallelPlan(**plan),
                    target=PlanTarget(model=model, model_spec=load_model(model).spec, cluster=cluster, gpus=gpus))


# Exports for the clusters of 2026 (issue 29): NVL72 racks, AMD Instinct, Blackwell's block-scaled recipes.
CLUSTER_PLANS = {
    "gpt3-175b tp16 on 512 GB200 NVL72": lambda: _cluster_pf("gpt3-175b", "gb200-nvl72", 512, tp=16, pp=8, global_batch=512,
                                                        seq_len=2048),
    "deepseek-v3 ep64 on 256 GB200": lambda: _cluster_pf("deepseek-v3", "gb200-nvl72", 256, tp=2, pp=2, ep=64, etp=1,
                                                         global_batch=4096, seq_len=4096),
    "deepseek-v3 unfused attention on 128 GB200": lambda: _cluster_pf("deepseek-v3", "gb200-nvl72", 128, tp=2, pp=4,
                                                                      ep=32, etp=1, global_batch=1024, seq_len=4096,
                                                                      attention_backend="unfused"),
    "llama3-70b fp8 on 64 MI300X": lambda: _cluster_pf("llama3-70b", "mi300x", 64, tp=8, pp=2, global_batch=128,
                                                       seq_len=8192, precision="fp8"),
    "llama3-70b mxfp8 on 64 MI355X": lambda: _cluster_pf("llama3-70b", "mi355x", 64, tp=4, pp=2, global_batch=128,
                                                         seq_len=8192, precision="mxfp8"),
    "llama3-70b nvfp4 on 64 GB300": lambda: _cluster_pf("llama3-70b", "gb300-nvl72", 64, tp=4, pp=2, global_batch=128,
                                                        seq_len=8192, precision="nvfp4"),
}


@pytest.mark.parametrize("name", list(CLUSTER_PLANS))
def test_megatron_core_accepts_the_cluster_exports(name, mcore, fake_world):
    """megatron-core builds the exported config (its fp8 / fp4 recipe checks in __post_init__ included)
    and initializes every parallel group on the planned world."""
    from megatron.core import parallel_state as ps

    pf = CLUSTER_PLANS[name]()
    plan, gpus = pf.parallel, pf.target.gpus
    a = parse_megatron_argv(megatron_args(pf))
    config = transformer_config(a)
    if a["fp4"]:  # TransformerConfig's own recipe fields, as core_transformer_config_from_args passes them
        from megatron.core.transformer import TransformerConfig

        assert a["fp8"] is None and (a["fp4"], a["fp4_recipe"]) == ("e2m1", "nvfp4")
        config = TransformerConfig(**{**{k: getattr(config, k) for k in ("num_layers", "hidden_size",
                                                                         "num_attention_heads", "ffn_hidden_size")},
                                      "fp4": a["fp4"], "fp4_recipe": a["fp4_recipe"], "bf16": True})
    if a["fp8_recipe"] == "mxfp8":
        from megatron.core.transformer import TransformerConfig

        assert a["fp8"] == "e4m3"
        TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, fp8=a["fp8"], fp8_recipe="mxfp8",
                          bf16=True)
    assert megatron_violations(megatron_args(pf), gpus) == []
    fake_world(gpus)
    initialize(a, transformer_config(a), gpus)
    assert ps.get_tensor_model_parallel_world_size() == plan.tp
    assert ps.get_expert_model_parallel_world_size() == plan.ep
    assert ps.get_data_parallel_world_size() == plan.dp_for(gpus)


@pytest.mark.parametrize("name", ["megatron-fsdp zero3", "megatron-fsdp zero2 hsdp"])
def test_megatron_fsdp_export_builds_megatron_cores_ddp_config(name, mcore):
    """zero 2/3 under Megatron: the flags megatron/training builds DistributedDataParallelConfig
    from (use_megatron_fsdp, data_parallel_sharding_strategy, the distributed optimizer, overlap,
    optimizer instances = HSDP) give megatron-core's config the plan's ZeRO stage."""
    from megatron.core.distributed import DistributedDataParallelConfig

    pf = ROUND_TRIP[name]()
    a = parse_megatron_argv(megatron_args(pf))
    ddp = DistributedDataParallelConfig(
        use_megatron_fsdp=a["use_megatron_fsdp"], data_parallel_sharding_strategy=a["data_parallel_sharding_strategy"],
        use_distributed_optimizer=a["use_distributed_optimizer"], overlap_grad_reduce=a["overlap_grad_reduce"],
        overlap_param_gather=a["overlap_param_gather"],
        num_distributed_optimizer_instances=a["num_distributed_optimizer_instances"])
    assert ddp.use_megatron_fsdp and ddp.use_distributed_optimizer
    assert ddp.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}[pf.parallel.zero]
    dp = pf.parallel.dp_for(pf.target.gpus)
    assert ddp.num_distributed_optimizer_instances == dp // (pf.parallel.zero_shard_size or dp)
    assert a["ckpt_format"] == "fsdp_dtensor" and not a["gradient_accumulation_fusion"]
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in export(pf, "megatron")["launch_megatron.sh"]


@pytest.mark.parametrize("changes,world", [
    ({"pipeline_model_parallel_layout": "Et*8|t*8|t*8|t*7L"}, 64),   # 31 decoders for 32 layers
    ({"pipeline_model_parallel_layout": "Et*8|t*8|t*8|t*8"}, 64),    # no loss stage
    ({"tensor_model_parallel_size": "3"}, 48),                       # 32 heads over tp 3
    ({"recompute_granularity": "full", "recompute_num_layers": "2"}, 64),  # full without a method
    ({"recompute_granularity": "selective", "recompute_modules": "mla_up_proj"}, 64),
    ({"expert_model_parallel_size": "2"}, 64),                       # ep without experts
])
def test_megatron_core_refuses_what_our_rules_refuse(changes, world, mcore):
    args = with_args(VALID, **changes)
    assert megatron_violations(args, world)
    with pytest.raises((AssertionError, ValueError)):
        transformer_config(parse_megatron_argv(args))


def test_megatron_core_refuses_bad_world_and_batch(mcore, fake_world):
    from megatron.core import parallel_state as ps
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator

    args = with_args(VALID, global_batch_size="6")
    assert megatron_violations(args, 40) and megatron_violations(args, 64)
    fake_world(40)
    with pytest.raises(RuntimeError, match="not divisible"):
        ps.initialize_model_parallel(tensor_model_parallel_size=4, pipeline_model_parallel_size=4,
                                     create_gloo_process_groups=False)
    with pytest.raises(AssertionError, match="not divisible by micro batch size"):
        init_num_microbatches_calculator(0, None, 6, 1, 4)


# ---- DeepSpeed -------------------------------------------------------------------------------

class DataParallelMPU:
    """The one mpu method DeepSpeedConfig asks: the data-parallel size (world / pipeline stages)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture
def deepspeed_config(fake_world, monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.comm as ds_comm
    from deepspeed.runtime.config import DeepSpeedConfig

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the attribute deepspeed.comm.torch is torch

    # DeepSpeed's CPU backend compiles a shared-memory all-reduce kernel at init; parsing a config needs none.
    monkeypatch.setattr(ds_torch, "build_shm_op", lambda: None)

    def parse(config: dict, world_size: int, dp: int):
        fake_world(world_size)
        ds_comm.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
        return DeepSpeedConfig(config, mpu=DataParallelMPU(dp))

    return parse


@pytest.mark.parametrize("name", list(DS_PLANS))
def test_deepspeed_parses_the_export(name, deepspeed_config):
    pf = DS_PLANS[name]()
    plan, gpus = pf.parallel, pf.target.gpus
    config = json.loads(export(pf, "deepspeed")["ds_config.json"])
    ds = deepspeed_config(config, gpus, gpus // plan.pp)
    assert ds.world_size == gpus // plan.pp
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu) == (plan.global_batch, plan.mbs)
    assert ds.gradient_accumulation_steps == plan.global_batch // (plan.mbs * ds.world_size)
    assert ds.zero_optimization_stage == plan.zero and ds.bfloat16_config.enabled
    assert ds.zero_config.overlap_comm == plan.overlap_grad_reduce
    if plan.zero == 3:
        assert (ds.zero_config.prefetch_bucket_size > 0) == plan.overlap_param_gather
    if plan.recompute.mode == "full":
        assert ds.activation_checkpointing_config.number_checkpoints == plan.recompute.num_layers
    if plan.pp > 1:
        assert ds.pipeline["stages"] == plan.pp
        assert ds.pipeline["activation_checkpoint_interval"] == (1 if plan.recompute.mode == "full" else 0)


def test_deepspeed_refuses_inconsistent_batch_keys_too(deepspeed_config):
    config = json.loads(export(DS_PLANS["zero2 selective"](), "deepspeed")["ds_config.json"])
    config["train_batch_size"] += 1
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        deepspeed_config(config, 128, 128)


# ---- torchtitan ------------------------------------------------------------------------------

TITAN_PLANS = {
    "70b tp8 pp4 vpp2 fsdp": lambda: titan("llama3-70b", 512, tp=8, pp=4, vpp=2, global_batch=512, seq_len=8192,
                                           zero=3, recompute=Recompute(mode="full")),
    "8b hsdp cp": lambda: titan("llama3-8b", 64, tp=2, cp=2, cp_comm_type="allgather", global_batch=128,
                                seq_len=16384, zero=3, zero_shard_size=4),
    "8b ddp": lambda: titan("llama3-8b", 16, global_batch=64, mbs=2, seq_len=4096, zero=0),
    "8b fsdp eager": lambda: titan("llama3-8b", 8, global_batch=16, mbs=2, seq_len=8192, zero=3, torch_compile=False),
    "qwen3 moe ep": lambda: titan("qwen3-30b-a3b", 32, tp=2, ep=8, etp=1, global_batch=64, seq_len=4096, zero=2),
    "qwen3 235b ep pp": lambda: titan("qwen3-235b-a22b", 1024, pp=4, ep=32, etp=1, global_batch=1024, seq_len=4096,
                                      zero=3, recompute=Recompute(mode="full")),
}


@pytest.fixture
def titan_config(tmp_path, monkeypatch):
    """torchtitan's ConfigManager on an export: the generated autopar_torchtitan.py on sys.path,
    then the exported arguments parsed (the config_registry function runs, as at launch)."""
    pytest.importorskip("torchtitan")
    pytest.importorskip("torchtitan.models.llama3.config_registry")  # needs triton importable
    import sys

    from torchtitan.config import ConfigManager

    monkeypatch.syspath_prepend(str(tmp_path))

    def parse(pf):
        files = export(pf, "torchtitan")
        (tmp_path / "autopar_torchtitan.py").write_text(files["autopar_torchtitan.py"])
        sys.modules.pop("autopar_torchtitan", None)
        return ConfigManager().parse_args(torchtitan_args(pf))

    yield parse
    sys.modules.pop("autopar_torchtitan", None)


@pytest.mark.parametrize("name", list(TITAN_PLANS))
def test_torchtitan_parses_the_export(name, titan_config):
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    pf = TITAN_PLANS[name]()
    plan, gpus = pf.parallel, pf.target.gpus
    config = titan_config(pf)
    par, train = config.parallelism, config.training
    assert len(config.model_spec.model.layers) == pf.target.model_spec.num_layers
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (plan.tp, plan.pp, plan.cp, plan.ep)
    dims = ParallelDims.from_config(par, world_size=gpus)
    assert dims.dp_replicate * dims.dp_shard == plan.dp_for(gpus)
    assert (train.global_batch_size, train.seq_len) == (plan.global_batch, plan.seq_len)
    assert config.compile.enable == (plan.torch_compile is not False)  # priced compiled (None: default) or eager
    if plan.pp > 1:
        assert len(par.module_fqns_per_model_part) == plan.pp * plan.vpp
        assert train.local_batch_size // par.pipeline_parallel_microbatch_size == plan.num_microbatches(gpus)
    else:
        assert train.local_batch_size == plan.mbs
    expected_ac = {"full": FullAC.Config, "selective": SelectiveAC.Config, "none": type(None)}[plan.recompute.mode]
    assert isinstance(config.activation_checkpoint, expected_ac)


@pytest.mark.parametrize("layers,stages", [(80, 8), (126, 8), (126, 64), (32, 4), (61, 16), (48, 6), (7, 3), (4, 8)])
def test_torchtitan_layer_split_is_torchtitans_own(layers, stages):
    """cost.layout.torchtitan_layer_counts equals torchtitan's pipeline module generator (or both
    refuse), so a torchtitan plan is estimated with the split torchtitan makes."""
    pytest.importorskip("torchtitan")
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    from autopar.cost.layout import torchtitan_layer_counts

    try:
        parts = _generate_llm_fqn_per_model_part(stages, layers, 1, 1)
    except ValueError:
        assert torchtitan_layer_counts(layers, stages) is None
        return
    assert torchtitan_layer_counts(layers, stages) == tuple(sum(m.startswith("layers.") for m in p) for p in parts)


def test_torchtitan_parses_the_checkpoint_schedule(titan_config, monkeypatch):
    """The planned run's checkpoint interval and background save reach torchtitan's own config."""
    from torchtitan.config import ConfigManager

    from autopar.export.torchtitan import _checkpoint_args

    pf = TITAN_PLANS["8b ddp"]()
    pf = pf.model_copy(update={"estimate": {**pf.estimate, "run": {"checkpoint_interval_steps": 77, "steps": 5000,
                                                                   "async_save": True}}})
    titan_config(pf)  # writes the config module
    args, steps, interval = _checkpoint_args(pf)
    config = ConfigManager().parse_args(torchtitan_args(pf, ("--checkpoint.enable", *args)))
    assert (config.checkpoint.interval, config.checkpoint.async_mode, steps, interval) == (77, "async", 5000, 77)


def test_torchtitan_parses_the_marked_dataset_and_learning_rate(titan_config):
    """The dataset (<-- SET in the launch) and the learning rate (<-- SET in the config module)
    reach torchtitan's own config."""
    from torchtitan.config import ConfigManager

    pf = TITAN_PLANS["8b ddp"]()
    titan_config(pf)  # writes the config module
    config = ConfigManager().parse_args(torchtitan_args(pf, ("--dataloader.dataset", "c4_test",
                                                             "--dataloader.dataset-path", "/data/c4")))
    assert (config.dataloader.dataset, config.dataloader.dataset_path) == ("c4_test", "/data/c4")
    assert [g.optimizer_kwargs["lr"] for g in config.optimizer.param_groups] == [3e-4]  # Llama 2's 7B peak
