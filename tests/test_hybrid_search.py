"""Search over hybrid models (issue 30) keeps its guarantees: on seeded random small hybrids
(Mamba-2 / attention / MLP one-block stacks as Nemotron-H, Gated DeltaNet + gated attention over
MoE as Qwen3-Next, sliding and full attention as gpt-oss, chunked + NoPE over interleaved MoE as
Llama 4) the driver's best equals the minimum of `estimate` over every enumerated candidate, the
pruning bounds are bounds, the layer-split DP equals brute force on the real tables, and the
rules the mixers add (tp divides their heads and groups, what cp can split) hold for every plan
the search returns."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.api import load_cluster, resolve_cost_model
from autopar.cost.step import estimate
from autopar.errors import NoFeasiblePlanError
from autopar.model import ModelSpec, build_graph
from autopar.schema.model import LinearAttentionSpec, MambaSpec, MoESpec
from autopar.schema.plan import plan_violations
from autopar.search import plan_key, search_graph, space_spec_for
from autopar.search.brute import brute_force
from autopar.search.costs import Pricer, stage_inputs, stage_memory_model
from autopar.search.partition import brute_force_partition, partition_layers
from autopar.search.space import candidates

FAMILIES = ("nemotron", "qwen3next", "gptoss", "llama4")


def _random_hybrid(seed: int) -> ModelSpec:
    rng = np.random.default_rng(seed)
    family = FAMILIES[seed % len(FAMILIES)]
    heads = int(rng.choice([8, 16, 32]))
    hidden = heads * 128
    layers = int(rng.integers(4, 11))
    base = dict(name=f"hybrid{seed}", num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                num_kv_heads=int(rng.choice([2, 4, 8])), ffn_hidden_size=hidden * 3, vocab_size=32000)
    if family == "nemotron":  # one block a layer: M, attention (N), MLP (-) from Megatron's symbols
        symbols = "".join(rng.choice(list("MM*-"), layers))
        layer_pattern = "".join({"M": "M", "*": "N", "-": "-"}[c] for c in symbols)
        ffn_pattern = "".join("D" if c == "-" else "-" for c in symbols)
        if set(layer_pattern) == {"-"}:
            layer_pattern = "M" + layer_pattern[1:]
            ffn_pattern = "-" + ffn_pattern[1:]
        groups = int(rng.choice([2, 4, 8]))
        return ModelSpec(**base, layer_pattern=layer_pattern, ffn_pattern=ffn_pattern, activation="relu2",
                         mamba=MambaSpec(num_heads=int(rng.choice([16, 32, 64])), head_dim=64, state_size=128,
                                         num_groups=groups))
    moe = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=hidden, num_shared_experts=1,
                  shared_expert_ffn_hidden_size=hidden, shared_expert_gate=family == "qwen3next")
    if family == "qwen3next":
        interval = int(rng.choice([2, 4]))
        return ModelSpec(**base, head_dim=128, layer_pattern="".join("A" if (i + 1) % interval == 0 else "G"
                                                                      for i in range(layers)),
                         ffn_pattern="E" * layers, attention_output_gate=True, qk_norm=True, moe=moe,
                         linear_attention=LinearAttentionSpec(kind="gated_deltanet", num_key_heads=4,
                                                              num_value_heads=8, key_head_dim=128,
                                                              value_head_dim=128))
    if family == "gptoss":
        return ModelSpec(**base, layer_pattern="WA" * (layers // 2) + "W" * (layers % 2), sliding_window=128,
                         attention_sinks=True, qkv_bias=True, moe=moe.model_copy(update=dict(num_shared_experts=0,
                                                                               shared_expert_ffn_hidden_size=0)))
    return ModelSpec(**base, layer_pattern="".join("N" if (i + 1) % 4 == 0 else "C" for i in range(layers)),
                     ffn_pattern="".join("E" if i % 2 else "D" for i in range(layers)), attention_chunk_size=1024,
                     moe=moe)


def _instance(seed: int):
    rng = np.random.default_rng(2000 + seed)
    graph = build_graph(_random_hybrid(seed))
    cluster = load_cluster(str(rng.choice(["dgx-a100-40gb", "dgx-h100"])), int(rng.choice([8, 16])))
    p = resolve_cost_model(cluster, None)
    return graph, cluster, p, int(rng.choice([2048, 4096])), int(rng.choice([16, 32]))


SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
def test_hybrid_search_best_equals_brute_force_minimum(seed):
    graph, cluster, p, seq, gbs = _instance(seed)
    assert len({x.cost_key for x in graph.decoder_layers}) >= 2  # the decoders really differ
    spec = space_spec_for(graph, cluster, seq, gbs)
    brute = brute_force(graph, cluster, p, spec, top=3)
    if not brute:
        with pytest.raises(NoFeasiblePlanError):
            search_graph(graph, cluster, p, spec, top=3, refine=False)
        return
    result = search_graph(graph, cluster, p, spec, top=3, refine=False)
    assert [plan_key(x) for x, _ in result.plans] == [plan_key(x) for x, _ in brute]
    assert [e.step_time_s for _, e in result.plans] == [e.step_time_s for _, e in brute]
    refined = search_graph(graph, cluster, p, spec, top=3)
    assert refined.plans[0][1].step_time_s <= brute[0][1].step_time_s
    counts = graph.spec.mixer_counts()
    for plan, e in refined.plans:
        assert e.fits and estimate(graph, cluster, plan, p, 0.1).step_time_s == e.step_time_s
        assert not plan_violations(plan, **spec.validator_kwargs())
        assert not counts["mixer_heads"] or counts["mixer_heads"] % plan.tp == 0
        assert plan.cp == 1 or not counts["cp_blocker"]


@pytest.mark.parametrize("seed", SEEDS)
def test_hybrid_bounds_never_exceed_the_estimate(seed):
    graph, cluster, p, seq, gbs = _instance(seed)
    pricer = Pricer(graph, cluster, p)
    for plan in candidates(space_spec_for(graph, cluster, seq, gbs))[::9]:
        e = estimate(graph, cluster, plan, p)
        assert pricer.time_lower_bound_s(plan) <= e.step_time_s * (1 + 1e-9)
        assert pricer.memory_lower_bound_bytes(plan) <= e.peak_memory_bytes * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_hybrid_layer_split_dp_equals_brute_force_on_real_tables(seed):
    """The partition DP moves layers of different kinds between stages: on the real per-layer
    tables of a hybrid its bottleneck equals brute force over every split."""
    graph, cluster, p, seq, gbs = _instance(seed)
    pricer = Pricer(graph, cluster, p)
    plans = [x for x in candidates(space_spec_for(graph, cluster, seq, gbs)) if x.pp > 1 and x.vpp == 1 and x.zero < 3]
    assert plans
    for plan in plans[::max(1, len(plans) // 6)]:
        inputs = stage_inputs(pricer.table(plan), stage_memory_model(graph, cluster, plan, p, 0.1), plan)
        dp, brute = partition_layers(inputs), brute_force_partition(inputs)
        assert (dp is None) == (brute is None)
        if dp is not None:
            assert dp.bottleneck_s == pytest.approx(brute.bottleneck_s, rel=1e-12)


def test_mixer_rules_prune_tp_and_cp():
    """Mamba-2 with 8 groups: tp 16 cannot split them; Gated DeltaNet: no cp."""
    spec = _random_hybrid(0)  # nemotron family
    assert spec.mamba is not None
    counts = spec.mixer_counts()
    assert counts["mixer_heads"] == np.gcd(spec.mamba.num_heads, spec.mamba.num_groups)
    graph = build_graph(spec)
    cluster = load_cluster("dgx-h100", 16)
    tps = {x.tp for x in candidates(space_spec_for(graph, cluster, 4096, 32))}
    assert tps and all(counts["mixer_heads"] % tp == 0 for tp in tps)
    qwen = build_graph(_random_hybrid(1))
    assert qwen.spec.mixer_counts()["cp_blocker"] == "Gated DeltaNet"
    assert {x.cp for x in candidates(space_spec_for(qwen, cluster, 4096, 32))} == {1}


def test_a_mamba_layer_issues_half_the_tp_traffic_of_an_attention_mlp_layer():
    """Hand-worked: a Nemotron-H Mamba layer opens one TP block (in_proj column-, out_proj
    row-parallel), as does its MLP layer; the same width as an attention + MLP layer opens two: at
    tp 8 with sp, its forward TP communication is half."""
    from autopar.cost.layer import _tp_comm
    from autopar.cost.step import setup
    from autopar.api import load_model
    from autopar.schema.plan import ParallelPlan

    nemo = load_model("nemotron-h-56b")
    cluster = load_cluster("dgx-h100", 8)
    p = resolve_cost_model(cluster, None)
    plan = ParallelPlan(tp=8, pp=1, mbs=1, global_batch=8, seq_len=4096)
    st = setup(nemo, cluster, plan, p)
    mamba = next(x for x in nemo.decoder_layers if x.mixer == "mamba2")
    mlp = next(x for x in nemo.decoder_layers if x.mixer == "none")
    plain = build_graph(nemo.spec.model_copy(update=dict(layer_pattern=None, ffn_pattern=None))).decoder_layers[0]
    one = _tp_comm(mamba, st.split, st.spans, cluster, p, False)
    assert one > 0 and _tp_comm(mlp, st.split, st.spans, cluster, p, False) == one
    assert _tp_comm(plain, st.split, st.spans, cluster, p, False) == pytest.approx(2 * one)


def test_mamba_scan_and_cp_all_to_all_by_hand():
    """A Nemotron-H Mamba layer at tp 4, cp 2: its scan is priced at the measured SSD kernel rate
    (h100.json's `ssd` entry, 0.10 / 0.081 of peak) over its FLOPs on the rank's tokens and heads
    (scan FLOPs · tokens / tp), each pass at least its HBM traffic (256 heads of 64, state 256,
    chunk 128: S = 32,768 state elements a token; forward 12·S + 10·16,384 = 557,056 bytes,
    backward 34·S + 44·16,384 = 1,835,008), and its CP cost, forward and backward, is one
    all-to-all of [z, x, B, C, dt] and y (2 · (37120 + 16384) bytes a token / tp)."""
    from autopar.cost import comm
    from autopar.cost.compute import attention_time_s
    from autopar.cost.layer import layer_cost, recurrent_scan_s
    from autopar.cost.step import setup
    from autopar.api import load_model
    from autopar.schema.plan import ParallelPlan

    nemo = load_model("nemotron-h-56b")
    cluster = load_cluster("dgx-h100", 16)
    p = resolve_cost_model(cluster, None)
    st = setup(nemo, cluster, ParallelPlan(tp=4, cp=2, mbs=1, global_batch=16, seq_len=8192), p)
    s = st.split
    mamba = next(x for x in nemo.decoder_layers if x.mixer == "mamba2")
    assert mamba.cp_a2a_bytes_per_token == 2 * (37120 + 16384)
    assert p.kernel_rate("ssd") == (0.10, 0.081) and mamba.scan_kernel == "ssd"
    assert (mamba.scan_bytes_fwd_per_token, mamba.scan_bytes_bwd_per_token) == (557_056, 1_835_008)
    flops = mamba.scan_flops_per_token * s.tokens / 4
    peak = s.attn_peak_flops or s.peak_flops
    by_rate = (attention_time_s(flops, 4096, peak, p, False, 0.10),
               p.attention_backward_ratio * attention_time_s(flops, 4096, peak, p, False, 0.081))
    assert recurrent_scan_s(mamba, s, p) == by_rate  # no HBM rate given: the kernel rate alone
    bw = cluster.hbm_bytes_per_s * p.hbm_efficiency
    floor = (557_056 * s.tokens / 4 / bw, 1_835_008 * s.tokens / 4 / bw)
    assert recurrent_scan_s(mamba, s, p, cluster.hbm_bytes_per_s) == (max(by_rate[0], floor[0]),
                                                                       max(by_rate[1], floor[1]))
    cost = layer_cost(mamba, s, st.spans, cluster, p, False)
    a2a = comm.all_to_all_s(2 * (37120 + 16384) * s.tokens / 4, st.spans.cp, cluster, p)
    assert a2a > 0 and cost.cp_comm_fwd_s == cost.cp_comm_bwd_s == a2a
    mlp = next(x for x in nemo.decoder_layers if x.mixer == "none")
    assert layer_cost(mlp, s, st.spans, cluster, p, False).cp_comm_fwd_s == 0.0


def test_megatron_refuses_plans_only_of_models_with_mamba_layers():
    """FrameworkSpec.refuses_plans_of lets the search skip Megatron's per-plan refusals for a model
    they cannot refuse: brute force over every raw candidate and recompute choice of four models on 32
    H100, none refused where it says False; the Mamba hybrid is refused its interleaved plans."""
    from autopar.api import load_model
    from autopar.frameworks import framework_spec
    from autopar.search.space import _recompute_free, recompute_options, with_recompute

    fw = framework_spec("megatron")
    cluster = load_cluster("dgx-h100", 32)
    for name, mamba in (("llama3-8b", False), ("qwen3-30b-a3b", False), ("qwen3-next-80b-a3b", False),
                        ("nemotron-h-56b", True)):
        graph = load_model(name)
        spec = space_spec_for(graph, cluster, 4096, 64)
        assert fw.refuses_plans_of(graph.spec) is mamba, name
        refused = 0
        for base in _recompute_free(spec):
            for r in recompute_options(spec):
                refused += bool(fw.plan_refusals(graph.spec, 32, with_recompute(base, r)))
        assert (refused > 0) is mamba, (name, refused)
