"""ZeRO-3 / FSDP parameter traffic of one microbatch: the all-gathers of sharded weights before each
unit computes and the reduce-scatter of its gradients, and how much of it compute hides.

Units (autopar.frameworks): DeepSpeed ZeRO-3 gathers per module, each nn.Linear and the
norms of a layer (Rajbhandari et al. 2020, ZeRO §5; its pre-forward hooks), FSDP2 and Megatron-FSDP
one transformer block at a time (torch.distributed.fsdp.fully_shard per block). Each gather is its
own collective, so latency ((n − 1) ring steps) and message-size efficiency apply per unit.
Passes per microbatch: forward gathers; backward gathers again (weights were resharded after
forward) and reduce-scatters the gradients; with full recompute DeepSpeed's module hooks gather a
third time for the recompute, while FSDP2 recomputes inside the block's unsharded backward.

Overlap is bounded by the prefetch depth d (FSDP2 and DeepSpeed prefetch the next unit): unit i's
communication runs while the previous d units compute, so a pass exposes
comm_0 + Σ_{i≥1} max(0, comm_i − Σ_{j=i−d}^{i−1} compute_j) (the first unit has nothing to hide
behind). All units of a pass share one communication stream. Nothing overlaps when the plan turns
parameter-gather overlap off (DeepSpeed's stage3_prefetch_bucket_size 0, as the exporter writes it) or
the framework release gathers synchronously (DeepSpeed <= 0.5.5: torch.cuda.synchronize() before each
gather waits for every stream, the gradient reduce-scatter's too). DeepSpeed never gathers the
parameters under its persistence threshold (norms and biases). DeepSpeed <= 0.5.5 on PyTorch <= 1.8
also pays one copy kernel per rank of the group around every gather and reduce-scatter (see
autopar.frameworks, releases). Ignored: HSDP's replica all-reduce, the expert data-parallel group
(experts are gathered over the dense group), rate limiting of in-flight gathers, DeepSpeed's
host-side hook and Python work per module.
"""

from __future__ import annotations

from autopar.cost import comm, memory
from autopar.frameworks import framework_profile
from autopar.cost.layer import BF16_BYTES, LayerCost
from autopar.cost.params import CostParams
from autopar.hardware import Cluster
from autopar.model.graph import Layer
from autopar.frameworks import REGISTRY
from autopar.schema.plan import ParallelPlan

# Bytes per gradient element reduce-scattered: the framework's gradient dtype (autopar.cost.memory.
# main_grad_bytes): FSDP2 in torchtitan reduces in fp32 (MixedPrecisionPolicy reduce_dtype=float32);
# DeepSpeed in the 16-bit gradient dtype; Megatron-FSDP in fp32 (main grads).
GRAD_REDUCE_BYTES = {fw: memory.main_grad_bytes(fw, False) for fw in REGISTRY}


def gather_units(layer: Layer, plan: ParallelPlan, unit: str, persistence_threshold: float = 0.0) -> list[float]:
    """Parameters on one GPU (before ZeRO-3 sharding) of each gather unit of `layer`: one per
    block, or one per module (each weight matrix, and the layer's norms together). The norms and
    biases are left out when each of them is under `persistence_threshold` elements: none is longer
    than the widest GEMM output (a bias), so that width decides."""
    per_gemm = []
    for g in layer.gemms:
        if g.tied:
            continue
        params = g.params
        if g.bias and not g.is_expert and _local_bias(g, plan) < persistence_threshold:  # persistent_tensors
            params -= g.n
        if g.is_expert:
            per_gemm.append(params / (plan.ep * plan.expert_tp))
        elif g.split in ("col", "row", "vocab"):
            per_gemm.append(params / plan.tp)
        else:
            per_gemm.append(float(params))
    other = layer.other_params_tp / plan.tp + layer.other_params_replicated
    if layer.gemms and max(g.n for g in layer.gemms) < persistence_threshold:
        other = 0.0
    units = per_gemm + ([other] if other > 0 else [])
    if unit == "block":
        return [sum(units)] if sum(units) > 0 else []
    return units


