"""`autopar profile --distributed`: the collectives plans use, measured on the groups they use,
across nodes, under the launcher the cluster already has (torchrun or srun).

Every rank runs `python -m autopar profile --distributed --out cluster.yaml`. The ranks are laid
out as torchrun and Slurm lay them out, node by node (rank = node · ranks per node + local rank),
and two kinds of group are measured, every group of a kind at once, as a training step runs them:

- intra-node ("TP-like"): the ranks of one node;
- inter-node ("DP-like"): the ranks with the same local rank on every node, one per node, so all
  of a node's ranks share its NICs as data-parallel rings do.

On each: all-reduce, all-gather, reduce-scatter (NCCL/RCCL only: gloo has no reduce_scatter_tensor)
and all-to-all (EP across nodes); and send/recv ping-pong between pairs (PP): local ranks 2i and
2i+1 inside a node, and the same local rank of nodes 2j and 2j+1 across nodes. Message sizes run
4 KiB to 1 GiB by powers of 4 (--quick: 4 KiB to 1 MiB, on a CPU, or 4 KiB to 16 MiB on GPUs).
Each point is the median of repeats after warm-up on every rank; the slowest rank's median is kept.

Bus bandwidth follows NCCL's convention (NVIDIA/nccl-tests doc/PERFORMANCE.md): with S the size
nccl-tests reports (all-reduce: the buffer; all-gather: the gathered output; reduce-scatter: the
input; all-to-all: one rank's send buffer) and t the time, algbw = S/t and busbw = algbw · 2(n−1)/n
for all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all; send/recv busbw = algbw.

What is written (rank 0 alone, atomically, both files or neither, through autopar.io): a cluster
profile YAML whose GPU, NIC count and topology come from a base profile (`--cluster`, default the
shipped profile of the GPU found; on a CPU, dgx-h100, stated in the file), with the measured ranks
per node and latencies (smallest send/recv, one way), and `cost_model: <out>.cost.json`, the cost
model beside it: the base cost model for the GPU with the network efficiencies measured here
(intra_node = intra all-reduce busbw at the largest size / the profile's NVLink rate, inter_node =
inter all-reduce busbw / the per-GPU NIC share, half_message_bytes fitted to the intra all-reduce
curve as profile.py fits it), plus every measurement, the group shapes, the date, torch and the
NCCL/RCCL version. On a CPU there is no datasheet: the profile's link rates are the best bus
bandwidths measured, so the efficiencies are those of the message-size curve; a CPU run checks the
pipeline end to end and says nothing about a GPU cluster.

Failures end with one line naming the rank and the cause, within `timeout_s`: one rank, ranks that
disagree (ranks per node, world size, arguments, torch version), a group that does not form, and a
rank that hangs or dies (a monitored barrier on a gloo group before each benchmark names the ranks
that did not arrive). Test hook: AUTOPAR_PROFILE_HANG_RANK=R makes rank R stop before the first
benchmark, which is how tests/test_profile_distributed.py shows the hang path.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError, SchemaError
from autopar.profile import median_time_s

HANG_RANK_ENV = "AUTOPAR_PROFILE_HANG_RANK"
DEFAULT_TIMEOUT_S = 300
DEFAULT_PORT = 29500


class DistributedProfileError(AutoparError):
    """A distributed profile run that cannot go on; the message names the rank and the cause."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Where this process sits, as the launcher said: torchrun's or Slurm's environment."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node_rank: int
    launcher: str

    @property
    def nodes(self) -> int:
        return self.world // self.local_world


def _env_int(env: dict[str, str], key: str) -> int | None:
    value = env.get(key, "")
    return int(value) if value.strip().isdigit() else None


def _slurm_tasks_per_node(env: dict[str, str]) -> int | None:
    """SLURM_NTASKS_PER_NODE, else the first count of SLURM_TASKS_PER_NODE ("4(x2),3" -> 4)."""
    direct = _env_int(env, "SLURM_NTASKS_PER_NODE")
    if direct:
        return direct
    m = re.match(r"\s*(\d+)", env.get("SLURM_TASKS_PER_NODE", ""))
    return int(m.group(1)) if m else None


