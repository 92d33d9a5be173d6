"""Cost terms against hand-worked and published values."""

import math

import pytest

from autopar.api import estimate_plan, make_plan
from autopar.cost import comm, memory
from autopar.cost.params import load_cost_model
from autopar.cost.pipeline import simulate_1f1b, simulate_interleaved
from autopar.cost.step import pipeline_step_s, stage_layer_counts
from autopar.hardware import load_cluster
from autopar.model import load_model
from autopar.validate.report import validate

GPT3 = load_model("gpt3-175b")
LAYER = GPT3.layers[1]
S, H, A = 2048, 12288, 96


def korthikanti_bytes(t, mode):
    """Korthikanti et al. 2022 Table 2, per layer per sequence (b = 1): tensor + sequence parallel."""
    if mode == "none":
        return S * H * (34 / t + 5 * A * S / (H * t))
    if mode == "selective":
        return S * H * 34 / t
    return 2 * S * H / t


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_activation_memory_matches_korthikanti(t, mode):
    got = memory.saved_activation_bytes(LAYER, S, S, t, True, mode, ("core_attn",))
    assert got == pytest.approx(korthikanti_bytes(t, mode), rel=1e-12)


def test_tp_without_sp_keeps_norm_and_dropout_tensors_whole():
    # Korthikanti Eq. 2 (tp only): sbh(10 + 24/t + 5as/(ht)).
    t = 8
    got = memory.saved_activation_bytes(LAYER, S, S, t, False, "none")
    assert got == pytest.approx(S * H * (10 + 24 / t + 5 * A * S / (H * t)), rel=1e-12)


def test_zero_bytes_per_parameter_deepspeed():
    # Rajbhandari et al. 2020 §3: 2 + 2 + 12 = 16 bytes/param; stages shard optimizer, grads, weights.
    d = 64
    total = lambda z: sum(memory.model_state_bytes(1.0, "deepspeed", z, d).values())
    assert total(0) == 16
    assert total(1) == pytest.approx(4 + 12 / d)
    assert total(2) == pytest.approx(2 + 14 / d)
    assert total(3) == pytest.approx(16 / d)


def test_megatron_distributed_optimizer_bytes():
    # Megatron-LM distrib_optimizer.md: fp16/bf16 params + fp32 grads: 18 bytes, distributed 6 + 12/d.
    assert sum(memory.model_state_bytes(1.0, "megatron", 0, 8).values()) == 18
    assert sum(memory.model_state_bytes(1.0, "megatron", 1, 8).values()) == pytest.approx(6 + 12 / 8)


def test_inflight_microbatches():
    # 1F1B: stage i holds p - i microbatches (Narayanan'21 §2.2); interleaved: Megatron warm-up + 1.
    assert [memory.inflight_microbatches_1f1b(4, r, 16) for r in range(4)] == [4, 3, 2, 1]
    assert memory.inflight_microbatches_1f1b(4, 0, 2) == 2
    assert memory.inflight_chunks_interleaved(4, 2, 0, 16) == 3 * 2 + 4 + 1


@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (8, 32, 1), (4, 8, 2), (8, 16, 4), (2, 2, 2)])
def test_pipeline_closed_form_equals_simulation_and_narayanan_bubble(p, m, v):
    f, b = 1.0, 2.0  # per-rank times of one microbatch
    base, _ = pipeline_step_s([f] * p, [b] * p, m, v, 0.0)
    sim = simulate_1f1b([f] * p, [b] * p, m) if v == 1 else simulate_interleaved([f / v] * (p * v), [b / v] * (p * v), m, v)
    assert base == pytest.approx(sim.step_s, rel=1e-12)
    # Narayanan'21: bubble / ideal = (p - 1)/m, interleaved (p - 1)/(m·v).
    assert (base - m * (f + b)) / (m * (f + b)) == pytest.approx((p - 1) / (m * v), rel=1e-12)


def test_pipeline_closed_form_bounds_nonuniform_simulation():
    f, b, m = [1.2, 1.0, 1.0, 1.5], [2.4, 2.0, 2.0, 3.0], 8
    base, _ = pipeline_step_s(f, b, m, 1, 0.0)
    assert simulate_1f1b(f, b, m).step_s <= base + 1e-12


def test_stage_layer_counts_llama3_405b():
    # Llama 3 (Dubey et al. 2024 §3.3.2): 126 layers on 16 stages, one fewer on the first and last.
    counts = stage_layer_counts(126, 16)
    assert counts[0] == counts[-1] == 7 and set(counts[1:-1]) == {8} and sum(counts) == 126


def test_group_span_from_rank_order():
    assert comm.group_span(8, 1, 8) == comm.GroupSpan(8, 8, 1)  # tp inside a node
    assert comm.group_span(16, 8, 8) == comm.GroupSpan(16, 1, 16)  # dp after tp8: one rank per node
    assert comm.group_span(8, 2, 8) == comm.GroupSpan(8, 4, 2)