def largest_unit_params(layers: list[Layer], plan: ParallelPlan) -> float:
    """Parameters on one GPU of the largest gather unit among `layers` (a block or a module)."""
    fw = framework_profile(plan.framework, plan.framework_release)
    return max((max(gather_units(layer, plan, fw.gather_unit, fw.persistence_threshold_params), default=0.0)
                for layer in layers), default=0.0)


def exposed_pass_s(comm_s: list[float], compute_s: list[float], prefetch_depth: int,
                   prefetched: list[bool] | None = None) -> float:
    """Exposed communication of one pass over units in order: unit i's gather overlaps the compute
    of the `prefetch_depth` units before it (see the module docstring), unless it is too large to
    be prefetched (`prefetched[i]` False), when all of it waits."""
    exposed = 0.0
    for i, c in enumerate(comm_s):
        window = sum(compute_s[max(0, i - prefetch_depth):i])
        can_prefetch = prefetched is None or prefetched[i]
        exposed += c if i == 0 or not can_prefetch else max(0.0, c - window)
    return exposed


# One copy_ kernel issued from C++ for a small slice (PyTorch dispatcher + launch), on A100 in 2021:
# DeepSpeed PR #1188 (Oct 2021) removed the per-rank copies of gathering a 9,834,560-element layer
# (16 weight and bias tensors, each copied once per rank by DeepSpeed plus once per rank by c10d:
# 16·8 + 8 = 136 copies on one 8-GPU p4d node) and saved about 1.1 ms: 1.1 ms / 136 ≈ 8 us a copy.
LIST_COPY_KERNEL_S = 8e-6


def per_rank_copies_s(buffer_bytes: float, n: int, cluster: Cluster, p: CostParams) -> float:
    """The list form of torch.distributed.all_gather / reduce_scatter on PyTorch <= 1.8 copies each
    of the n ranks' slices between the caller's tensors and NCCL's flat buffer with its own copy_
    kernel (torch/lib/c10d/ProcessGroupNCCL.cpp, allgather and reduce_scatter): n kernels of
    LIST_COPY_KERNEL_S that move the buffer once each way. Ignores DeepSpeed's Python loop over
    ranks that builds the list (partition_parameters._allgather_param)."""
    if n <= 1 or buffer_bytes <= 0:
        return 0.0
    return 2.0 * buffer_bytes / (cluster.hbm_bytes_per_s * p.hbm_efficiency) + n * LIST_COPY_KERNEL_S


def stage_stays_unsharded(plan: ParallelPlan) -> bool:
    """ZeRO-3 under pp > 1 in a framework that keeps the stage gathered through the step
    (FrameworkSpec.pp_keeps_stage_unsharded: torchtitan with PyTorch's pipelining)."""
    return plan.zero >= 3 and plan.pp > 1 and REGISTRY[plan.framework].pp_keeps_stage_unsharded


def passes_per_step(plan: ParallelPlan, microbatches: int) -> int:
    """How many times a step pays exposed_per_microbatch_s: once per microbatch, or once per step when
    the stage stays unsharded (gathered at the first microbatch, reduce-scattered after the last)."""
    return 1 if stage_stays_unsharded(plan) else microbatches


def _local_bias(g, plan: ParallelPlan) -> float:
    """Elements of a dense GEMM's bias on one GPU: split over tp with a column-parallel output."""
    return g.n / plan.tp if g.split in ("col", "vocab") else float(g.n)


def persistent_tensors(layer: Layer, plan: ParallelPlan, threshold: float) -> tuple[int, float]:
    """(count, elements on one GPU) of `layer`'s parameter tensors under DeepSpeed's persistence
    threshold: its norms' weights and biases (hidden_size each) and the biases of its dense GEMMs
    (n, split over tp for a column-parallel one), each under `threshold` elements."""
    count, elements = 0, 0.0
    for g in layer.gemms:
        if not g.bias or g.tied or g.is_expert:
            continue
        numel = _local_bias(g, plan)
        if numel < threshold:
            count, elements = count + 1, elements + numel
    width = max((g.k for g in layer.gemms if g.split in ("col", "none") and not g.is_expert), default=0)  # hidden
    if layer.norm_tensors and width < threshold:
        count, elements = count + layer.norm_tensors, elements + layer.norm_tensors * width
    return count, elements


