"""Each framework in one place (autopar.frameworks): what a framework must provide, the plan
resolved with its defaults when built, every command reading the same plan, and exports to another
framework re-checked under it. Numbers are hand-worked from each framework's stated bytes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from autopar.api import inspect, plan_file_for
from autopar.choices import Framework
from autopar.cost.memory import model_state_bytes
from autopar.errors import ExportError, NoFeasiblePlanError
from autopar.export import export
from autopar.frameworks import REGISTRY, FrameworkSpec, check_spec, framework_spec, plan_refusals
from autopar.frameworks import torchtitan as titan
from autopar.model import load_model
from autopar.model.presets import preset
from autopar.schema.plan import ParallelPlan, Recompute, plan_violations
from autopar.cli import app

runner = CliRunner()


# ---- the registry and what a framework provides --------------------------------------------------

def test_every_framework_the_cli_offers_is_registered_and_complete():
    assert set(REGISTRY) == {f.value for f in Framework}
    for spec in REGISTRY.values():
        assert check_spec(spec) == [], spec.name


def test_a_new_framework_is_one_spec():
    """What a fourth framework provides (e.g. NeMo / Megatron-Bridge recipes): a FrameworkSpec with its
    axes, ZeRO stages and what each shards, defaults, memory policy, cost profile, refusals and an
    exporter. check_spec names what is missing or inconsistent."""
    megatron = framework_spec("megatron")
    nemo = replace(megatron, name="nemo", title="NeMo (Megatron-Bridge recipes)",
                   exporter="autopar.export:megatron_files")
    assert check_spec(nemo) == []
    broken = replace(nemo, default_zero=4, cp_comm_types=("p2p",), default_cp_comm_type="a2a", exporter="",
                     zero_sharded=((1, ("optimizer",)),))
    problems = check_spec(broken)
    assert any("default ZeRO 4" in p for p in problems) and any("default CP exchange a2a" in p for p in problems)
    assert any("exporter" in p for p in problems) and any("every offered stage" in p for p in problems)
    assert isinstance(nemo, FrameworkSpec)


def test_torchtitan_flavour_shapes_are_their_presets_shapes():
    """The flavour table states torchtitan's registry shapes; each is the shape of the preset it names,
    and flavour_for answers by shape whatever the model is called."""
    for f in titan.FLAVOURS:
        assert titan._shape(preset(f.preset)) == f.shape, f.preset
        assert titan.flavour_for(preset(f.preset)) is f
    renamed = preset("llama3-70b").model_copy(update={"name": "my-70b"})
    assert titan.flavour_for(renamed).flavor == "70B"
    assert titan.flavour_for(preset("gpt3-175b")) is None


# ---- a plan is resolved when it is built ---------------------------------------------------------

@pytest.mark.parametrize("framework,zero,cp_comm,compiled", [
    ("megatron", 1, "p2p", None), ("deepspeed", 1, "p2p", None), ("torchtitan", 3, "allgather", True)])
def test_a_plan_carries_its_frameworks_defaults(framework, zero, cp_comm, compiled):
    plan = ParallelPlan(global_batch=8, seq_len=4096, framework=framework)
    assert (plan.zero, plan.cp_comm_type, plan.torch_compile) == (zero, cp_comm, compiled)
    assert ParallelPlan.trusted(global_batch=8, seq_len=4096, framework=framework) == plan


def test_the_cp_exchange_is_normalised_at_cp_1():
    """At cp 1 there is no K/V exchange: two plans that differ only there are the same plan."""
    a = ParallelPlan(global_batch=8, seq_len=4096, cp_comm_type="a2a")
    assert a == ParallelPlan(global_batch=8, seq_len=4096) and a.cp_comm_type == "p2p"
    assert ParallelPlan(global_batch=8, seq_len=4096, cp=2, cp_comm_type="a2a").cp_comm_type == "a2a"
    assert ParallelPlan(global_batch=8, seq_len=4096, framework="torchtitan", cp_comm_type="p2p").cp_comm_type == \
        "allgather"


def test_changed_resolves_again_where_model_copy_would_not():
    plan = ParallelPlan(global_batch=8, seq_len=4096, cp=2, cp_comm_type="a2a")
    assert plan.changed(cp=1).cp_comm_type == "p2p"
    assert plan.model_copy(update={"cp": 1}).cp_comm_type == "a2a"  # why changed() exists


def test_estimate_prices_torchtitan_cp_as_the_search_does():
    """The issue's case: estimate and plan --fix of one torchtitan tp2·cp2 plan price it alike."""
    common = ["llama3-8b", "-c", "dgx-h100", "-n", "16", "-b", "32", "-s", "16384", "--framework", "torchtitan"]
    est = runner.invoke(app, ["estimate", *common, "--tp", "2", "--cp", "2", "--json"])
    assert est.exit_code == 0, est.output
    plan = runner.invoke(app, ["plan", *common, "--fix", "tp=2,pp=1,cp=2,mbs=1,zero=3,recompute=selective",
                               "--json", "-q", "--top", "1"])
    assert plan.exit_code == 0, plan.output
    e, p = json.loads(est.output), json.loads(plan.output)["plans"][0]
    assert e["parallel"]["cp_comm_type"] == p["parallel"]["cp_comm_type"] == "allgather"
    assert e["step_time_s"] == p["estimate"]["step_time_s"]
    assert e["peak_memory_bytes"] == p["estimate"]["peak_memory_bytes"]


