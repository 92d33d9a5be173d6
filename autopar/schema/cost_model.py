"""Boundary model of a cost-model file (cost_models/*.json): the efficiencies that turn FLOPs and
bytes into seconds for one GPU type, with the provenance of every number.

The shape model (autopar.cost.compute) is parametric: efficiency = max · Π_d d/(d + half_d), times
`gemm_shape`'s factor (two saturations fitted to kernel measurements of the GPU family) where the
file has one, so a few numbers cover every GEMM shape; `gemm_table`, when a profile measured one,
overrides it by interpolation in log-shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.schema.types import Count, Real

# defer_build: the validator is built on first validation; shipped data is built without one
# (autopar.schema.plain), so `autopar plan` builds none of these classes (issue 15: start-up).
_FROZEN = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Provenance(BaseModel):
    model_config = _FROZEN

    method: Literal["calibrated", "profiled", "derived"] = Field(..., description="How the numbers were obtained.")
    command: str = Field(..., description="The autopar command (or script) that produced the file.")
    date: str = Field(..., description="ISO date of production.")
    sources: list[str] = Field(..., min_length=1, description="Data sets, papers or devices the numbers come from.")
    notes: str = Field("", description="What the numbers leave out, and how far to trust them.")


class ComputeEfficiency(BaseModel):
    model_config = _FROZEN

    gemm_max: Real = Field(..., gt=0, le=1, description="Best fraction of dense peak a large GEMM reaches.")
    gemm_half_dim: Real = Field(..., ge=0, description="A GEMM dim of this size halves efficiency in that dim.")
    attention_max: Real = Field(..., gt=0, le=1, description="Best fraction of peak of the attention kernel.")
    attention_half_seq: Real = Field(..., ge=0, description="Sequence length at which attention efficiency halves.")
    unfused_attention_max: Real = Field(0.3, gt=0, le=1, description="Fraction of peak of unfused (pre-flash) attention GEMMs: batched QK^T and AV with the scores in HBM.")
    attention_backward_ratio: Real = Field(2.5, gt=0, description="Backward/forward FLOPs of flash attention (Dao 2023).")
    hbm_efficiency: Real = Field(..., gt=0, le=1, description="Achieved fraction of HBM bandwidth by elementwise ops.")
    kernel_overhead_us: Real = Field(..., ge=0, description="Fixed launch/tail cost per kernel, microseconds.")
    layer_launch_floor_us: Real = Field(0.0, ge=0, description="CPU time to issue one layer's forward kernels; a layer pass never runs faster (launch-bound regime).")
    fp8_speedup: Real = Field(1.0, gt=0, description="Achieved fp8 over bf16 GEMM speed-up (not the 2x peak ratio).")
    fp4_speedup: Real | None = Field(None, gt=0, description="Achieved fp4 (nvfp4, mxfp4) over bf16 GEMM speed-up; null = fp8_speedup times the GPU's fp4/fp8 peak ratio (autopar.cost.compute.gemm_peak_flops).")


class NetworkEfficiency(BaseModel):
    model_config = _FROZEN

    intra_node: Real = Field(..., gt=0, le=1, description="Achieved fraction of NVLink bandwidth by NCCL (bus bw).")
    inter_node: Real = Field(..., gt=0, le=1, description="Achieved fraction of NIC bandwidth by NCCL (bus bw).")
    half_message_bytes: Real = Field(..., ge=0, description="Message size at which bandwidth efficiency halves.")
    collective_overhead_us: Real = Field(0.0, ge=0, description="Fixed cost of one collective call (launch, rank skew), microseconds.")
    tp_overlap: Real = Field(0.7, ge=0, le=1, description="Fraction of TP comm hidden when --tp-comm-overlap is on.")
    cp_overlap: Real = Field(0.9, ge=0, le=1, description="Fraction of CP K/V exchange hidden behind attention.")


class MemoryOverheads(BaseModel):
    model_config = _FROZEN

    cuda_context_gib: Real = Field(..., ge=0, description="CUDA context, cuBLAS/NCCL workspaces per GPU.")
    fragmentation: Real = Field(..., ge=0, description="Allocator fragmentation as a fraction of allocated bytes.")
    comm_buffer_gib: Real = Field(..., ge=0, description="NCCL and bucket buffers per GPU.")


class AttentionKernelRate(BaseModel):
    """A flash-attention kernel family's achieved fraction of the dense bf16 peak at long sequence
    (causal, head dim 128), forward and backward separately, with the table it was read from."""

    model_config = _FROZEN

    fwd: float = Field(..., gt=0, le=1, description="Forward FLOP rate over the dense bf16 peak.")
    bwd: float = Field(..., gt=0, le=1, description="Backward FLOP rate over the dense bf16 peak.")
    source: str = Field(..., min_length=1, description="Benchmark table or `autopar profile` run it comes from.")


# The per-framework fields a cost-model file may replace: (section, lowest, highest).
OVERRIDE_RANGES = {
    "gemm_max": ("compute", 0.0, 1.0), "hbm_efficiency": ("compute", 0.0, 1.0),
    "kernel_overhead_us": ("compute", 0.0, 1e6), "fp8_speedup": ("compute", 1.0, 4.0),
    "fp4_speedup": ("compute", 1.0, 8.0),
    "layer_launch_floor_us": ("compute", 0.0, 1e6), "intra_node": ("network", 0.0, 1.0),
    "inter_node": ("network", 0.0, 1.0), "collective_overhead_us": ("network", 0.0, 1e6),
    "tp_overlap": ("network", 0.0, 1.0), "cp_overlap": ("network", 0.0, 1.0),
}
_TIME_KEYS = frozenset({"kernel_overhead_us", "layer_launch_floor_us", "collective_overhead_us"})


class FrameworkEfficiency(BaseModel):
    """One framework's own fitted efficiencies, replacing the file's values for its plans."""

    model_config = _FROZEN

    compute: dict[str, float] = Field(default_factory=dict, description="ComputeEfficiency fields replaced.")
    network: dict[str, float] = Field(default_factory=dict, description="NetworkEfficiency fields replaced.")
    source: str = Field(..., min_length=1, description="The runs these were fitted on, or why they are set.")

    @model_validator(mode="after")
    def _known_and_plausible(self) -> "FrameworkEfficiency":
        """Every replaced field exists in its section and holds a value its section would accept:
        an efficiency or overlap in (0, 1], an overhead in [0, 10^6] µs, an fp8 gain in [1, 4]."""
        for section, values in (("compute", self.compute), ("network", self.network)):
            for key, value in values.items():
                if OVERRIDE_RANGES.get(key, (None,))[0] != section:
                    known = ", ".join(k for k, (s, _, _) in OVERRIDE_RANGES.items() if s == section)
                    raise ValueError(f"{section} override {key!r} is not a {section} efficiency; use one of {known}")
                _, low, high = OVERRIDE_RANGES[key]
                if isinstance(value, bool) or not (isinstance(value, (int, float)) and low <= value <= high) \
                        or (low == 0.0 and key not in _TIME_KEYS and value == 0):
                    raise ValueError(f"{section} override {key} = {value!r} must be in ({low}, {high}]"
                                     if key not in _TIME_KEYS else
                                     f"{section} override {key} = {value!r} must be from {low} to {high:g} µs")
        return self


class GemmPoint(BaseModel):
    model_config = _FROZEN

    m: Count = Field(..., ge=1)
    n: Count = Field(..., ge=1)
    k: Count = Field(..., ge=1)
    efficiency: Real = Field(..., gt=0, le=1.2, description="Measured TFLOP/s over the dtype's dense peak.")


class GemmShape(BaseModel):
    """Relative GEMM efficiency scale · mn/(mn + half_mn) · k/(k + half_k) of an (m × k)·(k × n) GEMM:
    it saturates with the output's size m·n (its tiles, how many waves fill the SMs) and with the
    depth k, and is about 1 on the median large shape (every dim ≥ 4096) of the measurement it is fitted to."""

    model_config = _FROZEN

    scale: Real = Field(..., gt=0, le=2)
    half_mn: Real = Field(..., ge=0, description="Output elements m·n at which that factor halves.")
    half_k: Real = Field(..., ge=0, description="Inner dim k at which that factor halves.")


class GemmShapes(BaseModel):
    """The shape factor of bf16 GEMMs, and of fp8 GEMMs (None: the bf16 one)."""

    model_config = _FROZEN

    bf16: GemmShape | None = None
    fp8: GemmShape | None = None


class FitReport(BaseModel):
    model_config = _FROZEN

    runs_fit: Count = Field(..., ge=0)
    runs_holdout: Count = Field(..., ge=0)
    mape_fit: Real | None = None
    mape_holdout: Real | None = None


class CostModelFile(BaseModel):
    model_config = _FROZEN

    schema_version: Literal[1] = 1
    name: str = Field(..., min_length=1)
    gpus: list[str] = Field(..., min_length=1, description="GPU names (as in hardware profiles) it applies to.")
    provenance: Provenance
    compute: ComputeEfficiency
    network: NetworkEfficiency
    memory: MemoryOverheads
    gemm_table: list[GemmPoint] = Field(default_factory=list, description="Profiled GEMM efficiencies, if any.")
    gemm_shape: GemmShapes | None = Field(
        None, description="GEMM efficiency by shape, fitted to kernel measurements of this GPU family (not to "
        "runs): it multiplies gemm_max (autopar.cost.compute.gemm_efficiency). Ignored when gemm_table is given; "
        "None = no shape dependence beyond gemm_half_dim.")
    attention_kernels: dict[str, AttentionKernelRate] = Field(
        default_factory=dict, description="Flash-attention rates by kernel family (fa2, fa3, cudnn; 'profiled' "
        "overrides every family); empty = attention_max for both passes.")
    frameworks: dict[str, FrameworkEfficiency] = Field(
        default_factory=dict, description="Per-framework efficiencies (megatron uses the file's own values).")
    constant_sources: dict[str, str] = Field(
        default_factory=dict, description="Where each constant comes from: fitted (on which runs), kernel "
        "benchmark (which table) or datasheet; keyed by section.field.")
    fit: FitReport | None = None
    measurements: dict[str, Any] = Field(default_factory=dict, description="Raw results of `autopar profile`.")

    @model_validator(mode="after")
    def _known_frameworks(self) -> "CostModelFile":
        """Per-framework efficiencies only for frameworks autopar plans for."""
        from autopar.frameworks import REGISTRY

        unknown = sorted(set(self.frameworks) - set(REGISTRY))
        if unknown:
            raise ValueError(f"frameworks {', '.join(unknown)} are not frameworks autopar plans for; use "
                             f"{', '.join(REGISTRY)}")
        return self
