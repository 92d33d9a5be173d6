"""`autopar profile`: measure the local accelerator (or CPU) and write a cost-model file.

Microbenchmarks, each timed after warm-up as the median of repeats:
- GEMMs of the shapes the model's layers produce under candidate tensor-parallel splits
  (tokens × out/tp × in, and tokens × out × in/tp), as TFLOP/s over the device's dense peak;
- attention (torch scaled_dot_product_attention, causal) over sequence lengths and head dims;
- memory-bound elementwise bandwidth (an out-of-place add);
- collectives between local processes through torch.distributed (all-reduce, all-gather,
  reduce-scatter, all-to-all, send/recv) over message sizes: NCCL on GPUs, gloo on the CPU.
On a GPU the results replace the base file's GEMM table and its attention, HBM and intra-node
network efficiencies; on the CPU (a functional check, and what CI runs) the "peak" is the best
GEMM throughput measured, which the file states. PyTorch is the optional extra `autopar[profile]`.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from typing import Any, Callable

from autopar.errors import AutoparError
from autopar.schema.cost_model import AttentionKernelRate, CostModelFile, GemmPoint

Progress = Callable[[str, int, int], None]


def _torch():
    try:
        import torch
    except ImportError:
        raise AutoparError("autopar profile needs PyTorch; install it with `pip install 'autopar[profile]'` "
                           "(or `pip install torch`)") from None
    return torch


def median_time_s(fn: Callable[[], None], sync: Callable[[], None], warmup: int, repeats: int) -> float:
    """Median wall time of `repeats` calls of `fn` after `warmup` calls, `sync` closing each (the
    device's queue drained, or a collective completed on every rank)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_shapes(model: str, quick: bool, cpu: bool) -> list[tuple[int, int, int]]:
    """(m, n, k) of the model's decoder GEMMs under tp splits; scaled down on the CPU."""
    from autopar.model import load_model

    layer = load_model(model).decoder_layers[0]
    scale = 16 if cpu else 1
    tps = (1, 2) if quick else (1, 2, 4, 8)
    tokens = (64, 256) if cpu and quick else ((256, 1024) if cpu else ((2048, 8192) if quick else (1024, 4096, 16384)))
    shapes = set()
    for g in layer.gemms:
        if g.is_expert or g.split == "none":
            continue
        n, k = max(g.n // scale, 16), max(g.k // scale, 16)
        for tp in tps:
            nn, kk = (n // tp, k) if g.split == "col" else (n, k // tp)
            for m in tokens:
                shapes.add((m, max(nn, 8), max(kk, 8)))
    return sorted(shapes)


def _measure_gemms(torch, device, dtype, shapes, quick, progress) -> list[tuple[int, int, int, float]]:
    out = []
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    for i, (m, n, k) in enumerate(shapes):
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        t = median_time_s(lambda: torch.matmul(a, b), sync, 2 if quick else 5, 3 if quick else 10)
        out.append((m, n, k, 2.0 * m * n * k / t))
        if progress:
            progress("gemm", i + 1, len(shapes))
    return out


def _measure_attention(torch, device, dtype, quick, progress) -> list[tuple[int, int, float, float]]:
    import torch.nn.functional as F

    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    seqs = (128, 256) if device == "cpu" else ((1024, 4096) if quick else (512, 1024, 2048, 4096, 8192))
    dims = (64, 128)
    out = []
    cases = [(s, d) for s in seqs for d in dims]
    for i, (s, d) in enumerate(cases):
        heads = 4 if device == "cpu" else 16
        q, k, v = (torch.randn(1, heads, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        with torch.no_grad():
            t = median_time_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), sync,
                               2, 3 if quick else 10)
        grad = torch.randn(1, heads, s, d, device=device, dtype=dtype)
        t_fb = median_time_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad), sync,
                              2, 3 if quick else 10)
        causal_flops = 2.0 * 2.0 * s * s * d * heads / 2  # QK^T and AV, lower triangle
        # Backward does 2.5x the forward FLOPs (Dao 2023 §3); its time is fwd+bwd minus fwd.
        out.append((s, d, causal_flops / t, 2.5 * causal_flops / max(t_fb - t, 1e-9)))
        if progress:
            progress("attention", i + 1, len(cases))
    return out


def _measure_bandwidth(torch, device, dtype, quick) -> float:
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    n = (1 << 22) if device == "cpu" else (1 << 28)
    x = torch.randn(n, device=device, dtype=dtype)
    y = torch.randn(n, device=device, dtype=dtype)
    t = median_time_s(lambda: torch.add(x, y), sync, 2, 3 if quick else 10)
    return 3.0 * n * x.element_size() / t  # read two, write one


def _all_gather(dist, out, part) -> None:
    """all_gather_single where this torch has it (2.13 deprecates all_gather_into_tensor)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, part)


def _collective_worker(rank: int, world: int, backend: str, sizes: list[int], path: str, init: str) -> None:
    """One process of the collective benchmark; rank 0 writes bus bandwidths as JSON lines."""
    import json

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    sync = (lambda: torch.cuda.synchronize()) if backend == "nccl" else (lambda: None)
    results = []
    for size in sizes:
        n = max(size // 4, world)
        n -= n % world
        x = torch.ones(n, device=device)
        out = torch.empty(n, device=device)
        chunk = torch.empty(n // world, device=device)
        ops = {
            "all_reduce": (lambda: dist.all_reduce(x), 2 * (world - 1) / world),
            "all_gather": (lambda: _all_gather(dist, out, x[: n // world]), (world - 1) / world),
            "reduce_scatter": (lambda: dist.reduce_scatter_tensor(chunk, x), (world - 1) / world),
            "all_to_all": (lambda: dist.all_to_all_single(out, x), (world - 1) / world),
        }
        if backend == "gloo":
            ops.pop("reduce_scatter")  # gloo has no reduce_scatter_tensor
        for name, (fn, factor) in ops.items():
            dist.barrier()
            t = median_time_s(fn, sync, 2, 5)
            results.append({"op": name, "bytes": n * 4, "time_s": t, "busbw_bytes_per_s": factor * n * 4 / t})
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        elif rank == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
        sync()
        rtt = time.perf_counter() - t0
        results.append({"op": "send_recv", "bytes": n * 4, "time_s": rtt / 2, "busbw_bytes_per_s": n * 4 / (rtt / 2)})
    if rank == 0:
        with open(path, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


def _measure_collectives(torch, device: str, quick: bool) -> list[dict[str, Any]]:
    import json
    import socket

    import torch.multiprocessing as mp

    world = 2 if device == "cpu" else min(torch.cuda.device_count(), 8)
    if world < 2:
        return []
    backend = "gloo" if device == "cpu" else "nccl"
    sizes = [1 << 12, 1 << 18, 1 << 22] if quick else [1 << p for p in range(10, 29, 2)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    mp.spawn(_collective_worker, args=(world, backend, sizes, path, f"tcp://127.0.0.1:{port}"), nprocs=world,
             join=True)
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    os.unlink(path)
    return rows


def _fit_half(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Fit eff(x) = top · x/(x + half) to (x, eff) points by a log-grid search on `half`."""
    best = (math.inf, 1.0, 0.0)
    for half in [0.0] + [2.0 ** e for e in range(0, 30)]:
        sat = [x / (x + half) for x, _ in points]
        top = sum(e * s for (_, e), s in zip(points, sat)) / max(sum(s * s for s in sat), 1e-30)
        err = sum((e - top * s) ** 2 for (_, e), s in zip(points, sat))
        if err < best[0]:
            best = (err, top, half)
    return best[1], best[2]


def profile(device: str = "cpu", model: str = "llama3-8b", quick: bool = False, base: str | None = None,
            command: str = "autopar profile", progress: Progress | None = None) -> CostModelFile:
    """Run the microbenchmarks and return the cost-model file (not yet written)."""
    torch = _torch()
    from autopar.cost.params import cost_model_for_gpu, load_cost_model
    from autopar.hardware import list_clusters, load_profile

    if device == "cuda" and not torch.cuda.is_available():
        raise AutoparError("--device cuda: no CUDA device is visible; use --device cpu or check the driver")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gpu_name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    peak_flops, hbm_bytes_per_s, nvlink = None, None, None
    profile_name = None
    if device == "cuda":
        for name in list_clusters():
            prof = load_profile(name)
            if any(tok in gpu_name for tok in prof.gpu.name.split()[:1]) and prof.gpu.name.split()[0] in gpu_name:
                profile_name, peak_flops = name, prof.gpu.peak_tflops.bf16 * 1e12
                hbm_bytes_per_s, nvlink = prof.gpu.hbm_gb_per_s * 1e9, prof.node.intra_node_gb_per_s * 1e9
                break
    gemms = _measure_gemms(torch, device, dtype, gemm_shapes(model, quick, device == "cpu"), quick, progress)
    attention = _measure_attention(torch, device, dtype, quick, progress)
    bandwidth = _measure_bandwidth(torch, device, dtype, quick)
    collectives = _measure_collectives(torch, device, quick)
    peak = peak_flops or max(f for *_, f in gemms)
    base_file = load_cost_model(base)[0] if base else (
        cost_model_for_gpu(load_profile(profile_name).gpu.name)[0] if profile_name else load_cost_model("h100")[0])
    compute = base_file.compute
    network = base_file.network
    if device == "cuda":
        top, half = _fit_half([(s, f / peak) for s, _, f, _ in attention])
        bwd_top, _ = _fit_half([(s, b / peak) for s, _, _, b in attention])
        compute = compute.model_copy(update={"attention_max": min(top, 1.0), "attention_half_seq": half,
                                             "hbm_efficiency": min(bandwidth / hbm_bytes_per_s, 1.0)})
        kernels = {**base_file.attention_kernels, "profiled": AttentionKernelRate(
            fwd=min(top, 1.0), bwd=min(bwd_top, 1.0),
            source=f"`{command}` on {gpu_name}: torch SDPA causal forward and backward, overrides every family")}
        base_file = base_file.model_copy(update={"attention_kernels": kernels})
        ar = [(r["bytes"], r["busbw_bytes_per_s"] / nvlink) for r in collectives if r["op"] == "all_reduce"]
        if ar:
            top, half = _fit_half(ar)
            network = network.model_copy(update={"intra_node": min(top, 1.0), "half_message_bytes": half})
    table = [GemmPoint(m=m, n=n, k=k, efficiency=min(f / peak, 1.2)) for m, n, k, f in gemms]
    notes = (f"Measured on {gpu_name} ({device}). GEMM efficiencies are TFLOP/s over "
             + (f"the {profile_name} profile's dense bf16 peak {peak / 1e12:.0f} TFLOP/s. " if peak_flops else
                f"the best GEMM throughput measured here ({peak / 1e9:.1f} GFLOP/s): a CPU run checks the "
                "pipeline end to end; its efficiencies say nothing about a GPU. ")
             + f"Elementwise bandwidth {bandwidth / 1e9:.1f} GB/s; {len(collectives)} collective measurements "
             + ("(gloo, 2 processes). " if device == "cpu" else f"(nccl, {torch.cuda.device_count()} GPUs). ")
             + f"Other parameters from the base file {base_file.name}.")
    prov = {"method": "profiled", "command": command, "date": date.today().isoformat(),
            "sources": [f"device: {gpu_name}", f"torch {torch.__version__}",
                        f"driver/cuda: {torch.version.cuda if device == 'cuda' else 'n/a (cpu)'}",
                        f"python {sys.version.split()[0]} on {platform.platform()}"],
            "notes": notes}
    gpus = [load_profile(profile_name).gpu.name] if profile_name else [f"{gpu_name} (cpu)"]
    return base_file.model_copy(update={
        "name": f"profiled-{device}", "gpus": gpus, "provenance": base_file.provenance.model_validate(prov),
        "compute": compute, "network": network, "gemm_table": table, "fit": None,
        "measurements": {"gemm_flops_per_s": [list(g) for g in gemms],
                         "attention_flops_per_s": [list(a) for a in attention],
                         "elementwise_bytes_per_s": bandwidth, "collectives": collectives}})