# ---- inspect charges what estimate charges -------------------------------------------------------

def test_inspect_zero_bytes_are_the_frameworks_own():
    """Llama-3-8B at dp 8, bytes per parameter (hand-worked from each framework's 3 states):
    Megatron 2 + 4 + 12: zero 1 = 6 + 12/8 = 7.5, zero 2 (Megatron-FSDP optim_grads) = 2 + 16/8 = 4.0,
    zero 3 = 18/8 = 2.25; DeepSpeed 2 + 2 + 12: 4 + 1.5 = 5.5, 2 + 1.75 = 3.75, 2.0; torchtitan
    4 + 4 + 8, stages 2 and 3 both shard all 16 bytes: 2.0."""
    n = load_model("llama3-8b").total_params
    expect = {"megatron": {"0": 18.0, "1": 7.5, "2": 4.0, "3": 2.25},
              "deepspeed": {"0": 16.0, "1": 5.5, "2": 3.75, "3": 2.0},
              "torchtitan": {"0": 16.0, "2": 2.0, "3": 2.0}}
    for fw, per_param in expect.items():
        got = inspect("llama3-8b", dp=8, framework=Framework(fw))["model_state_bytes_per_gpu_by_zero"]
        assert {k: v / n for k, v in got.items()} == pytest.approx(per_param), fw
        for stage, value in got.items():  # exactly what estimate's memory term charges
            assert value == sum(model_state_bytes(n, Framework(fw), int(stage), 8).values())


# ---- exports to another framework are re-checked under it ----------------------------------------

def _plan_file(model: str, gpus: int, **fields):
    from autopar.cost.step import estimate
    from autopar.inputs import load_cluster, resolve_cost_model

    g, c = load_model(model), load_cluster("dgx-h100", gpus)
    plan = ParallelPlan(**fields)
    return plan_file_for(model, "dgx-h100", gpus, plan, estimate(g, c, plan, resolve_cost_model(c, None)))


def test_a_torchtitan_plan_is_not_exported_to_megatron_with_another_recompute():
    """The issue's case: Llama-3-70B on 64 H100, tp 2, ZeRO 3, per-op selective recompute."""
    pf = _plan_file("llama3-70b", 64, tp=2, zero=3, global_batch=64, seq_len=8192, framework="torchtitan")
    with pytest.raises(ExportError, match=r"recompute selective\(op\) under torchtitan would be "
                                          r"selective\(core_attn\) under megatron.*--framework megatron`"):
        export(pf, "megatron")
    assert "launch_torchtitan.sh" in export(pf, "torchtitan")


