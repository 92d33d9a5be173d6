"""MoE and context parallelism: per-GPU parameters by hand, CP variants, dispatchers, the search."""

import pytest

from autopar.api import estimate_plan, make_plan, search_plans
from autopar.errors import InvalidPlanError


def test_mixtral_params_per_gpu_hand_count():
    # Mixtral-8x7B, tp2 pp1 ep8 (etp = tp = 2) on 16 GPUs. Per layer: attention 41,943,040 split by
    # tp; two RMSNorms (8,192) and the router (4096·8 = 32,768) replicated; 8 experts ·
    # 3·4096·14336 = 1,409,286,144 split by ep·etp = 16. Embedding and head 32000·4096 each split
    # by tp; final norm 4,096.
    per_layer = 41_943_040 // 2 + 8_192 + 32_768 + 1_409_286_144 // 16
    expected = 32 * per_layer + 2 * 131_072_000 // 2 + 4_096
    e = estimate_plan("mixtral-8x7b", "dgx-h100", 16, make_plan(tp=2, ep=8, global_batch=64, seq_len=4096))
    assert e.stages[0].params == expected == 3_622_047_744


def test_deepseek_params_per_gpu_hand_count_middle_stage():
    # DeepSeek-V3, tp1 pp16 ep64 on 1024 GPUs: 61 layers on 16 stages -> stage 1 holds 4 MoE layers
    # (layers 3..6). Per MoE layer on one GPU: MLA 187,107,328 (q_down 7168·1536 and kv_down
    # 7168·576 replicated, norms 1536 + 512 + 2·7168, the rest split by tp = 1) + shared expert
    # 3·7168·2048 + router 256·7168 + 256/64 = 4 routed experts of 3·7168·2048.
    moe_layer = 187_107_328 + 14_336 + 44_040_192 + 1_835_008 + 4 * 44_040_192
    e = estimate_plan("deepseek-v3", "hgx-h800", 1024, make_plan(pp=16, ep=64, global_batch=1024, seq_len=4096))
    assert e.stages[1].layers == (4,)
    assert e.stages[1].params == 4 * moe_layer


def test_expert_states_shard_over_expert_dp():
    # tp1 pp1 ep8 on 8 GPUs: dense dp 8, expert dp 1 -> expert optimizer states are not sharded.
    e = estimate_plan("qwen3-30b-a3b", "dgx-h100", 8, make_plan(ep=8, global_batch=8, seq_len=4096,
                                                                recompute={"mode": "full"}))
    dense = 30_532_122_624 - 48 * 128 * 3 * 2048 * 768
    expert_local = 48 * 16 * 3 * 2048 * 768
    assert e.memory_breakdown_bytes["optimizer"] == pytest.approx(12 * (dense / 8 + expert_local))


def test_cp_variants_and_a2a_head_rule():
    base = dict(tp=1, cp=8, global_batch=8, seq_len=131072, recompute={"mode": "full"})
    times = {t: estimate_plan("llama3-8b", "dgx-h100", 8, make_plan(**base, cp_comm_type=t)).time_breakdown_s["cp_comm"]
             for t in ("p2p", "a2a", "allgather")}
    assert times["p2p"] < times["allgather"] and times["p2p"] < times["a2a"]
    with pytest.raises(InvalidPlanError, match="a2a"):
        estimate_plan("llama3-8b", "dgx-h100", 16, make_plan(tp=1, cp=16, global_batch=1, seq_len=131072,
                                                             cp_comm_type="a2a"))


def test_capacity_factor_caps_load_and_allgather_dispatcher_priced():
    base = dict(ep=8, global_batch=64, seq_len=4096, moe_load_imbalance=1.5)
    dropless = estimate_plan("mixtral-8x7b", "dgx-h100", 8, make_plan(**base))
    capped = estimate_plan("mixtral-8x7b", "dgx-h100", 8, make_plan(**base, moe_capacity_factor=1.0))
    assert capped.step_time_s < dropless.step_time_s
    ag = estimate_plan("mixtral-8x7b", "dgx-h100", 8, make_plan(**base, moe_dispatcher="allgather"))
    assert ag.time_breakdown_s["ep_comm"] > 0 and ag.time_breakdown_s["ep_comm"] != dropless.time_breakdown_s["ep_comm"]


def test_128k_llama_plan_uses_cp_and_fits():
    result = search_plans("llama3-8b", "dgx-h100", 64, 131072, 32, top=1)
    plan, est = result.plans[0]
    assert plan.cp > 1 and est.fits


def test_moe_search_uses_ep():
    result = search_plans("mixtral-8x7b", "dgx-h100", 64, 4096, 256, top=1)
    plan, est = result.plans[0]
    assert plan.ep > 1 and est.fits
