"""What an export adds for the cluster's fabric and vendor (issue 29): the multi-node NVLink
environment and the rank order of an NVL72 rack, the RCCL / ROCm environment of an AMD Instinct
platform, and what those platforms cannot run.

- NVL72 (a scale-up domain of several hosts): ranks fill the domain in order (Megatron's
  tp-cp-ep-dp-pp, torchtitan's mesh with tp innermost), so the TP·CP block and the EP·ETP block of
  each rank stay inside one rack's NVLink domain when the scheduler hands every rack the same
  whole number of trays and that segment holds whole blocks: the job's segment is
  `autopar.hardware.segment_gpus` (64 GPUs of a 72-GPU rack for 512 GPUs), given to SLURM as
  `--segment` in trays (slurm.conf topology/block, SLURM 23.11+). NCCL reaches the other trays of
  the rack over NVLink only with multi-node NVLink on (NCCL_MNNVL_ENABLE, NCCL 2.23+; the IMEX
  daemon running on every tray, one IMEX channel per job) and reduces in the switches with NVLink
  SHARP (NCCL_NVLS_ENABLE) - NCCL environment variables documentation; NVIDIA GB200 NVL72 /
  DGX SuperPOD GB200 user guide (IMEX, block topology).
- ROCm (AMD Instinct): torch.distributed's "nccl" backend is RCCL; the environment AMD's
  Megatron-LM / torchtitan ROCm training guides set (rocm.docs.amd.com, "Training a model with
  Megatron-LM / PyTorch on ROCm"): HSA_NO_SCRATCH_RECLAIM=1, GPU_MAX_HW_QUEUES=2,
  TORCH_NCCL_HIGH_PRIORITY=1, NCCL_CHECKS_DISABLE=1, and for RoCE fabrics NCCL_IB_GID_INDEX=3.
  Transformer Engine's ROCm build has no userbuffers (the TP communication overlap of
  --tp-comm-overlap), so such a plan is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.schema.plan import ParallelPlan
from autopar.schema.plan_file import PlanFile


@dataclass(frozen=True, slots=True)
class Fabric:
    """The plan file's cluster as an exporter needs it: vendor, host, the domain and the job's segment of it."""

    vendor: str
    host_gpus: int
    domain_gpus: int
    segment_gpus: int

    @property
    def multi_node_nvlink(self) -> bool:
        return self.vendor == "nvidia" and self.domain_gpus > self.host_gpus


def fabric_of(pf: PlanFile) -> Fabric | None:
    """The fabric of the plan file's cluster profile; None when the profile cannot be loaded (an
    export still works without it, with no fabric block)."""
    from autopar.hardware import load_profile, segment_gpus  # local: exporters work without a loadable profile

    try:
        prof = load_profile(pf.target.cluster)
    except (AutoparError, OSError, ValueError):
        return None
    host = prof.node.gpus_per_node
    domain = prof.scale_up.domain_gpus if prof.scale_up else host
    segment = segment_gpus(host, domain, pf.target.gpus) if prof.scale_up else host
    return Fabric(prof.gpu.vendor, host, domain, segment)


def _blocks(plan: ParallelPlan) -> list[tuple[str, int]]:
    """The rank blocks that must share a scale-up domain: tp·cp (dense) and ep·etp (experts)."""
    out = [("tp·cp", plan.tp * plan.cp)]
    if plan.ep > 1:
        out.append(("ep·etp", plan.ep * plan.expert_tp))
    return out


def fabric_refusals(pf: PlanFile, plan: ParallelPlan) -> list[str]:
    """What the cluster's software stack cannot run for this plan (empty = exportable)."""
    fabric = fabric_of(pf)
    if fabric is None or fabric.vendor != "amd":
        return []
    out = []
    if plan.tp_comm_overlap:
        out.append("tp_comm_overlap: Transformer Engine's ROCm build has no userbuffers (--tp-comm-overlap); "
                   "turn tp_comm_overlap off for AMD Instinct")
    return out


def fabric_block(pf: PlanFile, plan: ParallelPlan) -> str | None:
    """The bash lines an export adds for its cluster's fabric: the NVL72 rank order and multi-node
    NVLink environment, or the ROCm/RCCL environment; None for an 8-GPU NVIDIA node."""
    fabric = fabric_of(pf)
    if fabric is None:
        return None
    if fabric.vendor == "amd":
        return "\n".join([
            "# ---- ROCm (AMD Instinct): torch.distributed's nccl backend is RCCL; AMD's training guides set these ----",
            "export HSA_NO_SCRATCH_RECLAIM=1     # keep kernel scratch allocated between launches",
            "export GPU_MAX_HW_QUEUES=2          # HIP hardware queues per device",
            "export TORCH_NCCL_HIGH_PRIORITY=1   # RCCL streams at high priority, ahead of compute",
            "export NCCL_CHECKS_DISABLE=1        # RCCL argument checks off",
            'export NCCL_IB_GID_INDEX="${NCCL_IB_GID_INDEX:-3}"   # <-- SET: RoCEv2 GID index of your NICs (3 is the usual)',
        ])
    if not fabric.multi_node_nvlink:
        return None
    trays = fabric.segment_gpus // fabric.host_gpus
    lines = [
        f"# ---- Multi-node NVLink: {fabric.domain_gpus} GPUs per NVLink domain over trays of {fabric.host_gpus} ----",
        f"# Ranks fill each rack in order; this plan needs {fabric.segment_gpus} GPUs ({trays} trays) of every rack, the",
        f"# same in each (SLURM: sbatch --segment={trays} with topology/block), so that every "
        + " and ".join(f"{name} block ({size} GPUs)" for name, size in _blocks(plan)) + " stays in one rack.",
        "# The IMEX daemon (nvidia-imex) must run on every tray; NCCL needs an IMEX channel (/dev/nvidia-caps-imex-channels).",
        f"export SLURM_SEGMENT_TRAYS={trays}  # for your sbatch line: --segment=$SLURM_SEGMENT_TRAYS",
        "export NCCL_MNNVL_ENABLE=1   # NCCL >= 2.23: reach the rack's other trays over NVLink",
        "export NCCL_NVLS_ENABLE=1    # NVLink SHARP: reductions in the NVLink switches",
    ]
    broken = [f"{name} {size}" for name, size in _blocks(plan) if size > 1 and fabric.segment_gpus % size]
    if broken:
        lines.insert(3, f"# Note: {', '.join(broken)} does not divide the {fabric.segment_gpus}-GPU segment: some blocks "
                        "straddle two racks and cross the scale-out network")
    return "\n".join(lines)
