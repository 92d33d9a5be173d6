"""The issue's acceptance check: every plan `autopar plan` emits for the four benchmark cases
exports to every format it is eligible for, and each export passes that framework's validation
(when the framework is installed, as in CI)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from autopar.api import plan_file_for, search_plans
from autopar.errors import ExportError
from autopar.export import export, megatron_args
from autopar.export.common import layer_counts
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
from test_export_frameworks import (deepspeed_config, fake_world, initialize, mcore, titan_config,  # noqa: F401
                                    transformer_config)

CASES = {
    "gpt3-175b 1024 A100": ("gpt3-175b", "dgx-a100-80gb", 1024, 2048, 1536),
    "llama3-70b 64 H100": ("llama3-70b", "dgx-h100", 64, 8192, 128),
    "llama3.1-405b 16384 H100": ("llama3.1-405b", "dgx-h100", 16384, 8192, 2048),
    "deepseek-v3 2048 H800": ("deepseek-v3", "hgx-h800", 2048, 4096, 15360),
}
TOP = 3


@lru_cache(maxsize=None)
def plan_files(case: str):
    model, cluster, gpus, seq, batch = CASES[case]
    result = search_plans(model, cluster, gpus, seq, batch, top=TOP)
    return [plan_file_for(model, cluster, gpus, plan, est) for plan, est in result.plans]


# The benchmark cases DeepSpeed and torchtitan can express, planned with --framework X
FRAMEWORK_CASES = {
    "deepspeed llama3-8b 64 H100": ("deepspeed", "llama3-8b", "dgx-h100", 64, 8192, 128),
    "deepspeed llama3-70b 64 H100": ("deepspeed", "llama3-70b", "dgx-h100", 64, 8192, 128),
    "torchtitan llama3-8b 512 H100": ("torchtitan", "llama3-8b", "dgx-h100", 512, 8192, 512),
    "torchtitan llama3-70b 512 H100": ("torchtitan", "llama3-70b", "dgx-h100", 512, 8192, 512),
    "torchtitan llama3.1-405b 512 H100": ("torchtitan", "llama3.1-405b", "dgx-h100", 512, 8192, 512),
}


@lru_cache(maxsize=None)
def framework_plan_files(case: str):
    framework, model, cluster, gpus, seq, batch = FRAMEWORK_CASES[case]
    result = search_plans(model, cluster, gpus, seq, batch, top=TOP, framework=framework)
    assert len(result.plans) == TOP
    return [plan_file_for(model, cluster, gpus, plan, est) for plan, est in result.plans]


@pytest.mark.parametrize("case", [c for c in FRAMEWORK_CASES if c.startswith("deepspeed")])
def test_deepspeed_benchmark_plans_pass_deepspeed(case, deepspeed_config):  # noqa: F811
    """`plan --framework deepspeed` top-3: DeepSpeedConfig parses each ds_config.json at the plan's
    world size and data-parallel size and reads back its batch, ZeRO and pipeline settings."""
    import json

    import torch.distributed as dist

    for pf in framework_plan_files(case):
        plan, gpus = pf.parallel, pf.target.gpus
        ds = deepspeed_config(json.loads(export(pf, "deepspeed")["ds_config.json"]), gpus, plan.dp_for(gpus))
        assert ds.world_size == plan.dp_for(gpus) == gpus // (plan.pp * plan.tp * plan.cp)
        assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (
            plan.global_batch, plan.mbs, plan.num_microbatches(gpus))
        assert ds.zero_optimization_stage == plan.zero
        if plan.pp > 1:
            assert ds.pipeline["stages"] == plan.pp
        dist.destroy_process_group()


@pytest.mark.parametrize("case", [c for c in FRAMEWORK_CASES if c.startswith("torchtitan")])
def test_torchtitan_benchmark_plans_pass_torchtitan(case, titan_config, fake_world, monkeypatch):  # noqa: F811
    """`plan --framework torchtitan` top-3: ConfigManager parses each export (the generated config
    module included), ParallelDims accepts the degrees and builds the device mesh (fake process
    group, CPU mesh) whose pp/tp/cp/batch axes are the plan's, the model parts are the plan's
    layer split, and the pipeline schedule is one torch knows by that name."""
    from torchtitan.distributed import parallel_dims
    from torchtitan.distributed.parallel_dims import ParallelDims

    monkeypatch.setattr(parallel_dims, "device_type", "cpu")
    import torch.distributed as dist
    from torch.distributed.pipelining.schedules import get_schedule_class

    for pf in framework_plan_files(case):
        plan, gpus = pf.parallel, pf.target.gpus
        config = titan_config(pf)
        par = config.parallelism
        assert len(config.model_spec.model.layers) == pf.target.model_spec.num_layers
        fake_world(gpus)
        dims = ParallelDims.from_config(par, world_size=gpus)
        dims.build_mesh()
        meshes = {axis: dims.get_optional_mesh(axis) for axis in ("pp", "tp", "cp", "batch")}
        sizes = {axis: m.size() if m is not None else 1 for axis, m in meshes.items()}
        assert (sizes["pp"], sizes["tp"], sizes["cp"], sizes["batch"]) == (plan.pp, plan.tp, plan.cp,
                                                                           plan.dp_for(gpus))
        assert dims.dp_replicate * dims.dp_shard == plan.dp_for(gpus)
        if plan.pp > 1:
            get_schedule_class(par.pipeline_parallel_schedule)
            parts = [[m for m in p if m.startswith("layers.")] for p in par.module_fqns_per_model_part]
            assert tuple(len(p) for p in parts) == layer_counts(pf)
        dist.destroy_process_group()


@pytest.mark.parametrize("case", list(CASES))
def test_benchmark_plans_export_to_megatron_and_pass_its_rules(case):
    for pf in plan_files(case):
        files = export(pf, "megatron")
        assert "pretrain_gpt.py" in files["launch_megatron.sh"]
        args = parse_megatron_argv(megatron_args(pf))
        assert megatron_violations(args, pf.target.gpus) == []


@pytest.mark.parametrize("case", list(CASES))
def test_benchmark_plans_pass_megatron_core(case, mcore, fake_world):  # noqa: F811
    from megatron.core import parallel_state as ps

    for pf in plan_files(case):
        a = parse_megatron_argv(megatron_args(pf))
        config = transformer_config(a)
        fake_world(pf.target.gpus)
        initialize(a, config, pf.target.gpus)
        assert ps.get_data_parallel_world_size() == pf.parallel.dp_for(pf.target.gpus)
        ps.destroy_model_parallel()
        import torch.distributed as dist

        dist.destroy_process_group()


@pytest.mark.parametrize("case", list(CASES))
def test_benchmark_plans_other_formats_export_or_refuse_with_a_reason(case):
    for pf in plan_files(case):
        for fmt in ("deepspeed", "torchtitan"):
            try:
                files = export(pf, fmt)
            except ExportError as exc:
                assert str(exc) and "\n" not in str(exc)  # one line naming why
            else:
                assert files


@pytest.mark.parametrize("model,gpus,seq,batch", [("llama3-8b", 16, 4096, 64), ("mixtral-8x7b", 32, 4096, 64),
                                                  ("gpt3-175b", 64, 2048, 128), ("deepseek-v3", 256, 4096, 1024)])
def test_every_searchable_plan_is_expressible_in_megatron(model, gpus, seq, batch):
    """autopar never emits a plan Megatron cannot express: a sample of the whole search space (not
    just the winners) exports and passes the re-implemented validate_args rules."""
    from autopar.api import load_model
    from autopar.cost.params import cost_model_for_gpu
    from autopar.cost.step import estimate
    from autopar.hardware import load_cluster
    from autopar.search import candidates, space_spec_for

    g, c = load_model(model), load_cluster("dgx-h100", gpus)
    p = cost_model_for_gpu(c.gpu_name)[1]
    plans = candidates(space_spec_for(g, c, seq, batch))
    for plan in plans[:: max(1, len(plans) // 100)]:
        pf = plan_file_for(model, "dgx-h100", gpus, plan, estimate(g, c, plan, p))
        export(pf, "megatron")  # raises ExportError on anything Megatron would refuse
        assert megatron_violations(parse_megatron_argv(megatron_args(pf)), gpus) == []


@pytest.mark.parametrize("framework,model,gpus,seq,batch", [
    ("deepspeed", "llama3-8b", 16, 4096, 64), ("deepspeed", "gpt3-175b", 64, 2048, 128),
    ("torchtitan", "llama3-70b", 64, 8192, 128), ("torchtitan", "qwen3-30b-a3b", 32, 4096, 64)])
def test_every_searchable_plan_is_expressible_in_its_framework(framework, model, gpus, seq, batch):
    """With --framework deepspeed/torchtitan the search filters by the exporter's own refusals."""
    from autopar.api import load_model
    from autopar.cost.params import cost_model_for_gpu
    from autopar.cost.step import estimate
    from autopar.hardware import load_cluster
    from autopar.search import candidates, space_spec_for

    g, c = load_model(model), load_cluster("dgx-h100", gpus)
    p = cost_model_for_gpu(c.gpu_name)[1]
    plans = candidates(space_spec_for(g, c, seq, batch, framework=framework))
    assert plans
    for plan in plans[:: max(1, len(plans) // 60)]:
        assert export(plan_file_for(model, "dgx-h100", gpus, plan, estimate(g, c, plan, p)), framework)


def test_torchtitan_search_refuses_models_it_cannot_build():
    from autopar.errors import NoFeasiblePlanError

    with pytest.raises(NoFeasiblePlanError, match="config_registry"):
        search_plans("gpt3-175b", "dgx-h100", 64, 2048, 128, framework="torchtitan")
