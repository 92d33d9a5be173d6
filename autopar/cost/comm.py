"""Collective communication time on the link tier a process group spans.

Rank order is Megatron's: tp fastest, then cp, then dp (dense) or etp, ep, edp (experts), then pp.
A group of `size` ranks with stride s (product of the faster axes) stays inside a scale-up domain
when s·size <= the GPUs of the domain the job fills (Cluster.scale_up_gpus: the host of a DGX/HGX,
64 or 72 GPUs of an NVL72 rack); otherwise it holds max(1, gpd/s) ranks per domain ("node" below
means that domain: the NVLink / Infinity Fabric island, not the host).

The scale-up links a group uses: on a switch (NVSwitch) every GPU reaches any subset at its full
per-GPU rate; on a full mesh (AMD Instinct platforms: 7 xGMI links per GPU, one to each peer) a
group of k GPUs in one domain uses only the k − 1 links among them (Cluster.mesh_link_share), so
a pair talks over one link (MI300X: 64 GB/s per direction of the 448 GB/s sum; AMD Instinct
MI300X datasheet, 7 links at 128 GB/s peak bidirectional each).

Time = α · steps + volume / (bus bandwidth · message efficiency), NCCL's bus-bandwidth convention
(NCCL tests, PERFORMANCE.md): all-reduce moves 2(n-1)/n of the buffer, all-gather and
reduce-scatter (n-1)/n. Across nodes every GPU of a node communicates at once (all groups of an
axis run together), so each GPU gets its share of the node's NICs; a ring with g ranks per node
uses g rails. Ignored: SHARP/in-network reduction, congestion beyond the stated oversubscription,
NCCL protocol switches (LL/LL128/Simple) except through the fitted message-size efficiency.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from autopar.cost.params import CostParams
from autopar.hardware import Cluster


class GroupSpan(NamedTuple):
    """A process group's placement: its size, ranks per node, and nodes spanned (a NamedTuple:
    cheap to build and hash, see layer.Split)."""

    size: int
    ranks_per_node: int
    nodes: int

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def group_span(size: int, stride: int, gpus_per_node: int) -> GroupSpan:
    """Placement of a group of `size` ranks whose members are `stride` ranks apart."""
    if size <= 1:
        return GroupSpan(1, 1, 1)
    if stride * size <= gpus_per_node:
        return GroupSpan(size, size, 1)
    per_node = max(1, gpus_per_node // stride)
    return GroupSpan(size, per_node, math.ceil(size / per_node))


def bus_bandwidth_bytes_per_s(span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """Achievable bus bandwidth of a ring collective on this group, before message-size effects."""
    intra = cluster.intra_node_bytes_per_s * p.intra_node_efficiency * cluster.mesh_link_share(span.ranks_per_node)
    if not span.crosses_nodes:
        return intra
    inter = span.ranks_per_node * cluster.inter_node_bytes_per_s_per_gpu * p.inter_node_efficiency
    return min(intra, inter)


def _latency_s(span: GroupSpan, cluster: Cluster, steps: int, p: CostParams) -> float:
    """α per algorithm step plus the fixed cost of issuing one collective."""
    alpha = cluster.inter_node_latency_s if span.crosses_nodes else cluster.intra_node_latency_s
    return alpha * steps + p.collective_overhead_s


def ring_steps(n: int) -> int:
    """All-gather and reduce-scatter: NCCL runs them only as rings (no tree algorithm exists for
    them; NCCL docs, "Collective operations" and NCCL_ALGO), so latency grows with n − 1 steps."""
    return n - 1


def all_reduce_steps(n: int) -> int:
    """All-reduce: NCCL's tuner takes the cheaper of a ring (2(n − 1) steps) and its double binary
    tree (2·log2 n steps up and down; Sanders et al. 2009, used by NCCL ≥ 2.4); NVLS/CollNet are
    not modelled."""
    return min(2 * (n - 1), 2 * math.ceil(math.log2(n)))


def transfer_s(volume_bytes: float, message_bytes: float, bandwidth: float, p: CostParams) -> float:
    """`volume_bytes` over a link of `bandwidth` bytes/s in messages of `message_bytes`, at the message-size
    efficiency of every collective here (p.half_message_bytes); no latency."""
    efficiency = message_bytes / (message_bytes + p.half_message_bytes) if p.half_message_bytes else 1.0
    return volume_bytes / (bandwidth * efficiency)


def all_reduce_s(buffer_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """Ring all-reduce of a buffer of `buffer_bytes` on every rank: 2(n-1)/n · size / busbw."""
    n = span.size
    if n <= 1 or buffer_bytes <= 0:
        return 0.0
    bw = bus_bandwidth_bytes_per_s(span, cluster, p)
    return _latency_s(span, cluster, all_reduce_steps(n), p) + transfer_s(2 * (n - 1) / n * buffer_bytes, buffer_bytes, bw, p)


def all_gather_s(output_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """All-gather into `output_bytes` per rank (the whole tensor): (n-1)/n · size / busbw."""
    n = span.size
    if n <= 1 or output_bytes <= 0:
        return 0.0
    bw = bus_bandwidth_bytes_per_s(span, cluster, p)
    return _latency_s(span, cluster, ring_steps(n), p) + transfer_s((n - 1) / n * output_bytes, output_bytes, bw, p)


def reduce_scatter_s(input_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """Reduce-scatter of `input_bytes` per rank: same volume as all-gather of that size."""
    return all_gather_s(input_bytes, span, cluster, p)


def all_gather_v_s(output_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """torch.distributed.all_gather into a list of unequal parts (`output_bytes` in all, the mean
    part taken for each): ProcessGroupNCCL::allgather serves unequal sizes with one out-of-place
    broadcast per rank inside a coalesced group (its !same_size branch, _broadcast_oop per root).
    A ring broadcast moves its whole part over every hop (NCCL PERFORMANCE.md: busbw = algbw for
    broadcast), so the n parts cost n·part/busbw, n/(n − 1) times a ring all-gather's volume, and
    each fills an (n − 1)-hop pipeline. Megatron-Core's alltoall dispatcher gathers the routed
    tokens over ETP this way (mappings._gather_along_first_dim with output_split_sizes)."""
    n = span.size
    if n <= 1 or output_bytes <= 0:
        return 0.0
    part = output_bytes / n
    alpha = cluster.inter_node_latency_s if span.crosses_nodes else cluster.intra_node_latency_s
    bw = bus_bandwidth_bytes_per_s(span, cluster, p)
    return p.collective_overhead_s + n * (alpha * (n - 1) + transfer_s(part, part, bw, p))


def reduce_scatter_v_s(input_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """torch.distributed.reduce_scatter from a list of unequal parts: ProcessGroupNCCL coalesces
    one out-of-place reduce per rank (ProcessGroupNCCL::reduce_scatter, !same_size branch,
    _reduce_oop per root); a ring reduce moves its part over every hop (busbw = algbw), so the
    same time as all_gather_v_s of that size."""
    return all_gather_v_s(input_bytes, span, cluster, p)


def reduce_scatter_floor_s(input_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """≤ reduce_scatter_s(input_bytes, ...) for every size, and linear in it: the volume term at full
    message efficiency, no latency. Linear, so the floor of a mean bounds the mean of the times
    (the search's bound on ZeRO-2 gradient traffic, autopar.search.costs)."""
    n = span.size
    if n <= 1 or input_bytes <= 0:
        return 0.0
    return (n - 1) / n * input_bytes / bus_bandwidth_bytes_per_s(span, cluster, p)


def all_to_all_s(send_bytes: float, span: GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """Each rank sends `send_bytes` spread evenly over the group. The share bound for other nodes
    leaves through this GPU's share of the NICs; the rest crosses NVLink, concurrently."""
    n = span.size
    if n <= 1 or send_bytes <= 0:
        return 0.0
    local_peers = span.ranks_per_node - 1
    remote_peers = n - span.ranks_per_node
    message = send_bytes / n
    intra_bw = cluster.intra_node_bytes_per_s * p.intra_node_efficiency * cluster.mesh_link_share(span.ranks_per_node)
    t_intra = transfer_s(send_bytes * local_peers / n, message, intra_bw, p) if local_peers else 0.0
    t_inter = 0.0
    if remote_peers:
        # NCCL >= 2.12 PXN: a GPU's data for a remote GPU goes over NVLink to the local GPU on that
        # rail, which sends what the node's ranks_per_node GPUs hold for it as one network message
        # (NVIDIA technical blog "Doubling all2all Performance with NCCL 2.12", Feb 2022).
        inter_bw = cluster.inter_node_bytes_per_s_per_gpu * p.inter_node_efficiency
        t_inter = transfer_s(send_bytes * remote_peers / n, message * span.ranks_per_node, inter_bw, p)
    alpha = cluster.inter_node_latency_s if remote_peers else cluster.intra_node_latency_s
    return alpha * math.ceil(math.log2(n)) + p.collective_overhead_s + max(t_intra, t_inter)


def send_recv_s(message_bytes: float, crosses_nodes: bool, cluster: Cluster, p: CostParams) -> float:
    """Point-to-point transfer between adjacent pipeline stages."""
    if message_bytes <= 0:
        return 0.0
    if crosses_nodes:
        bw = cluster.inter_node_bytes_per_s_per_gpu * p.inter_node_efficiency  # every GPU of a node sends
        alpha = cluster.inter_node_latency_s
    else:
        bw = cluster.intra_node_bytes_per_s * p.intra_node_efficiency * cluster.mesh_link_share(2)  # one link
        alpha = cluster.intra_node_latency_s
    return alpha + p.collective_overhead_s + transfer_s(message_bytes, message_bytes, bw, p)
