"""The search builds its plans without Pydantic's validator (ParallelPlan.trusted, Recompute.trusted)
and the plan command dumps them without its serializer (ParallelPlan.plan_json): both must give
exactly what validation and model_dump(mode="json") give, on every candidate of several spaces."""

from __future__ import annotations

import itertools

import pytest

from autopar.schema.plan import Framework, ParallelPlan, Recompute, RecomputeMode
from autopar.search.space import SpaceSpec, normalize_fix, valid_bases, with_recompute

SPACES = [  # (gpus, gpus/node, layers, heads, kv heads, experts, seq, gbs, framework)
    (64, 8, 80, 64, 8, 0, 8192, 128, Framework.MEGATRON),
    (128, 8, 48, 32, 4, 64, 4096, 256, Framework.MEGATRON),
    (64, 8, 30, 32, 8, 0, 4096, 64, Framework.DEEPSPEED),
    (32, 4, 26, 16, 2, 8, 16384, 32, Framework.TORCHTITAN),
]


def _drafts(space):
    gpus, per_node, layers, heads, kv, experts, seq, gbs, framework = space
    spec = SpaceSpec(num_gpus=gpus, gpus_per_node=per_node, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                     num_experts=experts, seq_len=seq, global_batch=gbs, framework=framework, fix=normalize_fix({}))
    for base, recomputes in itertools.islice(valid_bases(spec), 4000):
        for r in recomputes:
            yield with_recompute(base, r)


@pytest.mark.parametrize("space", SPACES, ids=[f"space{i}" for i in range(len(SPACES))])
def test_trusted_plans_equal_validated_ones_and_dump_alike(space):
    seen_zero0 = 0
    for draft in _drafts(space):
        fields = dict(zip(draft._fields, draft))
        trusted = draft.to_plan()
        r = draft.recompute
        validated = ParallelPlan(**{**fields, "recompute": Recompute(mode=r.mode, modules=r.modules,
                                                                      num_layers=r.num_layers)})
        assert trusted == validated and hash(trusted) == hash(validated), draft
        assert trusted.model_fields_set == validated.model_fields_set
        assert trusted.overlap_param_gather == (draft.zero >= 1)  # the before-validator's default
        assert trusted.plan_json() == validated.model_dump(mode="json")
        seen_zero0 += draft.zero == 0
    assert seen_zero0  # zero 0 plans (overlap_param_gather derived off) are among them


def test_plan_json_of_every_field_kind():
    """Fields the search leaves at their defaults (tuples, floats, literals, None) dump alike too."""
    plan = ParallelPlan(tp=2, pp=2, vpp=2, global_batch=64, seq_len=4096, zero=0, layers_per_stage=(7, 8, 8, 7),
                        recompute={"mode": "full", "num_layers": 3}, moe_load_imbalance=1.3, moe_capacity_factor=1.0,
                        cp_comm_type="a2a", moe_dispatcher="allgather", framework="deepspeed",
                        framework_release="0.3", grad_reduce_in_bf16=True, tp_comm_overlap=True, sp=True,
                        precision="fp8", zero_shard_size=8, etp=1)
    assert plan.plan_json() == plan.model_dump(mode="json")
    assert list(plan.plan_json()) == list(plan.model_dump(mode="json"))  # key order: the JSON's
    assert ParallelPlan.trusted(**dict(plan)) == plan


def test_trusted_recompute_equals_validated():
    for mode, modules, k in [("none", ("core_attn",), None), ("selective", ("core_attn", "mlp"), None),
                             ("full", ("core_attn",), 4), (RecomputeMode.FULL, ("core_attn",), None)]:
        assert Recompute.trusted(mode, modules, k) == Recompute(mode=mode, modules=modules, num_layers=k)
