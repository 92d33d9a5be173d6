"""ZeRO-3 at scale: what DeepSpeed's 2021 release launched (synchronous gathers, one copy kernel per
rank of the list-form collectives), DeepSpeed's persistent small parameters, the parameter-gather
overlap switch, and the unsharded memory of module-level gathering. Hand-worked numbers."""

from dataclasses import replace

import pytest

from autopar.cost import comm, fsdp
from autopar.frameworks import REGISTRY, framework_profile
from autopar.cost.layer import LayerCost
from autopar.cost.memory import model_state_bytes
from autopar.cost.params import load_cost_model
from autopar.cost.step import assign_layers, rank_chunks, rank_memory, setup
from autopar.hardware import load_cluster
from autopar.model import load_model
from autopar.schema.plan import ParallelPlan, Recompute, plan_violations
from autopar.validate import runner
from autopar.validate.dataset import load_runs

LLAMA8 = load_model("llama3-8b")
LAYER = LLAMA8.decoder_layers[0]
_, A100 = load_cost_model("a100")


def test_release_profiles_are_the_ones_the_plan_accepts():
    declared = set(ParallelPlan.model_fields["framework_release"].annotation.__args__[0].__args__)
    assert {r for spec in REGISTRY.values() for r in spec.release_names} == declared
    old, new = framework_profile("deepspeed", "0.3"), framework_profile("deepspeed")
    assert old.synchronous_gathers and old.per_rank_copies and old.gathered_bytes_per_unit_param == 6.0
    assert not new.synchronous_gathers and not new.per_rank_copies and new.gathered_bytes_per_unit_param == 4.0
    assert old.gather_unit == new.gather_unit == "module"


def test_a_release_the_framework_does_not_have_is_refused_with_the_fix():
    plan = ParallelPlan(global_batch=8, seq_len=2048, framework="megatron", framework_release="0.3")
    out = plan_violations(plan, num_gpus=8, num_layers=32, num_heads=32, num_kv_heads=8)
    assert any("megatron has no release profile '0.3'" in v and "leave framework_release unset" in v for v in out)
    ok = ParallelPlan(global_batch=8, seq_len=2048, framework="deepspeed", framework_release="0.3", zero=3)
    assert not plan_violations(ok, num_gpus=8, num_layers=32, num_heads=32, num_kv_heads=8)


def test_deepspeed_never_gathers_parameters_under_its_persistence_threshold():
    """stage3_param_persistence_threshold 1e5: Llama-3 8B's widest output is 28,672 (w1+w3), so its
    norm weights (4,096 each) stay whole; with a 1e4 threshold they would be gathered."""
    plan = ParallelPlan(global_batch=8, seq_len=8192, zero=3)
    assert fsdp.gather_units(LAYER, plan, "module", 1e5) == [4096 * 6144, 4096 * 4096, 4096 * 28672, 14336 * 4096]
    assert fsdp.gather_units(LAYER, plan, "module", 1e4)[4] == 2 * 4096


def test_list_collective_copies_one_kernel_per_rank_by_hand():
    """1 GB gathered over 1,536 ranks, A100 HBM 2,039 GB/s at 90 %: the buffer is read and written
    once (2e9 / 1.8351e12 = 1.0899 ms) plus 1,536 copy kernels of 8 us (12.288 ms)."""
    assert fsdp.LIST_COPY_KERNEL_S == pytest.approx(1.1e-3 / (16 * 8 + 8), rel=0.02)  # DeepSpeed PR #1188
    cluster = load_cluster("dgx-a100-80gb", 1536)
    p = replace(A100, hbm_efficiency=0.9)
    assert fsdp.per_rank_copies_s(1e9, 1536, cluster, p) == pytest.approx(2e9 / (2039e9 * 0.9) + 1536 * 8e-6, rel=1e-9)
    assert fsdp.per_rank_copies_s(1e9, 1536, cluster, p) == pytest.approx(0.013378, abs=1e-6)
    assert fsdp.per_rank_copies_s(1e9, 1, cluster, p) == 0.0


