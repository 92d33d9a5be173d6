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
    """Compute precision of the GEMMs (attention stays bf16): fp8 is per-tensor scaled (Transformer
    Engine's delayed / current scaling, torchao's tensorwise / rowwise; MI300's e4m3fnuz, OCP E4M3
    elsewhere); mxfp8 is OCP MX, 32-element blocks with an E8M0 scale (Megatron-LM --fp8-recipe mxfp8,
    torchao MX; Blackwell and CDNA 4 tensor cores); nvfp4 is NVIDIA's E2M1 with a 16-element E4M3
    scale and a per-tensor FP32 one (Megatron-LM --fp4-format e2m1 --fp4-recipe nvfp4, TE's NVFP4BlockScaling
    recipe; Blackwell only); mxfp4 is OCP MX E2M1 (Blackwell, CDNA 4). A GPU runs the ones its
    profile lists (autopar.hardware.Cluster.supports), a framework the ones its spec offers."""

    BF16 = "bf16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"


# The precisions whose GEMMs take 1-byte-or-smaller operands priced at the fp8 rate, and at the fp4 rate
FP8_RATE_PRECISIONS = frozenset({"fp8", "mxfp8"})
FP4_RATE_PRECISIONS = frozenset({"nvfp4", "mxfp4"})


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
