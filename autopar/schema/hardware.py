"""Boundary models of a cluster profile YAML (hardware_profiles/*.yaml).

Files use the units vendors print: TFLOP/s for peaks (dense, without 2:4 sparsity), GiB for
HBM capacity, GB/s (1e9 bytes) for memory and NVLink bandwidth, Gb/s for NICs, microseconds
for latency. autopar.hardware converts them to base units once, at load. Unknown keys are
errors, and every profile must say where its numbers come from (`sources`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

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
# How the GPUs of one scale-up domain reach each other: "switch" (NVSwitch: every GPU reaches any
# subset at its full per-GPU rate) or "mesh" (AMD xGMI: one point-to-point link to each peer, so a
# group of k GPUs uses only its k - 1 links).
ScaleUpFabric = Literal["switch", "mesh"]
# Low-precision GEMM formats a GPU's tensor cores run (beside bf16, which every profile has):
# fp8 (per-tensor scaled E4M3/E5M2: Hopper, Blackwell, MI300's e4m3fnuz, MI355X's OCP), mxfp8
# (OCP MX, 32-element blocks with an E8M0 scale: Blackwell, CDNA 4), nvfp4 (NVIDIA's E2M1 with a
# 16-element E4M3 scale: Blackwell only), mxfp4 (OCP MX E2M1: Blackwell, CDNA 4).
LowPrecision = Literal["fp8", "mxfp8", "nvfp4", "mxfp4"]


class PeakTFLOPS(BaseModel):
    """Dense tensor-core peaks per GPU in TFLOP/s (datasheet 'with sparsity' figures halved)."""

    model_config = _FROZEN

    bf16: Real = Field(..., ge=MIN_RATE, le=MAX_TFLOPS, description="Dense BF16 tensor-core peak, TFLOP/s.")
    fp16: Real = Field(..., ge=MIN_RATE, le=MAX_TFLOPS, description="Dense FP16 tensor-core peak, TFLOP/s.")
    fp8: Real | None = Field(None, ge=MIN_RATE, le=MAX_TFLOPS, description="Dense FP8 tensor-core peak, TFLOP/s; null where the GPU has no FP8 (A100).")
    tf32: Real | None = Field(..., ge=MIN_RATE, le=MAX_TFLOPS, description="Dense TF32 tensor-core peak, TFLOP/s; null where the GPU has no TF32 matrix format (CDNA 4).")
    fp4: Real | None = Field(None, ge=MIN_RATE, le=MAX_TFLOPS, description="Dense FP4 (E2M1, block-scaled) tensor-core peak, TFLOP/s; null where the GPU has no FP4 (before Blackwell and CDNA 4).")


class GPUSpec(BaseModel):
    """One accelerator: its compute peaks and its HBM."""

    model_config = _FROZEN

    name: NonEmptyStr = Field(..., description="GPU model as the vendor names it, e.g. 'H100 SXM5 80GB'.")
    peak_tflops: PeakTFLOPS = Field(..., description="Dense tensor-core peaks by dtype, TFLOP/s.")
    hbm_gib: Real = Field(..., ge=MIN_RATE, le=MAX_HBM_GIB, description="HBM capacity per GPU in GiB (1024**3 bytes).")
    hbm_gb_per_s: Real = Field(..., ge=MIN_RATE, le=MAX_GB_PER_S, description="HBM bandwidth per GPU in GB/s (1e9 bytes/s).")
    hbm_type: str | None = Field(None, description="HBM generation (HBM2e, HBM3, HBM3e): the SKU, for the record.")
    power_limit_w: Real | None = Field(None, ge=1, le=1e5, description="Board power limit the GPUs ran at, W; the peaks above must be those sustained at it.")
    vendor: Literal["nvidia", "amd"] = Field("nvidia", description="Who makes the GPU: its collective library (NCCL or RCCL), launcher environment and kernels.")
    low_precision: list[LowPrecision] | None = Field(None, description="Low-precision GEMM formats the tensor cores run besides bf16; null = fp8 where an fp8 peak is given.")


class NodeSpec(BaseModel):
    """One server: how many GPUs share the NVLink/NVSwitch domain and how fast it is."""

    model_config = _FROZEN

    gpus_per_node: Count = Field(..., ge=1, le=MAX_GPUS, description="GPUs in one host (server, or NVL72 compute tray); jobs use whole hosts.")
    intra_node_gb_per_s: Real = Field(..., ge=MIN_RATE, le=MAX_GB_PER_S, description="NVLink bandwidth per GPU per direction, GB/s (half the vendor's bidirectional figure).")
    intra_node_latency_us: Real = Field(..., ge=0, le=MAX_LATENCY_US, description="Per-message NVLink latency, microseconds.")


class ScaleUpSpec(BaseModel):
    """The scale-up domain: the GPUs that share NVLink / Infinity Fabric, stated apart from the host.
    Absent: one host is one domain, through a switch (DGX/HGX)."""

    model_config = _FROZEN

    domain_gpus: Count = Field(..., ge=1, le=MAX_GPUS, description="GPUs in one scale-up domain: 72 for an NVL72 rack, 8 for DGX/HGX and AMD 8-GPU platforms.")
    fabric: ScaleUpFabric = Field("switch", description="'switch' (NVSwitch: any subset at the full per-GPU rate) or 'mesh' (point-to-point links, one per peer).")
    links_per_gpu: Count | None = Field(None, ge=1, le=MAX_GPUS, description="Point-to-point links of one GPU (mesh only): node.intra_node_gb_per_s is their sum.")
    name: NonEmptyStr = Field(..., description="The fabric as the vendor names it, e.g. 'NVLink 5, NVL72 (18 NVLink switch chips in 9 trays)'.")


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
    node: NodeSpec = Field(..., description="The host and its per-GPU scale-up bandwidth.")
    scale_up: ScaleUpSpec | None = Field(None, description="The scale-up domain when it is not one host (NVL72) or not a switch (xGMI mesh).")
    network: NetworkSpec = Field(..., description="The inter-node fabric.")
    cost_model: NonEmptyStr | None = Field(None, description="A cost-model JSON, relative to this file, whose efficiencies apply when --cost-model is not given: what `autopar profile --distributed` measured on this cluster.")

    @model_validator(mode="after")
    def _domain_holds_whole_hosts(self) -> "ClusterProfile":
        """A scale-up domain is whole hosts (an NVL72 rack: 18 trays of 4), and a mesh names its links."""
        peaks = self.gpu.peak_tflops
        for fmt in self.gpu.low_precision or ():
            needs = "fp4" if fmt in ("nvfp4", "mxfp4") else "fp8"
            if getattr(peaks, needs) is None:
                raise ValueError(f"gpu.low_precision lists {fmt} but gpu.peak_tflops has no {needs} peak; add it or drop {fmt}")
        up = self.scale_up
        if up is None:
            return self
        hosts = self.node.gpus_per_node
        if up.domain_gpus < hosts or up.domain_gpus % hosts:
            raise ValueError(f"scale_up.domain_gpus {up.domain_gpus} must be a multiple of node.gpus_per_node {hosts} "
                             "(a domain is whole hosts)")
        if up.fabric == "mesh" and not up.links_per_gpu:
            raise ValueError("a mesh scale-up fabric needs scale_up.links_per_gpu (e.g. 7 xGMI links on an 8-GPU MI300X platform)")
        return self