def launch_from_env(env: dict[str, str] | None = None) -> Launch:
    """The Launch of this process; DistributedProfileError when no launcher started it."""
    env = dict(os.environ if env is None else env)
    if _env_int(env, "RANK") is not None and _env_int(env, "WORLD_SIZE") is not None:
        world = _env_int(env, "WORLD_SIZE")
        local_world = _env_int(env, "LOCAL_WORLD_SIZE") or world
        return Launch(_env_int(env, "RANK"), world, _env_int(env, "LOCAL_RANK") or 0, local_world,
                      _env_int(env, "GROUP_RANK") or 0, "torchrun")
    if _env_int(env, "SLURM_PROCID") is not None and _env_int(env, "SLURM_NTASKS") is not None:
        world = _env_int(env, "SLURM_NTASKS")
        return Launch(_env_int(env, "SLURM_PROCID"), world, _env_int(env, "SLURM_LOCALID") or 0,
                      _slurm_tasks_per_node(env) or world, _env_int(env, "SLURM_NODEID") or 0, "srun")
    raise DistributedProfileError(
        "--distributed runs on every rank under a launcher, and no RANK/WORLD_SIZE (torchrun) or "
        "SLURM_PROCID/SLURM_NTASKS (srun) is set; start it with the command `autopar profile --print-launch "
        "torchrun --nodes N` (or slurm) prints")


def message_sizes(quick: bool, cpu: bool) -> list[int]:
    """Message sizes in bytes: 4 KiB to 1 GiB by powers of 4; --quick stops at 16 MiB (1 MiB on a CPU)."""
    top = (20 if cpu else 24) if quick else 30
    return [1 << p for p in range(12, top + 1, 2)]


# ---- bus bandwidth (nccl-tests doc/PERFORMANCE.md) -------------------------------------------------

