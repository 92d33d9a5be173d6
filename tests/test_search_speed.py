"""Search speed without changing a number: the estimates a search shares a StepMemo across are
bit-identical to estimates computed afresh; the search still equals brute force where FSDP2's
gradients make a plan's memory depend on its microbatch count (torchtitan); and the bases the
search nests carry every candidate."""

from __future__ import annotations

import random

import pytest

from autopar.api import load_cluster, load_model, resolve_cost_model
from autopar.cost.step import StepMemo, assign_layers, estimate, rank_chunks, rank_memory, setup
from autopar.schema.plan import Recompute
from autopar.search import plan_key, search_graph, space_spec_for
from autopar.search.brute import brute_force
from autopar.search.costs import Pricer
from autopar.search.space import candidate_drafts, valid_bases

CASES = [  # (model, cluster, gpus, seq, global batch, framework): dense, MoE (MLA, MTP), FSDP2, ZeRO-3
    ("llama3-70b", "dgx-h100", 64, 8192, 128, "megatron"),
    ("deepseek-v3", "hgx-h800", 2048, 4096, 4096, "megatron"),
    ("qwen3-235b-a22b", "dgx-h100", 1024, 4096, 4096, "megatron"),
    ("llama3-70b", "dgx-h100", 64, 8192, 128, "torchtitan"),
    ("llama3-8b", "dgx-h100", 16, 8192, 64, "deepspeed"),
]


def _plans(model, cluster, gpus, seq, gbs, framework, count=40):
    """A seeded sample of the space's candidates, with the refinements' shapes: full(K), a moved split."""
    g, c = load_model(model), load_cluster(cluster, gpus)
    p = resolve_cost_model(c, None)
    drafts = candidate_drafts(space_spec_for(g, c, seq, gbs, framework=framework))
    out = []
    for i, d in enumerate(random.Random(7).sample(drafts, min(count, len(drafts)))):
        plan = d.to_plan()
        out.append(plan)
        if plan.recompute.mode == "full":
            out.append(plan.model_copy(update={"recompute": Recompute(mode="full", num_layers=1)}))
        if plan.vpp == 1 and plan.pp > 2 and framework == "megatron":
            counts = list(Pricer(g, c, p).layout(plan).stage_counts)
            counts[0], counts[1] = counts[0] - 1, counts[1] + 1
            out.append(plan.model_copy(update={"layers_per_stage": tuple(counts)}))
    return g, c, p, out


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[5]}" for c in CASES])
def test_shared_memo_estimates_are_bit_identical_to_fresh_ones(case):
    g, c, p, plans = _plans(*case)
    shared = StepMemo(g, c, p)
    for plan in plans + plans[::-1]:  # the second pass reads entries other plans made
        fresh = estimate(g, c, plan, p, 0.1, StepMemo(g, c, p, reuse=False))
        assert repr(estimate(g, c, plan, p, 0.1, shared)) == repr(fresh)
        assert repr(estimate(g, c, plan, p, 0.1)) == repr(fresh)