def _exposed(plan: ParallelPlan, compute_s: float, gpus: int = 64) -> tuple[float, float]:
    """(exposed ZeRO-3 time of two Llama-3 8B layers, sum of their units' collectives with copies)."""
    cluster = load_cluster("dgx-a100-80gb", gpus)
    st = setup(LLAMA8, cluster, plan, A100)
    cost = LayerCost(compute_s, 2 * compute_s, 0, 0, 0, 0, 0, 0, ())
    got = fsdp.exposed_per_microbatch_s([(LAYER, cost, "none")] * 2, plan, st.dp_span, cluster, A100)
    fw = framework_profile(plan.framework, plan.framework_release)
    n = st.dp_span.size if fw.per_rank_copies else 1
    units = fsdp.gather_units(LAYER, plan, fw.gather_unit, fw.persistence_threshold_params)
    grad = fsdp.GRAD_REDUCE_BYTES[plan.framework]
    total = 2 * sum(2 * (comm.all_gather_s(u * 2, st.dp_span, cluster, A100) + fsdp.per_rank_copies_s(u * 2, n, cluster, A100))
                + comm.reduce_scatter_s(u * grad, st.dp_span, cluster, A100) + fsdp.per_rank_copies_s(u * grad, n, cluster, A100)
                for u in units)
    return got, total


def test_deepspeed_2021_gathers_synchronously_so_nothing_hides():
    """torch.cuda.synchronize() before every gather (DeepSpeed <= 0.5.5): with a second of compute per
    layer, all of the layer's gathers, reduce-scatters and per-rank copies stay exposed."""
    plan = ParallelPlan(global_batch=64, seq_len=8192, zero=3, framework="deepspeed", framework_release="0.3",
                        recompute=Recompute(mode="none"))
    got, total = _exposed(plan, 1.0)
    assert got == pytest.approx(total, rel=1e-12)
    current, current_total = _exposed(plan.model_copy(update={"framework_release": None}), 1.0)
    assert current < current_total  # today's DeepSpeed prefetches the modules under 5e7 parameters
    assert current_total < total  # and pays no per-rank copies


def test_parameter_gather_overlap_off_exposes_every_gather():
    plan = ParallelPlan(global_batch=64, seq_len=8192, zero=3, framework="torchtitan", recompute=Recompute(mode="none"))
    on, total = _exposed(plan, 1.0)
    off, _ = _exposed(plan.model_copy(update={"overlap_param_gather": False}), 1.0)
    assert on < off == pytest.approx(total, rel=1e-12)


def test_per_rank_copies_grow_with_the_group_and_dominate_at_1536_ranks():
    """Same two layers, 64 vs 1,536 ranks, no recompute: each of the four gathered modules runs two
    gathers and a reduce-scatter, and each of those 12 collectives pays 1,536 − 64 more ring steps
    (alpha each) and 1,536 − 64 more copy kernels (8 us each)."""
    plan = ParallelPlan(global_batch=1536, seq_len=8192, zero=3, framework="deepspeed", framework_release="0.3",
                        recompute=Recompute(mode="none"))
    _, small = _exposed(plan, 0.0, 64)
    _, large = _exposed(plan, 0.0, 1536)
    units = len(fsdp.gather_units(LAYER, plan, "module", 1e5))
    copies = 3 * units * (1536 - 64) * fsdp.LIST_COPY_KERNEL_S
    latency = 3 * units * (1535 - 63) * load_cluster("dgx-a100-80gb", 64).inter_node_latency_s
    assert large - small == pytest.approx(2 * (copies + latency), rel=0.02)


def test_deepspeed_2021_holds_one_module_its_gradient_and_the_flat_copy():
    """GPT 530B (h 20,480) on 640 A100s, tp 1: the largest gather unit is an MLP weight, 4h^2 =
    1.6777e9 parameters; DeepSpeed 0.3 holds its 16-bit weights, its 16-bit gradient and the list
    collective's flat copy: 6 x 1.6777e9 = 10.07e9 bytes (FSDP2's two blocks would be 20.1e9)."""
    run = next(r for r in load_runs({"narayanan21-zero3"}) if r.run_id.endswith("530b_640gpu"))
    cluster = runner._cluster_for(run.cluster, run.num_gpus)
    graph = runner._graph_for(run)
    plan = ParallelPlan(global_batch=2560, seq_len=2048, mbs=4, zero=3, framework="deepspeed", framework_release="0.3",
                        recompute=Recompute(mode="full"))
    st = setup(graph, cluster, plan, A100)
    chunks = rank_chunks(assign_layers(graph, st.layout), st.layout)
    _, breakdown, _, _ = rank_memory(0, chunks[0], graph, plan, st, A100)
    assert breakdown["fsdp_gathered"] == pytest.approx(6 * 4 * 20480 ** 2, rel=1e-9)


