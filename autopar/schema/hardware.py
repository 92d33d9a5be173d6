"""Boundary models of a cluster profile YAML (hardware_profiles/*.yaml).

Files use the units vendors print: TFLOP/s for peaks (dense, without 2:4 sparsity), GiB for
HBM capacity, GB/s (1e9 bytes) for memory and NVLink bandwidth, Gb/s for NICs, microseconds
for latency. autopar.hardware converts them to base units once, at load. Unknown keys are
errors, and every profile must say where its numbers come from (`sources`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from autopar.limits import MAX_GPUS
from autopar.schema.types import Count, Real

# Bounds a profile's numbers must keep, so that no conversion to base units overflows or divides by
# nothing: far outside any accelerator (a 10 EFLOP/s GPU, 1 PiB of HBM, 10 PB/s links), far inside
# a float's range.
MIN_RATE = 1e-3  # TFLOP/s, GiB, GB/s, Gb/s: any smaller is a typo, and its reciprocal still finite
MAX_TFLOPS = 1e7
MAX_HBM_GIB = 1e6
MAX_GB_PER_S = 1e7
MAX_LATENCY_US = 1e6

# defer_build: the validator is built on first validation; shipped data is built without one
# (autopar.schema.plain), so `autopar plan` builds none of these classes (issue 15: start-up).
_FROZEN = ConfigDict(frozen=True, extra="forbid", defer_build=True)

NonEmptyStr = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]

Topology = Literal["rail-optimized-fat-tree", "fat-tree"]


class PeakTFLOPS(BaseModel):
    """Dense tensor-core peaks per GPU in TFLOP/s (datasheet 'with sparsity' figures halved)."""

    model_config = _FROZEN

    bf16: Real = Field(..., ge=MIN_RATE, le=MAX_TFLOPS, description="Dense BF16 tensor-core peak, TFLOP/s.")
    fp16: Real = Field(..., ge=MIN_RATE, le=MAX_TFLOPS, description="Dense FP16 tensor-core peak, TFLOP/s.")
    fp8: Real | None = Field(None, ge=MIN_RATE, le=MAX_TFLOPS, description="Dense FP8 tensor-core peak, TFLOP/s; null where the GPU has no FP8 (A100).")
    tf32: Real = Field(..., ge=MIN_RATE, le=MAX_TFLOPS, description="Dense TF32 tensor-core peak, TFLOP/s.")


class GPUSpec(BaseModel):
    """One accelerator: its compute peaks and its HBM."""

    model_config = _FROZEN

    name: NonEmptyStr = Field(..., description="GPU model as the vendor names it, e.g. 'H100 SXM5 80GB'.")
    peak_tflops: PeakTFLOPS = Field(..., description="Dense tensor-core peaks by dtype, TFLOP/s.")
    hbm_gib: Real = Field(..., ge=MIN_RATE, le=MAX_HBM_GIB, description="HBM capacity per GPU in GiB (1024**3 bytes).")
    hbm_gb_per_s: Real = Field(..., ge=MIN_RATE, le=MAX_GB_PER_S, description="HBM bandwidth per GPU in GB/s (1e9 bytes/s).")
    hbm_type: str | None = Field(None, description="HBM generation (HBM2e, HBM3, HBM3e): the SKU, for the record.")
    power_limit_w: Real | None = Field(None, ge=1, le=1e5, description="Board power limit the GPUs ran at, W; the peaks above must be those sustained at it.")


class NodeSpec(BaseModel):
    """One server: how many GPUs share the NVLink/NVSwitch domain and how fast it is."""

    model_config = _FROZEN

    gpus_per_node: Count = Field(..., ge=1, le=MAX_GPUS, description="GPUs in one NVLink domain (one server).")
    intra_node_gb_per_s: Real = Field(..., ge=MIN_RATE, le=MAX_GB_PER_S, description="NVLink bandwidth per GPU per direction, GB/s (half the vendor's bidirectional figure).")
    intra_node_latency_us: Real = Field(..., ge=0, le=MAX_LATENCY_US, description="Per-message NVLink latency, microseconds.")


class NetworkSpec(BaseModel):
    """The scale-out fabric between nodes."""

    model_config = _FROZEN

    nics_per_node: Count = Field(..., ge=1, le=MAX_GPUS, description="Compute-fabric NICs per node (storage NICs excluded).")
    nic_gbit_per_s: Real = Field(..., ge=MIN_RATE, le=MAX_GB_PER_S, description="Line rate of one NIC in Gb/s, as vendors state it (e.g. 400 for NDR).")
    latency_us: Real = Field(..., ge=0, le=MAX_LATENCY_US, description="Per-message inter-node latency, microseconds.")
    topology: Topology = Field(..., description="Fabric shape: 'rail-optimized-fat-tree' or 'fat-tree'.")
    oversubscription: Real = Field(1.0, ge=1, le=1e3, description="Fabric oversubscription ratio; 1 = non-blocking.")


class ClusterProfile(BaseModel):
    """A cluster profile file: one GPU type, one node type, one network, and their sources."""

    model_config = _FROZEN

    name: NonEmptyStr = Field(..., description="Profile name; shipped files are named <name>.yaml.")
    description: NonEmptyStr = Field(..., description="One or two sentences on what system this is.")
    sources: list[NonEmptyStr] = Field(..., min_length=1, description="Datasheets, user guides or papers each number comes from; estimates say so.")
    gpu: GPUSpec = Field(..., description="The accelerator.")
    node: NodeSpec = Field(..., description="The server and its NVLink domain.")
    network: NetworkSpec = Field(..., description="The inter-node fabric.")