def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for a collective on n ranks (nccl-tests PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def bus_bandwidth_bytes_per_s(op: str, size_bytes: float, time_s: float, n: int) -> float:
    """NCCL's bus bandwidth: algbw = size / time, times bus_factor(op, n)."""
    return size_bytes / time_s * bus_factor(op, n)


# ---- groups ------------------------------------------------------------------------------------

def intra_groups(world: int, local_world: int) -> list[list[int]]:
    """The ranks of each node (rank = node · local_world + local rank)."""
    return [list(range(n * local_world, (n + 1) * local_world)) for n in range(world // local_world)]


def inter_groups(world: int, local_world: int) -> list[list[int]]:
    """For each local rank, that rank on every node."""
    return [list(range(lr, world, local_world)) for lr in range(local_world)]


def send_recv_pairs(world: int, local_world: int, kind: str) -> list[tuple[int, int]]:
    """PP-like pairs: (2i, 2i+1) local ranks inside each node, or one local rank on nodes 2j and 2j+1."""
    if kind == "intra":
        return [(n * local_world + i, n * local_world + i + 1) for n in range(world // local_world)
                for i in range(0, local_world - 1, 2)]
    nodes = world // local_world
    return [(j * local_world + lr, (j + 1) * local_world + lr) for j in range(0, nodes - 1, 2)
            for lr in range(local_world)]


# ---- the run -------------------------------------------------------------------------------------

def _fingerprint(launch: Launch, args: dict[str, Any], torch) -> dict[str, Any]:
    return {"rank": launch.rank, "world": launch.world, "local_world": launch.local_world,
            "node_rank": launch.node_rank, "host": socket.gethostname(), "torch": torch.__version__,
            "args": args}


def check_agreement(rows: list[dict[str, Any]]) -> None:
    """DistributedProfileError naming the first rank that disagrees with rank 0 (ranks per node,
    world size, arguments, torch version) or a layout that is not node by node."""
    first = rows[0]
    world = len(rows)
    for r in rows:
        if r["world"] != world:
            raise DistributedProfileError(f"rank {r['rank']} was launched for a world of {r['world']} ranks, but "
                                          f"{world} joined; give every launch the same --nnodes and --nproc-per-node")
        if r["local_world"] != first["local_world"]:
            raise DistributedProfileError(
                f"rank {r['rank']} (node {r['node_rank']}) runs {r['local_world']} ranks per node where rank 0's node "
                f"runs {first['local_world']}; launch the same --nproc-per-node (--ntasks-per-node) on every node")
        for key, what in (("args", "profile arguments"), ("torch", "torch version")):
            if r[key] != first[key]:
                raise DistributedProfileError(f"rank {r['rank']} has other {what} than rank 0 ({r[key]} vs "
                                              f"{first[key]}); run the same command and environment on every node")
    lw = first["local_world"]
    if world % lw:
        raise DistributedProfileError(f"{world} ranks do not fill nodes of {lw}; launch whole nodes")
    for r in rows:
        if r["node_rank"] != r["rank"] // lw:
            raise DistributedProfileError(
                f"rank {r['rank']} sits on node {r['node_rank']}, not node {r['rank'] // lw} as node-by-node ranks "
                "would; launch with torchrun --node-rank (or srun's block distribution) so ranks fill nodes in order")


class _Run:
    """The process group, this rank's groups and the monitored barrier that names missing ranks."""

    def __init__(self, torch, launch: Launch, backend: str, timeout_s: float) -> None:
        import torch.distributed as dist

        self.torch, self.dist, self.launch, self.backend, self.timeout_s = torch, dist, launch, backend, timeout_s
        self.device = f"cuda:{launch.local_rank % max(torch.cuda.device_count(), 1)}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        self.sync = (lambda: torch.cuda.synchronize()) if backend == "nccl" else (lambda: None)
        try:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), rank=launch.rank,
                                    world_size=launch.world)
        except Exception as exc:  # noqa: BLE001 (torch raises RuntimeError, DistStoreError, ValueError ...)
            raise DistributedProfileError(
                f"rank {launch.rank}: the process group of {launch.world} ranks did not form within {timeout_s:g} s "
                f"({_cause(exc)}); start every rank, with the same world size and rendezvous address") from None
        self.monitor = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.groups: dict[str, Any] = {}

    def make_groups(self) -> None:
        """The intra- and inter-node groups; only once the ranks agree on the layout (check_agreement),
        since every rank must create the same groups in the same order."""
        dist, launch = self.dist, self.launch
        for kind, lists in (("intra", intra_groups(launch.world, launch.local_world)),
                            ("inter", inter_groups(launch.world, launch.local_world))):
            mine = None
            for ranks in lists:  # every rank creates every group, in the same order
                g = dist.new_group(ranks) if len(ranks) > 1 else None
                if launch.rank in ranks:
                    mine = (g, len(ranks))
            if mine and mine[0] is not None:
                self.groups[kind] = mine

    def barrier(self, what: str) -> None:
        """A monitored barrier on the gloo group: rank 0 names the ranks that did not come."""
        try:
            self.dist.monitored_barrier(group=self.monitor, timeout=timedelta(seconds=self.timeout_s),
                                        wait_all_ranks=True)
        except Exception as exc:  # noqa: BLE001
            missing = re.search(r"Ranks? ([\d, ]+) failed to pass", str(exc))
            who = (f"rank {missing.group(1).strip()} did not reach" if missing else
                   "rank 0 or another rank stopped before")
            raise DistributedProfileError(
                f"rank {self.launch.rank}: {who} the {what} within {self.timeout_s:g} s (hung or died); see that "
                "rank's log, or raise --timeout for a slow start") from None

    def gather(self, obj: Any, what: str) -> list[Any]:
        """Every rank's `obj`, on the gloo group; a rank that does not take part is one line."""
        out: list[Any] = [None] * self.launch.world
        try:
            self.dist.all_gather_object(out, obj, group=self.monitor)
        except Exception as exc:  # noqa: BLE001
            raise DistributedProfileError(
                f"rank {self.launch.rank}: the exchange of {what} did not complete within {self.timeout_s:g} s "
                f"({_cause(exc)}); a rank hung or died: see the first error above and that rank's log") from None
        return out

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001 (already torn down)
            pass


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]


def _ops(run: _Run, group, n: int, size: int) -> dict[str, Any]:
    """name -> (callable, nccl-tests size in bytes) for one group and message size."""
    torch, dist = run.torch, run.dist
    elems = max(size // 4, n)
    elems -= elems % n
    x = torch.ones(elems, device=run.device)
    out = torch.empty(elems, device=run.device)
    part = torch.empty(elems // n, device=run.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ops = {"all_reduce": (lambda: dist.all_reduce(x, group=group), elems * 4),
           "all_gather": (lambda: gather(out, x[: elems // n], group=group), elems * 4),
           "reduce_scatter": (lambda: dist.reduce_scatter_tensor(part, x, group=group), elems * 4),
           "all_to_all": (lambda: dist.all_to_all_single(out, x, group=group), elems * 4)}
    if run.backend == "gloo":
        ops.pop("reduce_scatter")
    return ops


def _send_recv(run: _Run, pairs: list[tuple[int, int]], size: int, warmup: int, repeats: int) -> float | None:
    """One-way time of a ping-pong between this rank and its partner (None: no partner)."""
    me = run.launch.rank
    peer = next((b if a == me else a for a, b in pairs if me in (a, b)), None)
    if peer is None:
        return None
    x = run.torch.ones(max(size // 4, 1), device=run.device)
    first = me < peer

    def ping() -> None:
        if first:
            run.dist.send(x, peer)
            run.dist.recv(x, peer)
        else:
            run.dist.recv(x, peer)
            run.dist.send(x, peer)

    return median_time_s(ping, run.sync, warmup, repeats) / 2


def _hang_here(launch: Launch) -> None:
    value = os.environ.get(HANG_RANK_ENV, "")
    if value.strip().isdigit() and int(value) == launch.rank:
        time.sleep(10 ** 6)


def measure(run: _Run, sizes: list[int], quick: bool) -> list[dict[str, Any]]:
    """This rank's median times: rows of kind, op, group size, bytes, time_s."""
    warmup, repeats = (1, 3) if quick else (3, 10)
    rows: list[dict[str, Any]] = []
    launch = run.launch
    _hang_here(launch)
    for kind in ("intra", "inter"):
        spans = kind == "intra" and launch.local_world > 1 or kind == "inter" and launch.nodes > 1
        if not spans:
            continue
        group, n = run.groups[kind]
        for op in _ops(run, group, n, sizes[0]):
            run.barrier(f"{op} benchmark on the {kind}-node groups")
            for size in sizes:
                fn, nbytes = _ops(run, group, n, size)[op]
                try:
                    t = median_time_s(fn, run.sync, warmup, repeats)
                except Exception as exc:  # noqa: BLE001
                    raise DistributedProfileError(
                        f"rank {launch.rank}: {op} of {nbytes:,} bytes on the {kind}-node group failed "
                        f"({_cause(exc)}); a rank in its group hung or died: see the first error above and that "
                        "rank's log") from None
                rows.append({"kind": kind, "op": op, "group_size": n, "bytes": nbytes, "time_s": t})
        run.barrier(f"send/recv benchmark across the {kind}-node pairs")
        pairs = send_recv_pairs(launch.world, launch.local_world, kind)
        for size in sizes:
            t = _send_recv(run, pairs, size, warmup, repeats)
            if t is not None:
                rows.append({"kind": kind, "op": "send_recv", "group_size": 2, "bytes": max(size // 4, 1) * 4,
                             "time_s": t})
            run.barrier(f"send/recv of {size:,} bytes across the {kind}-node pairs")
    return rows


def combine(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (kind, op, bytes): the slowest rank's median time, with algbw and busbw."""
    slowest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for rank, rows in enumerate(per_rank):
        for r in rows:
            key = (r["kind"], r["op"], r["bytes"])
            if key not in slowest or r["time_s"] > slowest[key]["time_s"]:
                slowest[key] = {**r, "slowest_rank": rank}
    out = []
    for r in slowest.values():
        algbw = r["bytes"] / r["time_s"]
        out.append({**r, "algbw_bytes_per_s": algbw,
                    "busbw_bytes_per_s": bus_bandwidth_bytes_per_s(r["op"], r["bytes"], r["time_s"], r["group_size"])})
    return sorted(out, key=lambda r: (r["kind"], r["op"], r["bytes"]))


# ---- from measurements to the cluster profile and its cost model ---------------------------------

def _rows(rows: list[dict[str, Any]], kind: str, op: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == kind and r["op"] == op]


def summary(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The headline figures: best all-reduce busbw per kind, one-way latency of the smallest send/recv."""
    def best(kind: str) -> float | None:
        ar = _rows(rows, kind, "all_reduce")
        return max(r["busbw_bytes_per_s"] for r in ar) if ar else None

    def latency(kind: str) -> float | None:
        sr = _rows(rows, kind, "send_recv")
        return min(sr, key=lambda r: r["bytes"])["time_s"] if sr else None

    return {"intra_busbw_bytes_per_s": best("intra"), "inter_busbw_bytes_per_s": best("inter"),
            "intra_latency_s": latency("intra"), "inter_latency_s": latency("inter")}


def _us(measured_s: float | None, fallback_us: float) -> float:
    """A latency in microseconds to 4 digits: the measured one, else the base profile's."""
    return float(f"{(measured_s * 1e6 if measured_s is not None else fallback_us):.4g}")


def fit_saturation(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(top, half) of eff(x) = top · x / (x + half) fitted to (message bytes, efficiency) points by
    least squares, top at most 1 (a measured efficiency above the link rate is noise), half on a
    log grid from 1 B to 1 TiB: the cost model's message-size curve (cost/comm.py _transfer_s)."""
    best = (float("inf"), 1.0, 0.0)
    for half in [0.0] + [2.0 ** e for e in range(0, 41)]:
        sat = [x / (x + half) for x, _ in points]
        top = min(sum(e * s for (_, e), s in zip(points, sat)) / max(sum(s * s for s in sat), 1e-300), 1.0)
        err = sum((e - top * s) ** 2 for (_, e), s in zip(points, sat))
        if err < best[0]:
            best = (err, top, half)
    return best[1], best[2]


def _base_cluster(torch, cluster: str | None, cuda: bool):
    from autopar.hardware import list_clusters, load_profile

    if cluster:
        return load_profile(cluster)
    if cuda:
        name = torch.cuda.get_device_name(0)
        for c in list_clusters():
            prof = load_profile(c)
            if prof.gpu.name.split()[0] in name:
                return prof
        raise SchemaError(f"no shipped cluster profile has the GPU {name!r}; pass --cluster with a profile of it "
                          "(its GPU, NIC count and topology go into the file)")
    return load_profile("dgx-h100")


def _network_library(torch, backend: str) -> str:
    if backend == "gloo":
        return "gloo"
    if getattr(torch.version, "hip", None):
        return f"RCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    return f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"


def build_files(rows: list[dict[str, Any]], launch: Launch, base_profile, base_cost, *, cuda: bool, library: str,
                torch_version: str, command: str, out: str) -> tuple[str, str]:
    """(cluster YAML text, cost-model JSON text) from the combined measurements."""
    import yaml

    from autopar.hardware import cluster_from_profile
    from autopar.schema.cost_model import CostModelFile
    from autopar.schema.hardware import ClusterProfile

    s = summary(rows)
    node, net = base_profile.node, base_profile.network
    intra_gb = node.intra_node_gb_per_s
    nic_gbit = net.nic_gbit_per_s
    if not cuda:  # no datasheet: the best bus bandwidth measured stands for the link rate
        if s["intra_busbw_bytes_per_s"]:
            intra_gb = s["intra_busbw_bytes_per_s"] / 1e9
        if s["inter_busbw_bytes_per_s"]:
            node_bytes_per_s = s["inter_busbw_bytes_per_s"] * launch.local_world * net.oversubscription
            nic_gbit = node_bytes_per_s / net.nics_per_node * 8 / 1e9
    cost_name = Path(out).with_suffix("").name + ".cost.json"
    today = date.today().isoformat()
    what = (f"{launch.nodes} node(s) x {launch.local_world} rank(s), {library}, torch {torch_version}, "
            f"launched by {launch.launcher}")
    profile = {
        "name": Path(out).with_suffix("").name,
        "description": f"Measured by `{command}` on {today}: {what}. GPU, NIC count and topology from the "
                       f"{base_profile.name} profile" + ("" if cuda else " (a CPU run: a functional check of the "
                                                                          "pipeline, not a GPU cluster)") + ".",
        "sources": [f"`{command}` on {today} ({what}); every measurement, the group shapes and the fitted network "
                    f"efficiencies are in {cost_name}",
                    f"GPU, NICs and topology: the {base_profile.name} profile, whose sources are: "
                    + "; ".join(base_profile.sources)],
        "gpu": base_profile.gpu.model_dump(mode="json", exclude_none=True),
        "node": {"gpus_per_node": launch.local_world, "intra_node_gb_per_s": float(f"{intra_gb:.6g}"),
                 "intra_node_latency_us": _us(s["intra_latency_s"], node.intra_node_latency_us)},
        "network": {"nics_per_node": net.nics_per_node, "nic_gbit_per_s": float(f"{nic_gbit:.6g}"),
                    "latency_us": _us(s["inter_latency_s"], net.latency_us),
                    "topology": net.topology, "oversubscription": net.oversubscription},
        "cost_model": cost_name,
    }
    if s["inter_busbw_bytes_per_s"] is None:
        profile["sources"].append(f"Inter-node figures (NIC rate, latency, efficiency) not measured: one node; they are "
                                  f"the {base_profile.name} profile's and its cost model's")
    checked = ClusterProfile.model_validate(profile)
    cluster = cluster_from_profile(checked, launch.world, launch.nodes)
    network = base_cost.network
    update: dict[str, float] = {}
    intra = _rows(rows, "intra", "all_reduce")
    if intra:
        rate = cluster.intra_node_bytes_per_s
        top, half = fit_saturation([(r["bytes"], r["busbw_bytes_per_s"] / rate) for r in intra])
        update |= {"intra_node": min(max(top, 1e-6), 1.0), "half_message_bytes": half}
    if s["inter_busbw_bytes_per_s"]:
        share = cluster.inter_node_bytes_per_s_per_gpu
        update["inter_node"] = min(max(s["inter_busbw_bytes_per_s"] / share, 1e-6), 1.0)
    network = network.model_copy(update=update)
    notes = (f"Network efficiencies measured by `{command}` ({what}); compute and memory parameters from the base "
             f"file {base_cost.name}. intra_node: the intra-node all-reduce bus bandwidth curve over "
             f"{intra_gb:g} GB/s; inter_node: the inter-node all-reduce bus bandwidth over the per-GPU NIC share "
             f"{cluster.inter_node_bytes_per_s_per_gpu / 1e9:.4g} GB/s" + ("." if cuda else
                                                                          "; a CPU run: the link rates are the best "
                                                                          "bus bandwidths measured."))
    prov = {"method": "profiled", "command": command, "date": today,
            "sources": [f"torch {torch_version}", library, f"python {platform.python_version()} on "
                        f"{platform.platform()}", "bus bandwidth: NVIDIA/nccl-tests doc/PERFORMANCE.md"],
            "notes": notes}
    groups = {"intra": intra_groups(launch.world, launch.local_world) if launch.local_world > 1 else [],
              "inter": inter_groups(launch.world, launch.local_world) if launch.nodes > 1 else [],
              "send_recv_intra": send_recv_pairs(launch.world, launch.local_world, "intra"),
              "send_recv_inter": send_recv_pairs(launch.world, launch.local_world, "inter")}
    cost = base_cost.model_copy(update={
        "name": cost_name.removesuffix(".json"), "gpus": [base_profile.gpu.name], "network": network, "fit": None,
        "provenance": base_cost.provenance.model_validate(prov),
        "measurements": {"distributed": {"date": today, "nodes": launch.nodes, "ranks_per_node": launch.local_world,
                                          "world": launch.world, "launcher": launch.launcher, "library": library,
                                          "torch": torch_version, "groups": groups, "summary": s,
                                          "collectives": rows}}})
    CostModelFile.model_validate(cost.model_dump())
    header = (f"# Measured by `{command}` on {today}: {what}.\n"
              "# File units: TFLOP/s (dense), GiB, GB/s, Gb/s, us. The measured network efficiencies are in "
              f"{cost_name}.\n")
    return header + yaml.safe_dump(profile, sort_keys=False, width=100), cost.model_dump_json(indent=2) + "\n"


def profile_distributed(out: str, *, cluster: str | None = None, quick: bool = False,
                        timeout_s: float = DEFAULT_TIMEOUT_S, force: bool = False, inputs: list[str] = (),
                        command: str = "autopar profile --distributed") -> dict[str, Any] | None:
    """Run on every rank; rank 0 writes `out` (cluster YAML) and the cost model beside it and
    returns {"out", "cost_model", "summary", "rows"}; every other rank returns None."""
    try:
        import torch
    except ImportError:
        raise AutoparError("autopar profile --distributed needs PyTorch; install it with `pip install "
                           "'autopar[profile]'` (or `pip install torch`)") from None
    launch = launch_from_env()
    if launch.world < 2:
        raise DistributedProfileError(f"rank {launch.rank}: a distributed profile needs at least 2 ranks and this "
                                      "launch has 1; launch 2 or more per node, or on 2 or more nodes")
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    cost_path = str(Path(out).with_suffix("").parent / (Path(out).with_suffix("").name + ".cost.json"))
    args = {"quick": quick, "cluster": cluster, "out": out, "backend": backend}
    run = _Run(torch, launch, backend, timeout_s)
    try:
        check_agreement(run.gather(_fingerprint(launch, args, torch), "each rank's launch settings"))
        run.make_groups()
        verdict = None
        if launch.rank == 0:
            try:
                from autopar.io import check_output, check_outputs_apart

                for p in (out, cost_path):
                    check_output(p, force)
                check_outputs_apart([out, cost_path], inputs)
                base_profile = _base_cluster(torch, cluster, cuda)
            except AutoparError as exc:
                verdict = str(exc)
        verdict = run.gather(verdict, "rank 0's output check")[0]
        if verdict:
            raise DistributedProfileError(f"rank 0: {verdict}" if launch.rank == 0 else
                                          f"rank {launch.rank}: rank 0 refused the run: {verdict}")
        sizes = message_sizes(quick, not cuda)
        mine = measure(run, sizes, quick)
        run.barrier("end of the benchmarks")
        per_rank = run.gather(mine, "the measurements")
    except AutoparError:
        raise
    except Exception as exc:  # noqa: BLE001 (a collective's own error: one line, never a traceback)
        raise DistributedProfileError(f"rank {launch.rank}: the benchmark stopped ({_cause(exc)}); a rank hung or "
                                      "died: see the first error above and that rank's log") from None
    finally:
        run.close()
    if launch.rank != 0:
        return None
    from autopar.cost.params import cost_model_for_gpu, load_cost_model
    from autopar.io import write_outputs

    rows = combine(per_rank)
    try:
        base_cost = cost_model_for_gpu(base_profile.gpu.name)[0]
    except AutoparError:
        base_cost = load_cost_model("h100")[0]
    yaml_text, cost_text = build_files(rows, launch, base_profile, base_cost, cuda=cuda,
                                       library=_network_library(torch, backend), torch_version=torch.__version__,
                                       command=command, out=out)
    write_outputs({out: yaml_text, cost_path: cost_text}, force=force, inputs=inputs)
    return {"out": out, "cost_model": cost_path, "summary": summary(rows), "rows": rows,
            "nodes": launch.nodes, "ranks_per_node": launch.local_world}


# ---- --print-launch -------------------------------------------------------------------------------

def launch_command(launcher: str, nodes: int, gpus_per_node: int, out: str, extra: str = "") -> str:
    """The command that runs the distributed profile on `nodes` nodes of `gpus_per_node` GPUs."""
    tail = f"-m autopar profile --distributed --out {out}" + (f" {extra}" if extra else "")
    if launcher == "torchrun":
        return ("# on every node, with MASTER_ADDR the first node's address and NODE_RANK 0.."
                f"{nodes - 1}:\n"
                f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --node-rank $NODE_RANK "
                f"--master-addr $MASTER_ADDR --master-port {DEFAULT_PORT} {tail}\n")
    return ("#!/bin/bash\n"
            f"#SBATCH --job-name=autopar-profile\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={gpus_per_node}\n"
            f"#SBATCH --gpus-per-node={gpus_per_node}\n#SBATCH --exclusive\n"
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            f"export MASTER_PORT={DEFAULT_PORT}\n"
            f"srun --distribution=block python {tail}\n")


def check_launch_options(nodes: int) -> None:
    if nodes < 1 or nodes > 1 << 20:
        raise SchemaError(f"--nodes {nodes} must be from 1 to {1 << 20:,}")


