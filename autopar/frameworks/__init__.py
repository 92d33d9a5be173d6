"""The training frameworks autopar plans for, each the single owner of what it is
(autopar.frameworks.base.FrameworkSpec): megatron.py, deepspeed.py, torchtitan.py.

Adding a framework: write its module with a SPEC (tests/test_frameworks.py shows what one must
provide), add it to REGISTRY below and its name to autopar.choices.Framework (the CLI's choices,
kept there so that `autopar --help` imports no framework). Everything else reads the spec.
"""

from __future__ import annotations

from autopar.frameworks import deepspeed, megatron, torchtitan
from autopar.frameworks.base import FrameworkProfile, FrameworkSpec, check_spec  # noqa: F401 (re-exported)

REGISTRY: dict[str, FrameworkSpec] = {s.name: s for s in (megatron.SPEC, deepspeed.SPEC, torchtitan.SPEC)}


def framework_spec(name: str) -> FrameworkSpec:
    """The spec of framework `name` (a Framework member or its value: a StrEnum hashes as its value)."""
    return REGISTRY[name]


def framework_profile(name: str, release: str | None = None) -> FrameworkProfile:
    """The cost profile of `name` (its current releases), or of an older `release` of it."""
    return REGISTRY[str(name)].cost_profile(release)


def model_refusals(name: str, model_spec) -> list[str]:
    """Why framework `name` cannot train `model_spec` in any layout (empty = it can)."""
    return REGISTRY[str(name)].model_refusals(model_spec)


def plan_refusals(model_spec, gpus: int, plan) -> list[str]:
    """Why `plan.framework` cannot express `plan` for `model_spec` on `gpus` GPUs, beyond the plan
    validator (autopar.schema.plan.plan_violations): the model's refusals first, then the plan's.
    The one refusal function the exporters refuse with and the search filters by."""
    spec = REGISTRY[str(plan.framework)]
    return spec.model_refusals(model_spec) or spec.plan_refusals(model_spec, gpus, plan)