@pytest.mark.parametrize("case", CASES[1:3], ids=["deepseek-v3", "qwen3"])
def test_rank_memory_with_a_memo_equals_rank_memory_without(case):
    g, c, p, plans = _plans(*case, count=15)
    memo = StepMemo(g, c, p)
    for plan in plans:
        st = setup(g, c, plan, p)
        chunks = rank_chunks(assign_layers(g, st.layout), st.layout)
        for r in {0, plan.pp // 2, plan.pp - 1}:
            assert rank_memory(r, chunks[r], g, plan, st, p, memo) == rank_memory(r, chunks[r], g, plan, st, p)


def test_layers_alike_but_for_index_and_name_share_a_class():
    g = load_model("deepseek-v3")  # embedding, 3 dense, 58 MoE decoders, MTP, head
    kinds = [x.kind for x in g.layers]
    assert len(set(g.layer_classes)) == 5
    assert {g.layer_classes[i] for i, k in enumerate(kinds) if k == "moe"} == {g.layer_classes[kinds.index("moe")]}
    assert len({g.layer_classes[i] for i, k in enumerate(kinds) if k == "dense"}) == 1


@pytest.mark.parametrize("cluster, gpus, seq, gbs", [("dgx-a100-40gb", 8, 8192, 16), ("dgx-h100", 16, 4096, 16)])
def test_torchtitan_search_equals_brute_force(cluster, gpus, seq, gbs):
    """FSDP2 frees its gradients between steps, so a plan with one microbatch needs less memory
    than its family's other plans: the search's bounds must follow the microbatch count."""
    graph, c = load_model("llama3-8b"), load_cluster(cluster, gpus)  # a shape torchtitan builds
    p = resolve_cost_model(c, None)
    spec = space_spec_for(graph, c, seq, gbs, framework="torchtitan")
    brute = brute_force(graph, c, p, spec, top=3)
    result = search_graph(graph, c, p, spec, top=3, refine=False)
    assert brute and [plan_key(x) for x, _ in result.plans] == [plan_key(x) for x, _ in brute]
    assert [e.step_time_s for _, e in result.plans] == [e.step_time_s for _, e in brute]


def test_memory_bounds_hold_for_every_microbatch_count_under_fsdp2():
    """One Pricer for the whole space, in enumeration order (small micro batches, i.e. several
    microbatches, first): every bound stays below the estimate. (A per-parameter state cache keyed
    without the microbatch count broke this for 17 of these 601 candidates.)"""
    g, c = load_model("llama3-70b"), load_cluster("dgx-h100", 64)
    p = resolve_cost_model(c, None)
    pricer = Pricer(g, c, p)
    drafts = candidate_drafts(space_spec_for(g, c, 8192, 128, framework="torchtitan"))
    for d in drafts[::15]:
        bound = max(pricer.quick_memory_lower_bound_bytes(d), pricer.rank_memory_lower_bound_bytes(d))
        assert bound <= estimate(g, c, d.to_plan(), p).peak_memory_bytes * (1 + 1e-9)


def test_valid_bases_carry_every_candidate():
    """The search nests bases (every axis but recompute) and builds a family's Drafts when it
    expands it; the bases with their recompute choices are exactly the candidates."""
    g, c = load_model("qwen3-235b-a22b"), load_cluster("dgx-h100", 1024)
    spec = space_spec_for(g, c, 4096, 4096)
    bases = valid_bases(spec)
    drafts = candidate_drafts(spec)
    assert [d for base, recomputes in bases for d in (base._replace(recompute=r) for r in recomputes)] == drafts
    assert len(drafts) == 3 * len(bases)  # none, selective, full: each valid for every base under Megatron


def test_expert_blind_resets_only_the_expert_fields():
    """expert_blind builds its Split field by field (positionally): equal to _replace of the expert
    fields on a Split whose every field differs from its default and from the reset."""
    from autopar.cost import comm
    from autopar.cost.layer import Spans, Split, expert_blind

    values = {"tp": 2, "sp": True, "cp": 4, "ep": 8, "etp": 2, "tokens": 1024.0, "seq_len": 8192, "hidden": 4096,
              "peak_flops": 9.89e14, "moe_load": 1.3, "cp_comm_type": "a2a", "moe_dispatcher": "allgather",
              "attn_peak_flops": 9.0e14, "attention_kernel": "cudnn", "cp_ring": "torch", "cp_repeats_kv_heads": True,
              "cp_comm_overlapped": False, "tp_backward_overlap": True, "eager": True, "sequential_experts": True,
              "fp8_casts": "torchao_rowwise", "moe_padded": True,
              "shared_expert_overlap": True, "loss_fwd_bytes": 38.0, "loss_bwd_bytes": 14.0,
              "unfused_attention": True}
    assert set(values) == set(Split._fields)  # a new field must be added here and in expert_blind
    s = Split(**values)
    assert all(getattr(s, name) != default for name, default in Split._field_defaults.items())
    span = comm.GroupSpan(8, 8, 1)
    blind, spans = expert_blind(s, Spans(span, span, span, span))
    assert type(blind) is Split and blind == s._replace(ep=1, etp=1, moe_load=1.0, moe_dispatcher="alltoall",
                                                        sequential_experts=False, moe_padded=False,
                                                        shared_expert_overlap=False)
    assert spans == Spans(span, span, comm.GroupSpan(1, 1, 1), comm.GroupSpan(1, 1, 1))


@pytest.mark.parametrize("case", CASES[:3], ids=["llama3-70b", "deepseek-v3", "qwen3"])
def test_layers_without_experts_cost_the_same_under_every_expert_layout(case):
    """layer.expert_blind: a layer without experts reads no expert-parallel field, so its cost on a
    split equals its cost with ep, etp, the MoE load, the dispatcher and their groups reset (what
    StepMemo shares across a search's expert layouts). Checked on every layer kind of the model."""
    from autopar.cost.layer import expert_blind, layer_cost

    g, c, p, plans = _plans(*case, count=25)
    checked = 0
    for plan in plans:
        st = setup(g, c, plan, p)
        for layer in {x.kind if x.kind in ("dense", "moe") else x.name: x for x in g.layers}.values():
            if layer.num_experts:
                continue
            split, spans = expert_blind(st.split, st.spans)
            for overlap in (False, True):
                assert layer_cost(layer, st.split, st.spans, c, p, overlap) == layer_cost(layer, split, spans, c, p,
                                                                                         overlap)
            checked += st.split.ep > 1 or st.split.moe_load != 1.0
    assert checked > 0 or g.spec.moe is None


def test_cached_property_computes_once_per_instance_on_a_frozen_dataclass():
    from dataclasses import dataclass

    from autopar.caching import cached_property

    calls = []

    @dataclass(frozen=True)
    class Box:
        x: int

        @cached_property
        def double(self) -> int:
            """Twice x."""
            calls.append(self.x)
            return 2 * self.x

    a, b = Box(3), Box(4)
    assert (a.double, a.double, b.double, a.double) == (6, 6, 8, 6)
    assert calls == [3, 4]
    assert isinstance(Box.double, cached_property) and Box.double.__doc__ == "Twice x."


@pytest.mark.parametrize("case", CASES, ids=["llama3-70b", "deepseek-v3", "qwen3", "torchtitan", "deepspeed"])
def test_tables_sharing_memory_entries_equal_tables_built_alone(case):
    """layer_table's columns_memo (memory entries shared by splits that differ only in ep) gives
    the very columns a table built without it has, for the same plans and the same plans at every ep."""
    from autopar.search.costs import layer_table

    g, c, p, plans = _plans(*case, count=25)
    shared: dict = {}
    variants = [x for plan in plans for x in (plan, plan.model_copy(update={"ep": 1}))]
    for plan in variants:
        alone = layer_table(g, c, plan, p).memory
        assert layer_table(g, c, plan, p, columns_memo=shared).memory == alone
    assert len(shared) < len(variants)  # entries were shared


@pytest.mark.parametrize("case", CASES[1:3], ids=["deepseek-v3", "qwen3"])
def test_layer_costs_with_a_shared_memo_equal_costs_priced_afresh(case):
    """layer_cost with one GEMM/attention memo shared across every split of a search (attention
    and elementwise terms of an MoE layer kept per expert-blind split, GEMM times per shape) equals
    layer_cost without a memo, bit for bit, on every layer kind."""
    from autopar.cost.layer import layer_cost

    g, c, p, plans = _plans(*case, count=40)
    memo: dict = {}
    kinds = {x.kind if x.kind in ("dense", "moe") else x.name: x for x in g.layers}.values()
    hits = 0
    for plan in plans + [plan.model_copy(update={"ep": 1}) for plan in plans]:
        st = setup(g, c, plan, p)
        for layer in kinds:
            before = len(memo)
            assert layer_cost(layer, st.split, st.spans, c, p, False, memo) == layer_cost(layer, st.split, st.spans,
                                                                                         c, p, False)
            hits += len(memo) == before
    assert hits > 0


@pytest.mark.parametrize("case", CASES, ids=["llama3-70b", "deepseek-v3", "qwen3", "torchtitan", "deepspeed"])
def test_a_draft_reads_as_its_plan_and_tables_from_drafts_equal_tables_from_plans(case):
    """Every ParallelPlan field reads the same on a search Draft as on the plan it becomes (the
    fields the generators leave at their defaults are class attributes), and layer_table of the
    Draft equals layer_table of the plan, time and memory columns."""
    from autopar.schema.plan import ParallelPlan
    from autopar.search.costs import layer_table, split_key

    model, cluster, gpus, seq, gbs, framework = case
    g, c = load_model(model), load_cluster(cluster, gpus)
    p = resolve_cost_model(c, None)
    drafts = random.Random(3).sample(candidate_drafts(space_spec_for(g, c, seq, gbs, framework=framework)), 12)
    for d in drafts:
        plan = d.to_plan()
        for name in ParallelPlan.model_fields:
            assert getattr(d, name) == getattr(plan, name), name
        a, b = layer_table(g, c, d, p), layer_table(g, c, plan, p)
        assert (a.fb_s, a.recompute_s, a.p2p_s, a.memory) == (b.fb_s, b.recompute_s, b.p2p_s, b.memory)
        assert split_key(d) == split_key(plan)  # the Draft's fast path
        pricer = Pricer(g, c, p)
        assert pricer.layout(d) == pricer.layout(plan) == Pricer(g, c, p).layout(d)