def test_every_zero3_run_of_the_2021_comparison_fits_under_the_default_margin():
    for run in load_runs({"narayanan21-zero3"}):
        pred = runner.predict(run, A100)
        assert pred.fits, run.run_id
        assert pred.plan.framework_release == "0.3"


def test_grad_reduce_in_bf16_keeps_megatron_gradients_in_two_bytes():
    """Megatron, distributed optimizer over 2 ranks, 1e9 parameters: weights 2e9 bytes, gradients
    4e9 (fp32 main grads) or 2e9 (--grad-reduce-in-bf16), optimizer 12e9 / 2 = 6e9."""
    from autopar.cost import memory

    assert memory.model_state_bytes(1e9, "megatron", 1, 2) == {"weights": 2e9, "gradients": 4e9, "optimizer": 6e9}
    g = memory.main_grad_bytes("megatron", True)
    assert memory.model_state_bytes(1e9, "megatron", 1, 2, g) == {"weights": 2e9, "gradients": 2e9, "optimizer": 6e9}
    bad = ParallelPlan(global_batch=8, seq_len=2048, framework="torchtitan", zero=3, grad_reduce_in_bf16=True)
    out = plan_violations(bad, num_gpus=8, num_layers=32, num_heads=32, num_kv_heads=8)
    assert any("grad_reduce_in_bf16 is Megatron's --grad-reduce-in-bf16" in v for v in out)


def test_grad_reduce_in_bf16_round_trips_through_megatron_arguments():
    from autopar.export import megatron_args
    from autopar.export.importers import plan_from_megatron_args
    from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
    from autopar.model import load_spec
    from autopar.schema.plan_file import PlanFile, PlanTarget

    for on in (True, False):
        plan = ParallelPlan(tp=2, global_batch=8, seq_len=2048, grad_reduce_in_bf16=on)
        pf = PlanFile(autopar_version="test", parallel=plan,
                      target=PlanTarget(model="llama3-8b", model_spec=load_spec("llama3-8b"), cluster="dgx-h100", gpus=8))
        argv = megatron_args(pf)
        assert ("--grad-reduce-in-bf16" in argv) is on
        assert megatron_violations(parse_megatron_argv(argv), 8) == []
        back, _ = plan_from_megatron_args(argv, num_gpus=8)
        assert back.grad_reduce_in_bf16 is on


def _rank0_memory(run, p, plan=None):
    """(peak, breakdown, dense params) of pipeline rank 0 of a measured run under `plan` (default: the
    plan runner.predict chooses for it), and that prediction."""
    pred = runner.predict(run, p)
    plan = plan or pred.plan
    cluster, graph = runner._cluster_for(run.cluster, run.num_gpus), runner._graph_for(run)
    st = setup(graph, cluster, plan, p)
    chunks = rank_chunks(assign_layers(graph, st.layout), st.layout)
    total, breakdown, dense, _ = rank_memory(0, chunks[0], graph, plan, st, p)
    return total, breakdown, dense, pred


def test_nemotron_340b_on_128_h100_fits_with_its_recipes_bf16_gradients():
    """tp8 pp8 vpp12 dp2: 340B / 64 = 5.77e9 parameters per GPU; bf16 gradients save 2 bytes each
    (10.75 GiB) over fp32 main grads, and the run fits under the default 10 % margin."""
    run = next(r for r in load_runs({"nemo-24.07"}) if r.run_id == "nemo2407_h100_fp8_nemotron_340b_128gpu")
    assert run.grad_reduce_in_bf16
    _, h100 = load_cost_model("h100")
    _, b16, dense, pred = _rank0_memory(run, h100)
    assert pred.fits and pred.plan.grad_reduce_in_bf16
    assert b16["gradients"] == pytest.approx(2.0 * dense, rel=1e-9)
    _, b32, _, _ = _rank0_memory(run, h100, pred.plan.model_copy(update={"grad_reduce_in_bf16": False}))
    assert b32["gradients"] - b16["gradients"] == pytest.approx(2.0 * dense, rel=1e-9)