def test_all_reduce_hand_worked():
    cluster = load_cluster("dgx-h100", 16)
    p = load_cost_model("h100")[1]
    span = comm.group_span(16, 8, 8)  # one GPU per node: each GPU's rail NIC, 400 Gb/s
    size = 1e9
    bw = 400e9 / 8 * p.inter_node_efficiency
    eff = size / (size + p.half_message_bytes)
    latency = cluster.inter_node_latency_s * min(30, 8) + p.collective_overhead_s
    assert comm.all_reduce_s(size, span, cluster, p) == pytest.approx(latency + 2 * 15 / 16 * size / (bw * eff))


def test_estimate_breakdown_sums_to_step_time():
    plan = make_plan(tp=8, pp=4, vpp=5, global_batch=128, seq_len=8192)
    e = estimate_plan("llama3-70b", "dgx-h100", 64, plan)
    assert sum(e.time_breakdown_s.values()) == pytest.approx(e.step_time_s, rel=1e-9)
    assert e.tokens_per_s_per_gpu == pytest.approx(128 * 8192 / e.step_time_s / 64)
    assert 0 < e.mfu < 1 and e.fits


def test_more_recompute_is_slower_and_smaller():
    base = dict(tp=8, pp=4, global_batch=128, seq_len=8192)
    none = estimate_plan("llama3-70b", "dgx-h100", 64, make_plan(**base, recompute={"mode": "none"}))
    full = estimate_plan("llama3-70b", "dgx-h100", 64, make_plan(**base, recompute={"mode": "full"}))
    assert full.step_time_s > none.step_time_s and full.peak_memory_bytes < none.peak_memory_bytes


# The shipped models are fitted on every split: the honest test withholds a whole source, refits
# without it and scores it (few iterations here; README: the full leave-one-source-out figures).
def test_withheld_source_accuracy():
    from autopar.calibration.loso import leave_one_source_out

    result = leave_one_source_out(iters=3, sources={"korthikanti22"})
    assert result["sources"][0]["runs"] == 10
    assert result["median_ape"] <= 10.0 and result["fit_rate"] == 1.0


def test_every_published_run_fits():
    result = validate("all", sources={"narayanan21", "korthikanti22", "megatron-readme", "nemo-24.07",
                                      "megatron-llama3-fp8"})
    assert result["rows"] and all(r["fits"] for r in result["rows"])
    assert result["summary"]["mape"] <= 0.10


def test_memory_overheads_are_the_stated_constants():
    # Peak = allocated · (1 + fragmentation) + comm buffers + CUDA context, constants from the file.
    f, p = load_cost_model("h100")
    gib = 1024**3
    assert p.cuda_context_bytes == f.memory.cuda_context_gib * gib
    assert memory.with_overheads(10 * gib, p.cuda_context_bytes, p.comm_buffer_bytes, p.fragmentation) == \
        pytest.approx(10 * gib * (1 + f.memory.fragmentation) + (f.memory.comm_buffer_gib + f.memory.cuda_context_gib) * gib)


def test_cp_shards_optimizer_with_dp():
    # Megatron shards the distributed optimizer over dp·cp: cp 2 / dp 4 holds the same states as dp 8.
    cp = estimate_plan("llama3-8b", "dgx-h100", 8, make_plan(cp=2, global_batch=128, seq_len=8192))
    dp = estimate_plan("llama3-8b", "dgx-h100", 8, make_plan(global_batch=128, seq_len=8192))
    assert cp.memory_breakdown_bytes["optimizer"] == pytest.approx(dp.memory_breakdown_bytes["optimizer"])


def test_nemo_llama3_8b_cp2_fp8_fits():
    # NVIDIA NeMo 24.07: Llama 3 8B, 8 H100s, tp1 pp1 cp2 dp4, mbs 1, gbs 128, seq 8192, fp8 ran.
    # It ran, so it fits the whole HBM (memory margin 0; the planning margin keeps 10 % free).
    e = estimate_plan("llama3-8b", "dgx-h100", 8, make_plan(cp=2, global_batch=128, seq_len=8192, precision="fp8",
                                                            recompute={"mode": "none"}), memory_margin=0.0)
    assert e.fits and e.usable_memory_bytes == e.memory_capacity_bytes


def test_param_gather_overlap_defaults_to_having_a_sharded_optimizer():
    # Megatron: --overlap-param-gather needs --use-distributed-optimizer; the default follows zero.
    assert make_plan(global_batch=8, seq_len=4096, zero=0).overlap_param_gather is False
    assert make_plan(global_batch=8, seq_len=4096, zero=1).overlap_param_gather is True
    assert make_plan(global_batch=8, seq_len=4096, zero=0, overlap_param_gather=True).overlap_param_gather is True