def persistent_regather_s(chunks: list[list[Layer]], plan: ParallelPlan, span: comm.GroupSpan, cluster: Cluster,
                          p: CostParams) -> float:
    """Once per step, 0 unless the release re-gathers its persistent parameters after each step
    (FrameworkProfile.persistent_regather: DeepSpeed 0.3.13-0.5.4, see autopar.frameworks.deepspeed):
    one all_gather of their slices (with its per-rank copies) and one copy kernel per parameter per
    rank into the replicated tensors (LIST_COPY_KERNEL_S each), synchronous. `chunks`: the rank's
    model chunks (lists of layers)."""
    fw = framework_profile(plan.framework, plan.framework_release)
    if plan.zero < 3 or span.size <= 1 or not fw.persistent_regather:
        return 0.0
    count, elements = 0, 0.0
    for layer in (layer for chunk in chunks for layer in chunk):
        c, e = persistent_tensors(layer, plan, fw.persistence_threshold_params)
        count, elements = count + c, elements + e
    if not count:
        return 0.0
    n = span.size
    gathered = elements * BF16_BYTES
    return (comm.all_gather_s(gathered, span, cluster, p) + per_rank_copies_s(gathered, n, cluster, p)
            + count * n * LIST_COPY_KERNEL_S)


def exposed_per_microbatch_s(layers: list[tuple[Layer, LayerCost, str]], plan: ParallelPlan,
                             span: comm.GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """Exposed ZeRO-3/FSDP communication of one microbatch on one pipeline rank (0 below ZeRO 3).
    `layers`: the rank's layers in execution order with their cost and recompute mode. When the
    stage stays unsharded (stage_stays_unsharded) the backward gathers nothing: the weights gathered
    for the forward are still there."""
    if plan.zero < 3 or span.size <= 1:
        return 0.0
    unsharded = stage_stays_unsharded(plan)
    fw = framework_profile(plan.framework, plan.framework_release)
    grad_bytes = memory.main_grad_bytes(plan.framework, plan.grad_reduce_in_bf16)
    fwd_comm, fwd_compute, bwd_comm, bwd_compute, ahead = [], [], [], [], []
    limit = fw.prefetch_max_params
    n = span.size if fw.per_rank_copies else 1
    for layer, c, mode in layers:
        units = gather_units(layer, plan, fw.gather_unit, fw.persistence_threshold_params)
        backward_gathers = 0 if unsharded else fw.gathers_under_full_recompute - 1 if mode == "full" else 1
        share = len(units or [1])  # a layer's compute is shared evenly by its units
        fwd_s = c.fwd_compute_s / share
        bwd_s = (c.bwd_compute_s + (c.fwd_compute_s if mode == "full" else 0.0)) / share
        for u in units:
            gather = (comm.all_gather_s(u * BF16_BYTES, span, cluster, p)
                      + per_rank_copies_s(u * BF16_BYTES, n, cluster, p))
            reduce = (comm.reduce_scatter_s(u * grad_bytes, span, cluster, p)
                      + per_rank_copies_s(u * grad_bytes, n, cluster, p))
            fwd_comm.append(gather)
            fwd_compute.append(fwd_s)
            bwd_comm.append(backward_gathers * gather + reduce)
            bwd_compute.append(bwd_s)
            ahead.append(limit is None or u <= limit)
    d = fw.prefetch_depth if plan.overlap_param_gather and not fw.synchronous_gathers else 0
    return (exposed_pass_s(fwd_comm, fwd_compute, d, ahead)
            + exposed_pass_s(bwd_comm[::-1], bwd_compute[::-1], d, ahead[::-1]))
