"""The search's plain-tuple validity check (space.draft_is_valid) against the one plan validator
(plan_violations): the same verdict on every base of several spaces, and on bases perturbed so
that each rule of the validator fires."""

from __future__ import annotations

import itertools

import pytest

from autopar.schema.plan import Framework, plan_violations
from autopar.search.space import (SpaceSpec, _recompute_free, _valid_recompute_free, draft_is_valid, normalize_fix,
                                  valid_bases)

SPACES = [  # (gpus, gpus/node, layers, heads, kv heads, experts, seq, gbs, framework, fix)
    (64, 8, 80, 64, 8, 0, 8192, 128, Framework.MEGATRON, {}),
    (96, 8, 30, 24, 6, 0, 4096, 96, Framework.MEGATRON, {}),
    (128, 8, 48, 32, 4, 64, 4096, 256, Framework.MEGATRON, {}),
    (48, 8, 27, 16, 16, 6, 2048, 48, Framework.MEGATRON, {}),
    (64, 8, 30, 32, 8, 0, 4096, 64, Framework.DEEPSPEED, {}),
    (32, 4, 26, 16, 2, 8, 16384, 32, Framework.TORCHTITAN, {}),
    # pinned values the generators would not produce: the validator must refuse them
    (96, 8, 30, 24, 8, 0, 4096, 96, Framework.MEGATRON, {"tp": 3}),
    (64, 8, 30, 32, 8, 0, 4096, 64, Framework.MEGATRON, {"vpp": 4, "sp": True}),
    (64, 8, 30, 32, 8, 16, 4096, 64, Framework.DEEPSPEED, {"zero": 3, "ep": 2}),
    (64, 8, 30, 32, 8, 0, 2048, 64, Framework.MEGATRON, {"cp": 8, "etp": 2}),
    (64, 4, 30, 32, 8, 12, 2048, 60, Framework.MEGATRON, {"tp": 8, "ep": 8}),
]


def _spec(gpus, per_node, layers, heads, kv, experts, seq, gbs, framework, fix) -> SpaceSpec:
    return SpaceSpec(num_gpus=gpus, gpus_per_node=per_node, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                     num_experts=experts, seq_len=seq, global_batch=gbs, framework=framework, fix=normalize_fix(fix))


def _perturbed(base):
    """The base, and variants that break (or keep) each rule: odd degrees, a2a CP, expert axes on
    a dense model, vpp without pp, sp at tp 1, zero stages a framework lacks, another framework."""
    yield base
    for field, values in (("tp", (1, 3, 16)), ("pp", (1, 7)), ("cp", (2, 3)), ("ep", (1, 2, 5)), ("etp", (None, 1, 2)),
                          ("vpp", (2, 3)), ("mbs", (1, 3)), ("zero", (0, 2, 3)), ("sp", (True, False, None)),
                          ("cp_comm_type", ("a2a", "allgather")), ("seq_len", (4096, 3000)),
                          ("framework", tuple(Framework))):
        for value in values:
            yield base._replace(**{field: value})


@pytest.mark.parametrize("space", SPACES, ids=[f"space{i}" for i in range(len(SPACES))])
def test_draft_is_valid_matches_plan_violations(space):
    spec = _spec(*space)
    kwargs = spec.validator_kwargs()
    verdicts = {True: 0, False: 0}
    for base in itertools.islice(_recompute_free(spec), 3000):
        for draft in _perturbed(base):
            fast = draft_is_valid(draft, **kwargs)
            assert fast == (not plan_violations(draft, **kwargs)), draft
            verdicts[fast] += 1
    assert verdicts[False], verdicts  # the refusals exercised (and the acceptances where nothing is pinned)
    assert verdicts[True] or spec.fix, verdicts


def test_valid_bases_keeps_exactly_the_validated_bases():
    for space in SPACES[:6]:
        spec = _spec(*space)
        kwargs = spec.validator_kwargs()
        expected = [b for b in _recompute_free(spec) if not plan_violations(b, **kwargs)]
        assert [b for b, _ in valid_bases(spec)] == expected


@pytest.mark.parametrize("space", SPACES + [  # and the benchmark's MoE shapes (Qwen3-235B, DeepSeek-V3)
    (1024, 8, 94, 64, 4, 128, 4096, 4096, Framework.MEGATRON, {}),
    (2048, 8, 61, 128, 128, 256, 4096, 4096, Framework.MEGATRON, {}),
    (512, 8, 61, 128, 128, 256, 4096, 1024, Framework.TORCHTITAN, {}),
], ids=[f"space{i}" for i in range(len(SPACES) + 3)])
def test_hoisted_generator_yields_exactly_the_valid_drafts_in_order(space):
    """_valid_recompute_free checks each rule at its loop level: the same drafts, in the same
    order, as filtering every draft of _recompute_free with draft_is_valid."""
    spec = _spec(*space)
    kwargs = spec.validator_kwargs()
    slow = [d for d in _recompute_free(spec) if draft_is_valid(d, **kwargs)]
    assert list(_valid_recompute_free(spec)) == slow
    assert slow or spec.fix
