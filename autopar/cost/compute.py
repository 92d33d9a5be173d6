"""Compute time of one op on one GPU from its FLOPs or bytes and a shape-dependent efficiency.

Model: time = FLOPs / (peak · eff) + kernel overhead, with eff = max · Π_d d/(d + d_half) over the
GEMM dims m, n, k (a saturating fit in the spirit of the roofline; small dims starve the tensor
cores). Memory-bound ops take bytes / (HBM bandwidth · efficiency). The efficiencies come from a
cost-model file. Ignored: wave quantization, L2 reuse, and clock throttling beyond what the fit
absorbs.
"""

from __future__ import annotations

import math

from autopar.cost.params import CostParams


def _saturation(dim: float, half: float) -> float:
    return dim / (dim + half)


def gemm_efficiency(m: float, n: float, k: float, p: CostParams, fp8: bool = False) -> float:
    """Fraction of dense peak a (m × k)·(k × n) GEMM reaches: from the profiled table if present, else
    gemm_max times the saturation in each dim, times the shape factor the cost model measured for the
    GPU family where it has one (gemm_shape: the output's tiles m·n and the depth k, each saturating,
    so a TP-split projection with k = hidden/tp or an expert's few thousand tokens runs below a
    large GEMM; fp8 GEMMs by their own fit)."""
    if p.gemm_table:
        return _interpolate_gemm(m, n, k, p.gemm_table)
    h = p.gemm_half_dim
    eff = p.gemm_max * _saturation(m, h) * _saturation(n, h) * _saturation(k, h)
    shape = p.gemm_shape_fp8 if fp8 and p.gemm_shape_fp8 else p.gemm_shape
    if shape:
        scale, half_mn, half_k = shape
        eff *= scale * _saturation(m * n, half_mn) * _saturation(k, half_k)
    return eff


def _interpolate_gemm(m: float, n: float, k: float, table: tuple) -> float:
    """Inverse-distance weighting in log2(m, n, k) over the 4 nearest profiled shapes."""
    q = (math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)))
    nearest = sorted(
        (sum((a - math.log2(b)) ** 2 for a, b in zip(q, pt[:3])), pt[3]) for pt in table
    )[:4]
    if nearest[0][0] < 1e-12:
        return nearest[0][1]
    weights = [1.0 / d for d, _ in nearest]
    return sum(w * e for w, (_, e) in zip(weights, nearest)) / sum(weights)


# Share of the datasheet HBM bandwidth a GEMM's operand and result streams reach: our H200
# device-to-device copy, 4.00 of 4.8 TB/s (cost_models/measured/h200_kernels.json, hbm_copy_bytes_per_s).
GEMM_STREAM_HBM_EFFICIENCY = 0.83


def gemm_time_s(m: float, n: float, k: float, peak_flops: float, p: CostParams, count: float = 1.0,
                bytes_moved: float = 0.0, hbm_bytes_per_s: float = 0.0, fp8: bool = False) -> float:
    """`count` identical GEMMs of shape (m, n, k): the larger of 2·m·n·k FLOPs at the shape's
    efficiency and `bytes_moved` (operands read, result written) at HBM speed, the roofline
    (Williams et al. 2009, "Roofline", CACM 52(4)); the second binds for skinny GEMMs such as
    fine-grained experts with a few hundred tokens each. Without bytes or bandwidth: FLOPs only."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    compute_s = 2.0 * m * n * k / (peak_flops * gemm_efficiency(m, n, k, p, fp8))
    memory_s = bytes_moved / (hbm_bytes_per_s * GEMM_STREAM_HBM_EFFICIENCY) if hbm_bytes_per_s > 0 else 0.0
    return count * (max(compute_s, memory_s) + p.kernel_overhead_s)


def gemm_pass_bytes(m: float, n: float, k: float, input_bytes: float) -> tuple[float, float, float]:
    """HBM bytes of one linear's three GEMMs, y = x·W with x (m × k), W (k × n): forward reads x
    and W and writes y (bf16); dgrad reads dy and W and writes dx (bf16); wgrad reads x and dy and
    reads + writes the fp32 main gradient it accumulates into (Megatron
    --gradient-accumulation-fusion, on by default; TE's fuse_wgrad_accumulation). `input_bytes`
    per operand element: 2 (bf16) or 1 (fp8 casts)."""
    fwd = input_bytes * (m * k + k * n) + 2.0 * m * n
    dgrad = input_bytes * (m * n + n * k) + 2.0 * m * k
    wgrad = input_bytes * (m * k + m * n) + 8.0 * k * n
    return fwd, dgrad, wgrad


def attention_efficiency(seq_len: float, p: CostParams, unfused: bool = False, rate: float | None = None) -> float:
    """Fraction of peak: the kernel family's long-sequence rate (or the file's attention_max)
    times a saturation in the sequence length the kernel sees."""
    peak_fraction = p.unfused_attention_max if unfused else (p.attention_max if rate is None else rate)
    return peak_fraction * _saturation(seq_len, p.attention_half_seq)


def attention_time_s(flops: float, seq_len: float, peak_flops: float, p: CostParams, unfused: bool = False,
                     rate: float | None = None) -> float:
    """One attention pass (QK^T and AV; FLOPs counted causally) at `rate` of the bf16 peak: a fused
    flash kernel (rates per family from the FlashAttention-2/-3 papers' tables, see the cost-model
    file), or unfused batched GEMMs whose softmax traffic is priced separately. `peak_flops` is the
    bf16 peak even in fp8 plans: TE and torchao run attention in bf16."""
    if flops <= 0:
        return 0.0
    return flops / (peak_flops * attention_efficiency(seq_len, p, unfused, rate)) + p.kernel_overhead_s


def gemm_peak_flops(precision: str, peak_flops_by_dtype: dict[str, float], p: CostParams) -> float:
    """The rate the low-precision-eligible GEMMs of a `precision` plan are priced at, as the bf16 peak
    times an achieved gain (not the datasheet's ratio): bf16 at its peak; fp8 and mxfp8 at
    p.fp8_speedup (an MXFP8 GEMM runs at the FP8 tensor-core rate, its E8M0 block scales applied
    in the MMA on Blackwell and CDNA 4: NVIDIA Blackwell architecture technical brief, AMD CDNA 4
    white paper); nvfp4 and mxfp4 at p.fp4_speedup, or where the cost model has none, derived:
    fp8_speedup × the GPU's dense fp4/fp8 peak ratio (the same fraction of peak as fp8 reaches).
    Ignored: NVFP4's random Hadamard transforms and 2D weight scaling beyond the casts, which the
    cast terms price at fp8's bytes (autopar.cost.layer)."""
    bf16 = peak_flops_by_dtype["bf16"]
    name = str(precision)
    if name in ("fp8", "mxfp8"):
        return bf16 * p.fp8_speedup
    if name in ("nvfp4", "mxfp4"):
        if p.fp4_speedup:
            return bf16 * p.fp4_speedup
        return bf16 * p.fp8_speedup * peak_flops_by_dtype["fp4"] / peak_flops_by_dtype["fp8"]
    return bf16


def memory_bound_time_s(bytes_moved: float, hbm_bytes_per_s: float, p: CostParams, kernels: int = 1) -> float:
    """Elementwise ops (norms, activations, residuals, optimizer): HBM traffic over achieved bandwidth."""
    if bytes_moved <= 0:
        return 0.0
    return bytes_moved / (hbm_bytes_per_s * p.hbm_efficiency) + kernels * p.kernel_overhead_s