def test_nemo_apex_release_keeps_ten_optimizer_bytes_per_parameter():
    """NeMo 1.x's Apex DistributedFusedAdam with store_param_remainders keeps exp_avg (4) + exp_avg_sq
    (4) + the fp32 master weight's low 16 bits (2) = 10 bytes per parameter, sharded over DP; Megatron's
    distributed optimizer keeps 12. Hand-worked on rank 0 of Nemotron-4 340B, tp8 pp8 vpp12 dp2:
    5.77e9 local parameters, 10 / 2 = 5 bytes each instead of 6."""
    assert framework_profile("megatron", "nemo-apex").optimizer_bytes_per_param == 10.0
    assert framework_profile("megatron", None).optimizer_bytes_per_param is None
    states = model_state_bytes(1e9, "megatron", 1, 2, 2.0, 10.0)
    assert states == {"weights": 2e9, "gradients": 2e9, "optimizer": 5e9}
    run = next(r for r in load_runs({"nemo-24.07"}) if r.run_id == "nemo2407_h100_fp8_nemotron_340b_128gpu")
    assert run.framework_release == "nemo-apex"
    _, h100 = load_cost_model("h100")
    _, apex, dense, pred = _rank0_memory(run, h100)
    _, dist, _, _ = _rank0_memory(run, h100, pred.plan.model_copy(update={"framework_release": None}))
    assert apex["optimizer"] == pytest.approx(5.0 * dense, rel=1e-9)
    assert dist["optimizer"] - apex["optimizer"] == pytest.approx(1.0 * dense, rel=1e-9)


def test_model_states_reserve_their_bytes_and_only_the_step_s_allocations_fragment():
    """Nemotron-4 340B BF16 on 128 H100 (dgxc v25.01, NeMo 24.11: tp8 pp8 vpp12, dp 2) ran. Rank 0
    holds 5.77e9 parameters: 2 (bf16 weight) + 2 (bf16 gradient buffer) + 10 / 2 (Apex's sharded
    states) = 9 bytes each, 51.9 GB, allocated once; its 103 in-flight chunk forwards hold 27.5 GB of
    activations. Fragmentation (5 %) taken on everything put the rank at 80.14 GiB of 80; taken
    only on what each step allocates and frees it is 77.3 GiB and the recipe fits."""
    from autopar.cost import memory as mem

    assert mem.peak_reserved_bytes(50.0, 10.0, 1.0, 2.0, 0.05) == pytest.approx(50 + 10 * 1.05 + 3)
    assert mem.peak_reserved_bytes(50.0, 0.0, 1.0, 2.0, 0.05) == pytest.approx(53.0)
    run = next(r for r in load_runs({"dgxc-nemo24"}) if r.run_id == "dgxc_v2501_nemotron4_340b_bf16_h100_128gpu")
    _, h100 = load_cost_model("h100")
    total, b, dense, pred = _rank0_memory(run, h100)
    assert dense == pytest.approx(5.771e9, rel=1e-3)
    states = b["weights"] + b["gradients"] + b["optimizer"]
    assert states == pytest.approx(9.0 * dense, rel=1e-9)
    fixed = h100.cuda_context_bytes + h100.comm_buffer_bytes
    assert total == pytest.approx(states + b["activations"] * (1 + h100.fragmentation) + fixed, rel=1e-9)
    assert total / 2**30 == pytest.approx(77.3, abs=0.1) and pred.fits


def test_recipes_name_their_optimizer():
    """The dgxc 24.x recipes with distributed_fused_adam run the nemo-apex release; Grok-1's recipe
    (mcore_distributed_optim) and the NeMo 2.0 (25.x) tables run Megatron's distributed optimizer."""
    runs = load_runs({"dgxc-nemo24", "dgxc-nemo25"})
    assert all(r.framework_release == "nemo-apex" for r in runs if "llama31" in r.run_id and r.source == "dgxc-nemo24")
    assert all(r.framework_release is None for r in runs if "grok" in r.run_id or r.source == "dgxc-nemo25")


