"""The issue's acceptance check: every plan `autopar plan` emits for the four benchmark cases
exports to every format it is eligible for, and each export passes that framework's validation
(when the framework is installed, as in CI)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from autopar.api import plan_file_for, search_plans
from autopar.errors import ExportError
from autopar.export import export, megatron_args
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
from test_export_frameworks import deepspeed_config, fake_world, initialize, mcore, transformer_config  # noqa: F401

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
