"""What a user chooses by name: the framework, the precision, the recompute mode, and the defaults
that follow from them (ZeRO stage, memory margin). Plain enums and numbers, no Pydantic, so that the
CLI can declare its options without importing a schema or the cost model (issue 15: start-up);
autopar.schema.plan and autopar.cost.step re-export them.
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
# Megatron: 2/3 are Megatron-FSDP (--data-parallel-sharding-strategy optim_grads / optim_grads_params)
FRAMEWORK_ZERO_STAGES = {Framework.MEGATRON: (0, 1, 2, 3), Framework.DEEPSPEED: (0, 1, 2, 3),
                         Framework.TORCHTITAN: (0, 2, 3)}
# ZeRO stage a user gets by naming only the framework: Megatron's distributed optimizer, DeepSpeed's
# stage 1 (the optimizer-state partitioning Megatron-DeepSpeed uses), torchtitan's FSDP2 full shard.
FRAMEWORK_DEFAULT_ZERO = {Framework.MEGATRON: 1, Framework.DEEPSPEED: 1, Framework.TORCHTITAN: 3}
# Older releases with their own cost profile (autopar.cost.frameworks.FRAMEWORK_RELEASES); a plan
# without a release describes the current ones. DeepSpeed "0.3": 0.3.13-0.5.5 (2021) on PyTorch <= 1.8;
# "megatron-deepspeed": DeepSpeed running Megatron-DeepSpeed's GPT instead of a Hugging Face model;
# torchtitan "2024-12": commit 9dec370 with torchao eab345c (tensorwise float8).
FRAMEWORK_OLDER_RELEASES = {Framework.MEGATRON: ("pre-core",), Framework.DEEPSPEED: ("0.3", "megatron-deepspeed"),
                            Framework.TORCHTITAN: ("2024-12",)}


def default_zero(framework: str) -> int:
    """The ZeRO stage of `framework` when the user does not name one (FRAMEWORK_DEFAULT_ZERO)."""
    return FRAMEWORK_DEFAULT_ZERO[Framework(framework)]