def test_torchtitan_pipeline_keeps_the_stage_unsharded_through_the_step():
    """torchtitan with pp > 1: reshard_after_forward=False (parallelize.apply_fsdp) and PyTorch's
    pipelining skips resharding and gradient reduction until the last backward (stage.py
    backward_maybe_with_nosync). Each stage parameter holds its bf16 weight (2) and its unsharded fp32
    gradient (4) through the step, 6 bytes; hand-worked on Llama-3-70B, tp8 pp4 dp8: rank 0's local
    parameters × 6. Its FSDP traffic is one gather and one reduce-scatter pass per step."""
    from autopar.cost import memory as mem

    graph, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", 256)
    _, h100 = load_cost_model("h100")
    plan = ParallelPlan(tp=8, pp=4, zero=3, framework="torchtitan", global_batch=256, seq_len=8192,
                        recompute=Recompute(mode="full"))
    assert mem.pipelined_held_bytes_per_param("torchtitan", 3, 4) == 6.0
    assert fsdp.stage_stays_unsharded(plan) and fsdp.passes_per_step(plan, 32) == 1
    assert not fsdp.stage_stays_unsharded(plan.changed(pp=1))
    assert not fsdp.stage_stays_unsharded(plan.changed(framework="megatron", zero=3))
    st = setup(graph, cluster, plan, h100)
    chunks = rank_chunks(assign_layers(graph, st.layout), st.layout)
    _, breakdown, dense, expert = rank_memory(0, chunks[0], graph, plan, st, h100)
    assert breakdown["fsdp_gathered"] == pytest.approx(6.0 * (dense + expert), rel=1e-12)
    assert 2.0e9 < dense < 2.5e9  # 70.6e9 / 32 plus rank 0's embedding share
    # pp 1 keeps only the gathered blocks (4 bytes per parameter of the largest unit)
    flat = plan.changed(pp=1, tp=8)
    st1 = setup(graph, cluster, flat, h100)
    _, b1, _, _ = rank_memory(0, rank_chunks(assign_layers(graph, st1.layout), st1.layout)[0], graph, flat, st1, h100)
    assert b1["fsdp_gathered"] < 0.1 * breakdown["fsdp_gathered"]


def test_deepspeed_2021_regathers_its_persistent_parameters_after_every_step():
    """DeepSpeed 0.3.13-0.5.4: every norm weight and bias and every linear bias (under 1e5 elements) is
    re-partitioned at the end of backward and gathered again after the step, one copy kernel per
    parameter per rank (partition_parameters._allgather_params). Megatron's GPT 175B (h 12,288) has 8
    such tensors a layer: two LayerNorms' weight and bias, the qkv, proj, fc1 and fc2 biases; on 1,536
    ranks that is 96 · 8 · 1,536 copies of 8 µs = 9.44 s a step, plus one all-gather of their 16-bit
    slices."""
    from autopar.cost import comm
    from autopar.cost.fsdp import LIST_COPY_KERNEL_S, per_rank_copies_s, persistent_regather_s, persistent_tensors

    run = next(r for r in load_runs({"narayanan21-zero3"}) if r.run_id.endswith("175b_1536gpu"))
    cluster, graph = runner._cluster_for(run.cluster, run.num_gpus), runner._graph_for(run)
    plan = ParallelPlan(global_batch=1536, seq_len=2048, mbs=1, zero=3, framework="deepspeed", framework_release="0.3",
                        recompute=Recompute(mode="full"))
    h = 12288
    layer = graph.decoder_layers[0]
    assert persistent_tensors(layer, plan, 1e5) == (8, 4 * h + 3 * h + h + 4 * h + h)
    st = setup(graph, cluster, plan, A100)
    t = persistent_regather_s([list(graph.decoder_layers)], plan, st.dp_span, cluster, A100)
    gathered = 96 * 13 * h * 2.0
    expected = (comm.all_gather_s(gathered, st.dp_span, cluster, A100)
                + per_rank_copies_s(gathered, 1536, cluster, A100) + 96 * 8 * 1536 * LIST_COPY_KERNEL_S)
    assert t == pytest.approx(expected, rel=1e-12) and 96 * 8 * 1536 * 8e-6 == pytest.approx(9.437, abs=1e-3)
    # the current DeepSpeed (coalesced, _all_gather_base) and Megatron pay nothing of it
    assert persistent_regather_s([list(graph.decoder_layers)], plan.changed(framework_release=None), st.dp_span,
                                 cluster, A100) == 0.0


def test_torchtitan_zero2_under_pp_accumulates_unsharded_gradients_too():
    """torchtitan's zero 2 keeps the stage's bf16 weights gathered (2 bytes a parameter); under pp the
    pipelining's deferred reduction adds the unsharded fp32 gradients: 2 + 4 = 6 bytes a stage
    parameter, as at zero 3; without pp, 2. Megatron's ZeRO-3 holds its largest unit (4 bytes each)."""
    from autopar.cost.memory import fsdp_transient_bytes

    assert fsdp_transient_bytes(1e9, 1e8, "torchtitan", 2, 4.0, pp=4) == 6e9
    assert fsdp_transient_bytes(1e9, 1e8, "torchtitan", 2, 4.0, pp=1) == 2e9
    assert fsdp_transient_bytes(1e9, 1e8, "torchtitan", 3, 4.0, pp=4) == 6e9
    assert fsdp_transient_bytes(1e9, 1e8, "megatron", 3, 4.0, pp=4) == 4e8
