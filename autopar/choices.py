"""What a user chooses by name: the framework, the precision, the recompute mode, and the memory
margin; what each framework offers and defaults to is its own (autopar.frameworks). Plain enums
and numbers, no Pydantic, so that the CLI can declare its options without importing a schema or
the cost model (issue 15: start-up); autopar.schema.plan and autopar.cost.step re-export them.
"""

from __future__ import annotations

from enum import StrEnum

# Fraction of HBM a plan leaves free for what no model sees (allocator spikes, NCCL buffer growth);
# plan, estimate, compare, explain and sweep all judge "fits" against HBM · (1 − margin).
DEFAULT_MEMORY_MARGIN = 0.1


class Framework(StrEnum):
    """The training framework a plan targets (its memory layout, limits and export format)."""

    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"


class Precision(StrEnum):
    """Compute precision of the GEMMs."""

    BF16 = "bf16"
    FP8 = "fp8"


class RecomputeMode(StrEnum):
    """Activation recomputation: none, selective (listed modules), full (whole layers)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


FRAMEWORKS = tuple(Framework)


def default_zero(framework: str) -> int:
    """The ZeRO stage of `framework` when the user does not name one (its FrameworkSpec's);
    ValueError for a name that is no Framework."""
    from autopar.frameworks import framework_spec  # plain dataclasses: light, but only when asked

    return framework_spec(Framework(framework)).default_zero
