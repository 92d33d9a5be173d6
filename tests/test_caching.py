"""The memo tables' one seam (autopar.caching): every table keyed by a plan is checked, on every
miss of real searches and estimates of every framework, to read nothing of the plan its key leaves
out (CHECK_KEYS); and the recorder that checks it records what a computation reads."""

from __future__ import annotations

import pytest

from autopar import caching
from autopar.cost.layout import LAYOUT_FIELDS, Layout
from autopar.cost.step import StepMemo, estimate
from autopar.inputs import load_cluster, load_model, resolve_cost_model
from autopar.schema.plan import ParallelPlan, Recompute
from autopar.search import search
from autopar.search.space import Draft, candidate_drafts, space_spec_for


def test_the_recorder_sees_fields_through_properties_methods_and_copies():
    plan = ParallelPlan(tp=4, pp=2, global_batch=64, seq_len=4096)
    assert caching.fields_read(lambda q: q.expert_tp, plan) == {"etp", "tp"}
    assert caching.fields_read(lambda q: q.dp_for(64), plan) == {"tp", "pp", "cp"}
    assert caching.fields_read(lambda q: q.model_copy(update={"tp": 2}).tp + q.pp, plan) == {"pp"}
    draft = candidate_drafts(space_spec_for(load_model("llama3-8b"), load_cluster("dgx-h100", 16), 4096, 32))[0]
    assert caching.fields_read(lambda q: q[:2], draft) == {"tp", "pp"}
    assert caching.fields_read(lambda q: q._replace(mbs=2).mbs + q.cp, draft) == {"cp"}


def test_a_key_that_leaves_out_a_read_field_is_refused():
    plan = ParallelPlan(tp=4, global_batch=64, seq_len=4096)
    with pytest.raises(caching.StaleKeyError, match="memo table t: its computation reads seq_len"):
        caching.check_key("t", lambda q: (q.tp,), lambda q: q.tp * q.seq_len, plan)
    caching.check_key("t", lambda q: (q.tp, q.seq_len), lambda q: q.tp * q.seq_len, plan)


# Plans, and for each plan field a second value: a Layout field must not move when a plan field
# outside its declared reads (LAYOUT_FIELD_READS) does.
_PLANS = [dict(tp=4, pp=4, vpp=5, global_batch=128, seq_len=8192),
          dict(tp=2, pp=2, cp=2, zero=3, zero_shard_size=8, global_batch=128, seq_len=8192, framework="torchtitan"),
          dict(tp=2, pp=4, ep=8, etp=1, mbs=2, global_batch=256, seq_len=4096, zero=2)]
_OTHER = dict(tp=8, pp=8, cp=4, ep=2, etp=2, vpp=2, mbs=4, global_batch=512, seq_len=2048, zero=0, zero_shard_size=2,
              framework="deepspeed", layers_per_stage=(10,) * 8, sp=False, cp_comm_type="a2a", precision="fp8",
              overlap_grad_reduce=False, tp_comm_overlap=True, moe_dispatcher="allgather", moe_capacity_factor=1.5,
              moe_load_imbalance=1.2, moe_grouped_gemm=False, grad_reduce_in_bf16=True)


def test_layout_field_reads_are_what_each_field_derives_from():
    """Perturb one plan field at a time (validation aside: a Layout is arithmetic on the fields): each
    Layout field stays put unless the field is among its declared reads; layout_key names them all."""
    from autopar.cost.layout import LAYOUT_FIELD_READS

    assert set().union(*LAYOUT_FIELD_READS.values()) <= set(LAYOUT_FIELDS)
    for base in _PLANS:
        plan = ParallelPlan.trusted(**base)
        layout = Layout.build(plan, 512, 8, 80, True)
        for name, value in _OTHER.items():
            moved = Layout.build(ParallelPlan.trusted(**{**base, name: value}), 512, 8, 80, True)
            for field, reads in LAYOUT_FIELD_READS.items():
                if name not in reads:
                    assert getattr(moved, field) == getattr(layout, field), (field, name)


def test_a_recorded_layout_reports_the_plan_fields_behind_what_is_read():
    c, g = load_cluster("dgx-h100", 64), load_model("llama3-70b")
    plan = ParallelPlan(tp=4, pp=4, vpp=5, global_batch=128, seq_len=8192)
    assert caching.fields_read(lambda q: Layout.of(q, c, g).layer_spans, plan) == {"tp", "cp", "ep", "etp"}
    assert caching.fields_read(lambda q: Layout.of(q, c, g).num_microbatches, plan) == \
        {"global_batch", "tp", "pp", "cp", "mbs"}


CASES = [  # (model, cluster, gpus, seq, gbs, framework, fix)
    ("llama3-8b", "dgx-h100", 16, 16384, 32, "megatron", {}),
    ("llama3-8b", "dgx-h100", 16, 16384, 32, "torchtitan", {}),
    ("llama3-70b", "dgx-h100", 64, 4096, 128, "megatron", {"pp": 8, "vpp": 1}),
    ("llama3-70b", "dgx-h100", 64, 4096, 128, "deepspeed", {}),
    ("llama3-8b", "dgx-h100", 16, 8192, 32, "megatron", {"zero": 3}),
    ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 32, "megatron", {"mbs": 1}),
    ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 32, "torchtitan", {"mbs": 1, "zero": 2}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[5]}-{'-'.join(f'{k}{v}' for k, v in c[6].items())}")
def test_every_memo_key_covers_what_its_table_reads(case, monkeypatch):
    """Searches (the Pricer's tables and bounds, the shared StepMemo) and estimates of plans with every
    field off its default that the estimate reads (releases, overlaps, TP overlap, fp8, HSDP, a layer
    split), each table miss checked."""
    model, cluster, gpus, seq, gbs, framework, fix = case
    monkeypatch.setattr(caching, "CHECK_KEYS", True)
    result = search(model, cluster, gpus, seq, gbs, top=3, framework=framework, fix=fix)
    assert result.plans
    g, c = load_model(model), load_cluster(cluster, gpus)
    p = resolve_cost_model(c, None)
    memo = StepMemo(g, c, p)
    for plan, _ in result.plans[:2]:
        for change in ({"overlap_grad_reduce": False}, {"recompute": Recompute(mode="full", num_layers=1)},
                       {"precision": "fp8"} if framework != "deepspeed" else {},
                       {"framework_release": {"megatron": "pre-core", "deepspeed": "0.3",
                                              "torchtitan": "2024-12"}[framework]}):
            try:
                moved = plan.changed(**change)
            except ValueError:
                continue
            estimate(g, c, moved, p, memo=memo)