def test_zero_2_means_other_sharding_in_torchtitan():
    pf = _plan_file("llama3-8b", 16, zero=2, global_batch=64, seq_len=4096, recompute=Recompute(mode="full"),
                    framework="torchtitan")
    with pytest.raises(ExportError, match="zero 2 shards optimizer, gradients, weights under torchtitan but "
                                          "optimizer, gradients under megatron"):
        export(pf, "megatron")


def test_a_megatron_plan_that_fits_deepspeed_exports_and_one_that_does_not_refuses():
    """Llama-3-8B on 16 H100, full recompute: at mbs 1 it fits either way; at mbs 4 and 4,608 tokens it
    fits Megatron (69.1 GiB of 72) but not the Hugging Face model DeepSpeed runs (its eager norms and
    fp32 loss)."""
    fits = _plan_file("llama3-8b", 16, zero=1, global_batch=64, seq_len=4608, recompute=Recompute(mode="full"))
    assert fits.estimate["fits"] and "ds_config.json" in export(fits, "deepspeed")
    tight = _plan_file("llama3-8b", 16, zero=1, global_batch=64, seq_len=4608, mbs=4, recompute=Recompute(mode="full"))
    assert tight.estimate["fits"]
    with pytest.raises(ExportError, match=r"under deepspeed it needs 74.9 GiB per GPU of the 72.0 usable.*"
                                          r"re-plan it for deepspeed with `autopar plan llama3-8b"):
        export(tight, "deepspeed")


def test_the_same_framework_exports_without_a_recheck():
    pf = _plan_file("llama3-8b", 16, zero=1, global_batch=64, seq_len=4096)
    assert "launch_megatron.sh" in export(pf, "megatron")


# ---- models a framework cannot train are refused before any search -------------------------------

def test_deepseek_v3_under_torchtitan_is_refused_for_its_mtp_before_the_search():
    from autopar.search.space import space_spec_for, valid_bases
    from autopar.inputs import load_cluster

    g, c = load_model("deepseek-v3"), load_cluster("hgx-h800", 2048)
    spec = space_spec_for(g, c, 4096, 15360, framework="torchtitan")
    with pytest.raises(NoFeasiblePlanError) as err:
        valid_bases(spec)
    message = str(err.value)
    assert message.startswith("torchtitan cannot train deepseek-v3 in any layout: 1 MTP layer(s)")
    assert "GPU" not in message  # a model-level reason, not worded as the GPU count's


def test_refusals_are_one_function_for_search_and_export():
    spec = preset("qwen3-30b-a3b")
    plan = ParallelPlan(tp=2, ep=4, global_batch=64, seq_len=4096, framework="torchtitan")
    assert any("etp 2" in r for r in plan_refusals(spec, 32, plan))
    assert not plan_violations(plan, num_gpus=32, num_layers=spec.num_layers, num_heads=spec.num_attention_heads,
                               num_kv_heads=spec.kv_heads, num_experts=spec.moe.num_experts)


def test_deepspeed_prices_selective_recompute_as_its_hf_script_runs_it():
    """The exported train_deepspeed.py makes no call for selective core-attention recompute (SDPA
    and flash attention keep no scores), so the estimate of a DeepSpeed plan prices it as none: the
    same step and peak. Megatron-DeepSpeed (the measured runs' release) recomputes as Megatron does."""
    from autopar import api

    def est(recompute, release=None):
        plan = api.plan_from_assignments(f"recompute={recompute}", 8, 16, 8192, framework="deepspeed", zero=3,
                                         framework_release=release)
        return api.estimate_plan("llama3-8b", "dgx-h100", 8, plan)

    none, selective = est("none"), est("selective")
    assert selective.step_time_s == none.step_time_s and selective.peak_memory_bytes == none.peak_memory_bytes
    mds_none, mds_selective = est("none", "megatron-deepspeed"), est("selective", "megatron-deepspeed")
    assert mds_selective.step_time_s > mds_none.step_time_s
