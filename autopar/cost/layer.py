"""Time of one layer for one microbatch on one GPU: compute of every GEMM after TP/CP/EP splitting,
attention and elementwise ops, and the TP, CP and EP communication the layer issues.

Splitting (Megatron-Core): column/row-parallel GEMMs see all T tokens of the microbatch and n or k
divided by tp; replicated GEMMs (router, MLA down-projections) see T/tp tokens under sp; routed
experts see T/tp · top_k tokens per rank spread over E/ep local experts (balanced routing times a
stated imbalance factor), each ETP-split; attention heads are divided by tp and tokens by cp.
Backward GEMMs = dgrad + wgrad, each at the larger of its FLOPs and its HBM bytes (compute.gemm_time_s:
twice the forward when compute-bound), attention × the file's backward ratio,
elementwise × 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from autopar.cost import comm
from autopar.cost.compute import attention_time_s, gemm_pass_bytes, gemm_time_s, memory_bound_time_s
from autopar.cost.params import CostParams
from autopar.frameworks.megatron import TE_UNFUSED_BYTES_PER_SCORE
from autopar.hardware import Cluster
from autopar.model.graph import Layer
from autopar.schema.plan import RecomputeMode

# Gemm name prefixes -> Megatron recompute module that recomputes them under selective recompute.
_GEMM_MODULE = {"mlp": "mlp", "expert": "moe", "shared": "shared_experts", "q_up": "mla_up_proj",
                "kv_up": "mla_up_proj"}
# Share of a layer's sp-side elementwise traffic that is its two norms (4h of the 10h, see build.py).
_NORM_SHARE_OF_SP_BYTES = 0.4
BF16_BYTES = 2
OP_SAC = "op_sac"  # the selective policy of torchtitan (see autopar.frameworks)
# GEMMs an fp8 plan still runs in bf16 (besides the vocab-parallel output layer, split "vocab"):
# fp8 covers Transformer Engine's linears (torchao's converted nn.Linears); Megatron-Core's output
# layer is its own ColumnParallelLinear (gpt_model.py, f1f03922 and HEAD, TE only for MXFP8 with
# fp8_output_proj) and torchtitan's float8 converter leaves "output" out (filter_fqns); the router
# is a plain matmul in the input (or fp32) dtype (moe/router.py gating), as is the shared-expert gate.
BF16_ONLY_GEMMS = frozenset({"router", "shared_gate"})
# Linears that take their input from the norm before them (TE LayerNormLinear): the attention's
# input projection (q for MLA without a q low rank) and the dense MLP's fc1.
NORM_FED_GEMMS = frozenset({"qkv", "q", "mlp_fc1"})
# An fp8 linear casts its bf16 operands with a fused cast-transpose kernel (Transformer Engine 1.x
# fp8_cast_transpose_fused; the transposed copy feeds the weight gradient): the input in forward
# and the output gradient in backward, each read 2 + write 1 + 1 = 4 bytes per element. A linear
# opened by its norm (TE LayerNormLinear: qkv, the dense fc1) gets its input in fp8 from the norm
# kernel (1 byte written where the fused minimum counts 2) and transposes it (1 + 1): 1 byte more.
# Weight casts run once per step (cached over microbatches) and are left out.
FP8_CAST_BYTES = 4.0
FP8_NORM_FED_CAST_BYTES = 1.0
# torchao's float8 linears (torchtitan) scale dynamically: each cast is an amax reduction and a
# cast, the weight's on every call too (no cache across microbatches). Bytes per element of the
# input x (m × k), the weight W (n × k) and the output gradient dy (m × n), (forward, backward),
# from torchao's own roofline model of its kernels:
# - "torchao_tensorwise": torchao/float8/roofline_utils.py at eab345c (Dec 2024, torchtitan 9dec370's
#   default dynamic tensorwise scaling), get_float8_mem_sympy with the torch.compile limitation it
#   models (pytorch#130015, one more fp8 read): x and dy have their amax fused into their producer
#   and are cast once into both layouts (read 2, write 1 + 1, read 1 more: 5); W's amax is its own
#   pass (2 + 5 = 7); all saved in fp8, nothing re-cast in backward.
# - "torchao_rowwise": torchao/testing/training/roofline_utils.py at v0.18.0 (torchtitan 0.3's only
#   recipe), get_tensor_memory_traffic_ovhd_s without fusion modelling (float8_roofline.py's
#   default): x cast and copied to the other layout in forward (2 + 1 + 2), cast along it in
#   backward (2 + 1); W cast in forward (2 + 1), transposed (2 + 2) and cast (2 + 1) in backward;
#   dy the same as x, both in backward. Its GEMMs (rowwise-scaled, CUTLASS on Hopper) are priced at
#   the same fp8 gain as tensorwise ones.
_FP8_CAST_BYTES_PER_ROLE = {  # recipe -> ((x fwd, x bwd), (W fwd, W bwd), (dy fwd, dy bwd))
    "torchao_tensorwise": ((5.0, 0.0), (7.0, 0.0), (0.0, 5.0)),
    "torchao_rowwise": ((5.0, 3.0), (3.0, 7.0), (0.0, 8.0)),
}
# Kernels per linear (forward, backward): TE one fused cast-transpose each way; torchao's roofline
# lists three per tensorwise cast (amax stages 1 and 2, the cast) and one or two per rowwise one.
_CAST_KERNELS = {"te": (1, 1), "torchao_tensorwise": (6, 3), "torchao_rowwise": (2, 5)}
FP8_CAST_RECIPES = tuple(_CAST_KERNELS)
# Parallel blocks per layer, each an all-gather + reduce-scatter (sp) or an all-reduce: attention
# and MLP in a dense layer; attention only in an MoE layer (the routed experts talk over EP), plus
# its shared experts (_tp_blocks); the vocab-parallel head; the embedding's reduction counts as
# half a block (no all-gather).
_TP_BLOCKS = {"dense": 2, "moe": 1, "mtp": 3, "head": 1, "embedding": 0.5}


class Split(NamedTuple):
    """The degrees and per-microbatch sizes a layer's cost depends on. A NamedTuple, not a frozen
    dataclass: a search builds and hashes ~10^4 of them (the dataclass's field-by-field __init__
    and __hash__ cost ~5 µs and ~1.5 µs each; a tuple's, a tenth)."""

    tp: int
    sp: bool
    cp: int
    ep: int
    etp: int
    tokens: float  # tokens of one microbatch on one rank: mbs · seq / cp
    seq_len: int
    hidden: int
    peak_flops: float
    moe_load: float = 1.0  # busiest expert rank's tokens over the mean
    cp_comm_type: str = "p2p"
    moe_dispatcher: str = "alltoall"
    attn_peak_flops: float = 0.0  # bf16 peak: attention never runs in fp8 (0 = peak_flops)
    attention_kernel: str = "fa2"  # flash kernel family the framework launches on this GPU
    cp_ring: str = "te"  # CP attention implementation (autopar.frameworks): "te" | "torch"
    cp_repeats_kv_heads: bool = False  # CP moves K/V repeated to the query heads
    cp_comm_overlapped: bool = True  # torch ring: transfers hidden behind SDPA steps (False: waited where issued)
    tp_backward_overlap: bool = False  # sp backward: input re-gather and dgrad reduce-scatter behind GEMMs
    eager: bool = False  # elementwise ops run op by op (torchtitan without torch.compile): Layer.eager_bytes_*
    sequential_experts: bool = False  # Megatron SequentialMLP (no grouped GEMM): expert linears launched one by one
    fp8_casts: str = "te"  # how fp8 linears cast their operands (FP8_CAST_RECIPES)
    moe_padded: bool = False  # experts' inputs padded to capacity: equal splits, no token-count gather
    shared_expert_overlap: bool = False  # shared experts run beside the dispatch (Megatron --moe-shared-expert-overlap)
    loss_fwd_bytes: float = 10.0  # HBM bytes per logit of the loss, forward (FrameworkProfile.loss_bytes_per_logit)
    loss_bwd_bytes: float = 20.0  # and backward
    unfused_attention: bool = False  # Transformer Engine's UnfusedDotProductAttention (attention_backend "unfused")


class Spans(NamedTuple):
    """The process groups a layer's tp / cp / ep / etp communication runs on."""

    tp: comm.GroupSpan
    cp: comm.GroupSpan
    ep: comm.GroupSpan
    etp: comm.GroupSpan


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Seconds for one microbatch. *_comm_* are the exposed parts."""

    fwd_compute_s: float
    bwd_compute_s: float
    tp_comm_fwd_s: float
    tp_comm_bwd_s: float
    cp_comm_fwd_s: float
    cp_comm_bwd_s: float
    ep_comm_fwd_s: float
    ep_comm_bwd_s: float
    module_recompute_s: tuple[tuple[str, float], ...]  # selective: module -> forward time redone

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + self.tp_comm_fwd_s + self.cp_comm_fwd_s + self.ep_comm_fwd_s

    @property
    def bwd_s(self) -> float:
        return self.bwd_compute_s + self.tp_comm_bwd_s + self.cp_comm_bwd_s + self.ep_comm_bwd_s

    def recompute_s(self, mode: RecomputeMode, modules: tuple[str, ...], policy: str = "modules") -> float:
        """Forward time redone in backward. selective: the listed Megatron modules, under the
        "op_sac" policy (torchtitan) the per-op policy's recomputed ops, under "kept" (DeepSpeed's
        Hugging Face models) nothing."""
        if mode == RecomputeMode.FULL:
            return self.fwd_s
        if mode == RecomputeMode.SELECTIVE and policy == "kept":  # nothing recomputed (memory.saved_activation_bytes)
            return 0.0
        if mode == RecomputeMode.SELECTIVE and policy == OP_SAC:
            return dict(self.module_recompute_s).get(OP_SAC, 0.0)
        if mode == RecomputeMode.SELECTIVE:
            return sum(t for m, t in self.module_recompute_s if m in modules)
        return 0.0


_ID_TO_GEMM_ROWS: dict[int, tuple[Layer, tuple]] = {}


def _gemm_rows(layer: Layer) -> tuple[tuple[str, int, int, float, int, str, bool, bool], ...]:
    """(split, n, k, tokens_per_token, num_experts, recompute module, runs in fp8 under an fp8 plan,
    fed by its norm) of each of the layer's GEMMs, what _compute reads of them, kept per layer
    object (a search prices each layer ~10^3 times)."""
    hit = _ID_TO_GEMM_ROWS.get(id(layer))
    if hit is None or hit[0] is not layer:
        rows = tuple(((("expert_col" if g.split == "expert_col" else "expert_row") if g.is_expert else
                       g.split if g.split in ("none", "row") else "col"), g.n, g.k, g.tokens_per_token,
                      g.num_experts, _gemm_module(g.name), g.split != "vocab" and g.name not in BF16_ONLY_GEMMS,
                      g.name in NORM_FED_GEMMS) for g in layer.gemms)
        if len(_ID_TO_GEMM_ROWS) > 4096:  # layers of graphs no longer used
            _ID_TO_GEMM_ROWS.clear()
        hit = _ID_TO_GEMM_ROWS[id(layer)] = (layer, rows)
    return hit[1]


@lru_cache(maxsize=None)
def _gemm_module(name: str) -> str:
    """The recompute module a GEMM belongs to, by its name's prefix ("" for attention's own);
    cached: a search asks for the same few names ~10^4 times."""
    return next((mod for prefix, mod in _GEMM_MODULE.items() if name.startswith(prefix)), "")


def gemm_pass_times_s(m: float, n: float, k: float, count: float, operand_bytes: float, peak_flops: float,
                      hbm_bytes_per_s: float, p: CostParams) -> tuple[float, float]:
    """(forward, dgrad + wgrad) seconds of `count` GEMMs of shape (m, n, k), each pass at the
    roofline of its own HBM bytes (compute.gemm_pass_bytes) and at the efficiency of its own shape
    (output × inner dim): forward (m × n, k), dgrad dx = dy·Wᵀ (m × k, n), wgrad dW = xᵀ·dy (k × n, m)."""
    fwd_b, dgrad_b, wgrad_b = gemm_pass_bytes(m, n, k, operand_bytes)
    fp8 = operand_bytes < BF16_BYTES
    return (gemm_time_s(m, n, k, peak_flops, p, count, fwd_b, hbm_bytes_per_s, fp8),
            gemm_time_s(m, k, n, peak_flops, p, count, dgrad_b, hbm_bytes_per_s, fp8)
            + gemm_time_s(k, n, m, peak_flops, p, count, wgrad_b, hbm_bytes_per_s, fp8))


def fp8_cast_bytes(m: float, n: float, k: float, norm_fed: bool, recipe: str = "te") -> tuple[float, float]:
    """(forward, backward) HBM bytes of one fp8 linear's operand casts for one microbatch: input x
    (m × k), weight W (n × k), output gradient dy (m × n), by the framework's cast recipe
    (FP8_CAST_RECIPES; the constants above say where each count comes from)."""
    x, w, dy = m * k, n * k, m * n
    if recipe == "te":
        return x * (FP8_NORM_FED_CAST_BYTES if norm_fed else FP8_CAST_BYTES), dy * FP8_CAST_BYTES
    if recipe not in _FP8_CAST_BYTES_PER_ROLE:
        raise ValueError(f"unknown fp8 cast recipe {recipe!r}; choose from {', '.join(FP8_CAST_RECIPES)}")
    (x_f, x_b), (w_f, w_b), (dy_f, dy_b) = _FP8_CAST_BYTES_PER_ROLE[recipe]
    return x_f * x + w_f * w + dy_f * dy, x_b * x + w_b * w + dy_b * dy


def fp8_cast_s(m: float, n: float, k: float, count: float, norm_fed: bool, hbm_bytes_per_s: float,
               p: CostParams, recipe: str = "te") -> tuple[float, float]:
    """(forward, backward) seconds of `count` fp8 GEMMs' operand casts (fp8_cast_bytes) at the
    achieved HBM bandwidth."""
    fwd_bytes, bwd_bytes = fp8_cast_bytes(m, n, k, norm_fed, recipe)
    fwd_kernels, bwd_kernels = _CAST_KERNELS[recipe]
    return (count * memory_bound_time_s(fwd_bytes, hbm_bytes_per_s, p, kernels=fwd_kernels),
            count * memory_bound_time_s(bwd_bytes, hbm_bytes_per_s, p, kernels=bwd_kernels))


def _gemm_operand_bytes(s: Split) -> float:
    """Bytes per GEMM operand element: 1 for fp8 GEMMs (their peak above attention's bf16 one), else 2."""
    return 1.0 if s.attn_peak_flops and s.peak_flops > s.attn_peak_flops else float(BF16_BYTES)


def _compute(layer: Layer, s: Split, cluster: Cluster, p: CostParams,
             gemm_memo: dict | None = None) -> tuple[float, float, dict[str, float]]:
    """Forward and backward compute seconds, and forward seconds by recompute module. `gemm_memo`:
    a dict kept by the caller for one (cluster, p), holding gemm_pass_times_s by its arguments
    (a search prices the same attention GEMMs under many expert layouts)."""
    module_s: dict[str, float] = {}
    gemm_fwd = gemm_bwd = 0.0
    for row in _gemm_rows(layer):
        t, t_bwd = _gemm_row_s(row, s, cluster, p, gemm_memo)
        gemm_fwd += t
        gemm_bwd += t_bwd
        mod = row[5]
        if mod:
            module_s[mod] = module_s.get(mod, 0.0) + t
    if gemm_memo is None or not layer.num_experts:
        attn_fwd, attn_bwd, scores_s, ew_fwd, norm_s, act_s = _attention_and_elementwise_s(layer, s, cluster, p)
    else:  # an MoE layer's: the same under every expert layout (expert_blind), kept in the caller's memo
        key = ("attention", id(layer), expert_blind_split(s))
        hit = gemm_memo.get(key)
        if hit is None or hit[0] is not layer:
            hit = gemm_memo[key] = (layer, _attention_and_elementwise_s(layer, s, cluster, p))
        attn_fwd, attn_bwd, scores_s, ew_fwd, norm_s, act_s = hit[1]
    module_s["layernorm"] = norm_s
    for mod in ("mlp", "moe", "moe_act"):
        if layer.kind in ("moe", "mtp") and mod != "mlp" or layer.kind == "dense" and mod == "mlp":
            module_s[mod] = module_s.get(mod, 0.0) + act_s
    module_s["core_attn"] = attn_fwd + scores_s
    # torchtitan's per-op SAC recomputes every second matmul and all elementwise ops (norms,
    # activation, rope), and keeps the SDPA output (autopar.frameworks).
    module_s[OP_SAC] = 0.5 * gemm_fwd + ew_fwd
    permute = moe_permute_s(layer, s, cluster, p) + moe_sort_chunks_s(layer, s, cluster, p)
    module_s["moe"] = module_s.get("moe", 0.0) + permute if layer.num_experts else module_s.get("moe", 0.0)
    scan_fwd, scan_bwd = recurrent_scan_s(layer, s, p, cluster.hbm_bytes_per_s)
    loss_fwd, loss_bwd = loss_s(layer, s, cluster, p)
    fwd = gemm_fwd + attn_fwd + scores_s + ew_fwd + permute + scan_fwd + loss_fwd
    bwd = gemm_bwd + attn_bwd + 2.0 * (ew_fwd + scores_s) + permute + scan_bwd + loss_bwd
    if layer.kind in ("dense", "moe", "mtp"):  # launch-bound floor: the GPU waits for the CPU
        fwd, bwd = max(fwd, p.layer_launch_floor_s), max(bwd, 2.0 * p.layer_launch_floor_s)
    return fwd, bwd, module_s


def _gemm_row_s(row: tuple, s: Split, cluster: Cluster, p: CostParams, gemm_memo: dict | None) -> tuple[float, float]:
    """(forward, backward) seconds of one of _gemm_rows's GEMMs on one rank, its fp8 casts included.
    (m, n, k, count): routed experts see the busiest rank's tokens over its local experts,
    ETP-split; replicated GEMMs see T/tp tokens under sp; row/col split k/n by tp."""
    split, gn, gk, per_token, experts, _, fp8_ok, norm_fed = row
    tokens, tp, etp = s.tokens, s.tp, s.etp
    sp_tokens = tokens / (tp if s.sp else 1)
    bf16_peak = s.attn_peak_flops or s.peak_flops
    peak, width = (s.peak_flops, _gemm_operand_bytes(s)) if fp8_ok else (bf16_peak, float(BF16_BYTES))
    if split == "expert_col" or split == "expert_row":
        count = max(experts // s.ep, 1)
        m = sp_tokens * per_token * s.moe_load * etp / count
        n, k = (gn / etp, gk) if split == "expert_col" else (gn, gk / etp)
    elif split == "none":
        m, n, k, count = sp_tokens, gn, gk, 1
    elif split == "row":
        m, n, k, count = tokens, gn, gk / tp, 1
    else:  # col, vocab
        m, n, k, count = tokens, gn / tp, gk, 1
    hbm = cluster.hbm_bytes_per_s
    if gemm_memo is None:
        t, t_bwd = gemm_pass_times_s(m, n, k, count, width, peak, hbm, p)
    else:
        key = (m, n, k, count, width, peak)
        hit = gemm_memo.get(key)
        if hit is None:
            hit = gemm_memo[key] = gemm_pass_times_s(m, n, k, count, width, peak, hbm, p)
        t, t_bwd = hit
    if fp8_ok and width < BF16_BYTES:
        t_cast, t_bwd_cast = fp8_cast_s(m, n, k, count, norm_fed, hbm, p, s.fp8_casts)
        t, t_bwd = t + t_cast, t_bwd + t_bwd_cast
    return t, t_bwd


def shared_expert_overlap_s(layer: Layer, s: Split, cluster: Cluster, p: CostParams, ep_s: float,
                            gemm_memo: dict | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of an MoE layer's expert-parallel dispatch hidden behind its shared
    experts under Megatron's --moe-shared-expert-overlap (moe_layer.py / shared_experts.py, MCore
    0.12+): the shared expert's fc1 runs on a side stream during the dispatch all-to-all and its fc2
    during the combine, and the backward is ordered so their gradients overlap the backward
    all-to-alls; each direction hides at most the shared experts' GEMM time (their TP collectives
    and the streams' contention for SMs are not counted). 0 without shared experts or the switch."""
    if not s.shared_expert_overlap or not layer.num_experts or ep_s <= 0:
        return 0.0, 0.0
    fwd = bwd = 0.0
    for row in _gemm_rows(layer):
        if row[5] == "shared_experts":
            t, t_bwd = _gemm_row_s(row, s, cluster, p, gemm_memo)
            fwd, bwd = fwd + t, bwd + t_bwd
    return min(fwd, ep_s), min(bwd, ep_s)


def _attention_and_elementwise_s(layer: Layer, s: Split, cluster: Cluster, p: CostParams
                                 ) -> tuple[float, float, float, float, float, float]:
    """(attention forward, attention backward, unfused scores, elementwise forward, its norms'
    share, its activation's share) seconds of one layer: no expert-parallel field enters."""
    attn_flops = layer.attention_flops_per_token(s.seq_len, causal=True) * s.tokens / s.tp
    te_unfused = te_unfused_attention(layer, s)
    unfused = layer.elementwise_bytes_per_token_per_seq_tp > 0 or te_unfused
    # Under context parallelism each ring step runs one kernel on a seq/cp chunk of queries
    # against a seq/cp chunk of keys: efficiency follows the chunk, and there are cp launches.
    attn_peak = s.attn_peak_flops or s.peak_flops
    fwd_rate, bwd_rate = p.attention_rate(s.attention_kernel)
    attn_fwd = attention_time_s(attn_flops, s.seq_len / s.cp, attn_peak, p, unfused, fwd_rate)
    attn_fwd += (s.cp - 1) * p.kernel_overhead_s if attn_flops > 0 else 0.0
    attn_bwd = p.attention_backward_ratio * attention_time_s(attn_flops, s.seq_len / s.cp, attn_peak, p, unfused,
                                                             bwd_rate)
    merge_fwd, merge_bwd = torch_ring_merge_s(layer, s, cluster, p)
    attn_fwd, attn_bwd = attn_fwd + merge_fwd, attn_bwd + merge_bwd
    ew_sp, ew_tp = layer.elementwise_bytes_per_token_sp, layer.elementwise_bytes_per_token_tp
    if s.eager:
        ew_sp, ew_tp = ew_sp + layer.eager_bytes_per_token_sp, ew_tp + layer.eager_bytes_per_token_tp
    ew_bytes_sp = ew_sp * s.tokens / (s.tp if s.sp else 1)
    ew_bytes_tp = ew_tp * s.tokens / s.tp
    scores_bytes = layer.elementwise_bytes_per_token_per_seq_tp * layer.attended_keys(s.seq_len) * s.tokens / s.tp
    if te_unfused:
        scores_bytes += te_unfused_scores_bytes(layer, s.seq_len, s.tokens, s.tp)
    scores_s = memory_bound_time_s(scores_bytes, cluster.hbm_bytes_per_s, p)
    ew_fwd = memory_bound_time_s(ew_bytes_sp + ew_bytes_tp, cluster.hbm_bytes_per_s, p)
    norm_s = ew_fwd * _NORM_SHARE_OF_SP_BYTES * ew_bytes_sp / max(ew_bytes_sp + ew_bytes_tp, 1.0)
    act_s = ew_fwd * ew_bytes_tp / max(ew_bytes_sp + ew_bytes_tp, 1.0)
    return attn_fwd, attn_bwd, scores_s, ew_fwd, norm_s, act_s


def te_unfused_attention(layer: Layer, s: Split) -> bool:
    """Whether `layer`'s attention runs Transformer Engine's unfused path: the plan asks for it and the
    layer is softmax attention whose graph does not already price unfused scores (a dropout model's)."""
    return s.unfused_attention and layer.fused_priced_attention


def te_unfused_scores_bytes(layer: Layer, seq_len: int, tokens: float, tp: int) -> float:
    """Forward HBM bytes of the unfused attention's scores on one rank: TE_UNFUSED_BYTES_PER_SCORE for
    each of the scored keys (Layer.scored_keys: the full row, masked or not) of each of its query
    heads (num_heads / tp) for `tokens` queries."""
    return TE_UNFUSED_BYTES_PER_SCORE * layer.num_heads * layer.scored_keys(seq_len) * tokens / tp


def loss_s(layer: Layer, s: Split, cluster: Cluster, p: CostParams) -> tuple[float, float]:
    """(forward, backward) seconds of the loss over one rank's logits (tokens × vocabulary / tp): each
    logit moves the framework's loss bytes (FrameworkProfile.loss_bytes_per_logit: the fp32 cast,
    softmax passes and gradient as its code runs them) at the achieved HBM bandwidth."""
    if not layer.loss_logits_per_token_tp:
        return 0.0, 0.0
    logits = layer.loss_logits_per_token_tp * s.tokens / s.tp
    return (memory_bound_time_s(logits * s.loss_fwd_bytes, cluster.hbm_bytes_per_s, p),
            memory_bound_time_s(logits * s.loss_bwd_bytes, cluster.hbm_bytes_per_s, p))


def recurrent_scan_s(layer: Layer, s: Split, p: CostParams, hbm_bytes_per_s: float = 0.0) -> tuple[float, float]:
    """Forward and backward seconds of a recurrent mixer's conv and chunked scan (Mamba-2's SSD,
    the delta rule of Gated DeltaNet and KDA: autopar.model.mixers), on the rank's tokens and its
    tp share of the heads (under Mamba's CP all-to-all a rank holds all tokens of heads/cp: the
    same FLOPs). The chunked forms are batched matmuls over chunk-sized blocks, priced at the rate
    the cost model's kernel table gives the scan's own kernel family (`ssd`: mamba_ssm's Triton
    kernels, measured) or else at the attention kernels' efficiency, over the rank's sequence;
    backward at the attention backward ratio (the kernels recompute the chunk states in backward,
    as flash attention recomputes its scores). Each pass takes at least its HBM traffic
    (Layer.scan_bytes_*: the fp32 chunk states) at `hbm_bytes_per_s` × hbm_efficiency. Ignores the
    chunk-to-chunk recurrence's serial launches."""
    if not layer.scan_flops_per_token:
        return 0.0, 0.0
    flops = layer.scan_flops_per_token * s.tokens / s.tp
    peak = s.attn_peak_flops or s.peak_flops
    own = p.kernel_rate(layer.scan_kernel) if layer.scan_kernel else None
    fwd_rate, bwd_rate = own or p.attention_rate(s.attention_kernel)
    fwd = attention_time_s(flops, s.seq_len / s.cp, peak, p, False, fwd_rate)
    bwd = p.attention_backward_ratio * attention_time_s(flops, s.seq_len / s.cp, peak, p, False, bwd_rate)
    if hbm_bytes_per_s > 0 and layer.scan_bytes_fwd_per_token:
        bw = hbm_bytes_per_s * p.hbm_efficiency
        fwd = max(fwd, layer.scan_bytes_fwd_per_token * s.tokens / s.tp / bw)
        bwd = max(bwd, layer.scan_bytes_bwd_per_token * s.tokens / s.tp / bw)
    return fwd, bwd


def mamba_cp_all_to_all_s(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams) -> float:
    """Megatron's Mamba context parallelism, one pass (megatron/core/ssm/mamba_context_parallel.py):
    z, x, B, C and dt all-to-all'd from the sequence split to a head split before the conv and the
    scan, and y back after it (Layer.cp_a2a_bytes_per_token, tp-split), not overlapped; backward
    moves the gradients the same way. 0 for any other layer or at cp 1."""
    if s.cp == 1 or not layer.cp_a2a_bytes_per_token:
        return 0.0
    return comm.all_to_all_s(layer.cp_a2a_bytes_per_token * s.tokens / s.tp, spans.cp, cluster, p)


def moe_permute_s(layer: Layer, s: Split, cluster: Cluster, p: CostParams) -> float:
    """Token permutation of one MoE layer's forward (the backward moves the same bytes): the
    dispatcher gathers each rank's T·k routed token copies into expert order before the
    all-to-all and scatters them back after it (Megatron-Core moe_utils permute/unpermute): read
    and write of T·k·h bf16 values, twice, at HBM bandwidth; the busiest rank's load applies to
    the unpermute side. Ignores the router's host synchronisation of token counts."""
    if not layer.num_experts or s.moe_dispatcher == "flex":  # DeepEP reads the tokens straight into its buffers
        return 0.0
    routed = s.tokens / (s.tp if s.sp else 1) * layer.top_k * s.hidden * BF16_BYTES
    return memory_bound_time_s(2.0 * routed * (1.0 + s.moe_load), cluster.hbm_bytes_per_s, p, kernels=2)


def moe_sort_chunks_s(layer: Layer, s: Split, cluster: Cluster, p: CostParams) -> float:
    """Megatron alltoall dispatcher's second permutation (megatron/core/transformer/moe/
    token_dispatcher.py, sort_chunks_by_idxs, MCore 0.9 onwards, e.g. commit f1f03922): with more
    than one local expert, the tokens a rank holds after the all-to-all and the ETP all-gather
    (T/tp·k·etp routed copies, the busiest rank's load) are split into tp·ep·local chunks and
    concatenated in expert order; the expert output is restored the same way. Two copies (read +
    write) of that tensor per pass; backward copies the gradients back (split's backward is a cat).
    torchtitan 0.3's all-to-all dispatcher does the same two copies (torchtitan/models/common/
    token_dispatcher.py `_permute` / `_unpermute`: rank-major to expert-major and back, etp 1).
    Ignores the CPU time of splitting into tp·ep·local views.
    The flex dispatcher (DeepEP) receives each token once per GPU, rank-major, and permutes it into
    one copy per local expert (get_permuted_hidden_states_by_experts) and back before the combine,
    whatever the local expert count: the same two copies of the same tensor."""
    if not layer.num_experts or s.moe_dispatcher == "allgather":
        return 0.0
    if s.moe_dispatcher == "alltoall" and layer.num_experts // s.ep <= 1:
        return 0.0
    gathered = s.tokens / (s.tp if s.sp else 1) * layer.top_k * s.etp * s.moe_load * s.hidden * BF16_BYTES
    return memory_bound_time_s(2.0 * 2.0 * gathered, cluster.hbm_bytes_per_s, p, kernels=2)


def _tp_comm(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams, tp_overlap: bool) -> float:
    """Exposed forward TP communication: with sp an all-gather before and a reduce-scatter after each
    parallel block (Korthikanti et al. 2022 §4.2.2), without sp an all-reduce after each."""
    if s.tp == 1:
        return 0.0
    full_bytes = s.tokens * s.hidden * BF16_BYTES
    blocks = _tp_blocks(layer)
    if s.sp:
        t = blocks * (comm.all_gather_s(full_bytes, spans.tp, cluster, p) +
                      comm.reduce_scatter_s(full_bytes, spans.tp, cluster, p))
    else:
        t = blocks * comm.all_reduce_s(full_bytes, spans.tp, cluster, p)
    return t * (1.0 - p.tp_overlap) if tp_overlap else t


def _tp_comm_bwd(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams, tp_overlap: bool,
                 fwd_s: float, gemm_memo: dict | None = None) -> float:
    """Exposed backward TP communication. As the forward's (`fwd_s`) unless the framework overlaps
    the sequence-parallel backward (Split.tp_backward_overlap: Megatron's
    LinearWithGradAccumulationAndAsyncCommunication and Transformer Engine's Linear, without TP
    userbuffer overlap): then each block's output reduce-scatter turns into an exposed all-gather
    of its gradient, and the column-parallel linear that opens the block re-gathers its input
    asynchronously behind its dgrad GEMM and reduce-scatters the input gradient behind its wgrad
    GEMM (megatron/core/tensor_parallel/layers.py, backward: all-gather with async_op, dgrad,
    wait; reduce-scatter with async_op, wgrad, wait), so only what outlasts the GEMM is exposed.
    Decoder layers only, and only blocks opened by a column-parallel GEMM of the layer input (qkv,
    fc1, the shared experts' fc1); an MLA attention gathers its latents instead and keeps the
    forward's charge."""
    if (s.tp == 1 or tp_overlap or not s.sp or not s.tp_backward_overlap
            or layer.kind not in ("dense", "moe")):
        return fwd_s
    full_bytes = s.tokens * s.hidden * BF16_BYTES
    ag = comm.all_gather_s(full_bytes, spans.tp, cluster, p)
    rs = comm.reduce_scatter_s(full_bytes, spans.tp, cluster, p)
    blocks = _tp_blocks(layer)
    t = blocks * ag
    opened = 0
    operand_bytes = _gemm_operand_bytes(s)
    for split, gn, gk, *_ in _gemm_rows(layer):
        if split != "col" or gk != s.hidden or opened >= blocks:
            continue
        m, n, k = s.tokens, gn / s.tp, gk
        key = ("dgrad_wgrad", m, n, k, operand_bytes, s.peak_flops)
        hit = gemm_memo.get(key) if gemm_memo is not None else None
        if hit is None:
            _, dgrad_b, wgrad_b = gemm_pass_bytes(m, n, k, operand_bytes)
            fp8 = operand_bytes < BF16_BYTES
            hit = (gemm_time_s(m, k, n, s.peak_flops, p, 1.0, dgrad_b, cluster.hbm_bytes_per_s, fp8),
                   gemm_time_s(k, n, m, s.peak_flops, p, 1.0, wgrad_b, cluster.hbm_bytes_per_s, fp8))
            if gemm_memo is not None:
                gemm_memo[key] = hit
        dgrad_s, wgrad_s = hit
        t += max(0.0, ag - dgrad_s) + max(0.0, rs - wgrad_s)
        opened += 1
    return t + (blocks - opened) * (ag + rs)


_ID_TO_TP_BLOCKS: dict[int, tuple[Layer, float]] = {}


def _tp_blocks(layer: Layer) -> float:
    """The layer's TP-parallel blocks (_TP_BLOCKS). An MTP module's MLP is its MoE when it has
    experts (the experts talk over EP). The shared experts of an MoE layer are one more block:
    Megatron-Core's SharedExpertMLP is a column- then row-parallel MLP on the layer's own tokens,
    all-gathered over TP before it and reduce-scattered after it under sequence parallelism
    (megatron/core/transformer/moe/shared_experts.py; MoELayer adds its output to the routed
    experts' unless --moe-shared-expert-overlap runs it inside the dispatcher). Kept per layer
    object."""
    hit = _ID_TO_TP_BLOCKS.get(id(layer))
    if hit is None or hit[0] is not layer:
        blocks = _TP_BLOCKS[layer.kind] - (1 if layer.kind == "mtp" and layer.num_experts else 0)
        if layer.tp_blocks:  # a hybrid model's decoder layer: its own mixer and MLP blocks (model.build)
            blocks = layer.tp_blocks
        if layer.num_experts and any(g.name.startswith("shared_") and g.split in ("col", "row") for g in layer.gemms):
            blocks += 1
        if len(_ID_TO_TP_BLOCKS) > 4096:  # layers of graphs no longer used
            _ID_TO_TP_BLOCKS.clear()
        hit = _ID_TO_TP_BLOCKS[id(layer)] = (layer, blocks)
    return hit[1]


def cp_kv_bytes(layer: Layer, s: Split) -> float:
    """bf16 K and V of one rank's tokens that context parallelism moves: with the K/V heads, or with
    the query heads when the framework repeats K/V before attention (torchtitan's repeat_kv)."""
    heads = layer.num_heads if s.cp_repeats_kv_heads else layer.num_kv_heads
    return s.tokens * heads * (layer.head_dim_qk + layer.head_dim_v) * BF16_BYTES / s.tp


def torch_ring_merge_bytes(layer: Layer, s: Split) -> tuple[float, float]:
    """HBM bytes (forward, backward) that PyTorch's ring attention moves besides its SDPA kernels, per
    rank and layer (torch/distributed/tensor/experimental/_attention.py at torch 1963fc8, Dec 2024),
    counted at the fused minimum torch.compile leaves (torchtitan compiles each block, fullgraph):
    forward: step 0 casts its output to fp32 (read 1, write 2 bf16-sizes O), each later step reads
      its bf16 output and reads and writes the fp32 running output (_SDPAMerger: 5·O), the result is
      cast back (3·O); K and V are concatenated once for the all-gather (2·KV): (5·cp + 1)·O + 2·KV;
    backward: the fp32 dq and dK/dV accumulators likewise (step 0 cast, 5 per later step, final cast)
      over Q + KV, plus the K/V concatenation: (5·cp + 1)·(Q + KV) + 2·KV.
    Ignores the LSE (head_dim times smaller) and the unfused eager case (about 3× the traffic)."""
    if s.cp == 1 or s.cp_ring != "torch" or not layer.num_heads:
        return 0.0, 0.0
    out = s.tokens * layer.num_heads * layer.head_dim_v * BF16_BYTES / s.tp
    q = s.tokens * layer.num_heads * layer.head_dim_qk * BF16_BYTES / s.tp
    kv = cp_kv_bytes(layer, s)
    return (5 * s.cp + 1) * out + 2 * kv, (5 * s.cp + 1) * (q + kv) + 2 * kv


def torch_ring_merge_s(layer: Layer, s: Split, cluster: Cluster, p: CostParams) -> tuple[float, float]:
    """(forward, backward) seconds of torch_ring_merge_bytes at the achieved HBM bandwidth, one fused
    kernel per ring step (two in backward: dq, and dK/dV into the send buffer)."""
    fwd_bytes, bwd_bytes = torch_ring_merge_bytes(layer, s)
    if not fwd_bytes:
        return 0.0, 0.0
    return (memory_bound_time_s(fwd_bytes, cluster.hbm_bytes_per_s, p, kernels=s.cp + 1),
            memory_bound_time_s(bwd_bytes, cluster.hbm_bytes_per_s, p, kernels=2 * s.cp + 1))


def torch_ring_comm_s(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams,
                      attn_fwd_s: float, attn_bwd_s: float) -> tuple[float, float]:
    """Exposed (forward, backward) CP communication of PyTorch's ring attention (torch 1963fc8
    _templated_ring_attention and its backward; cp equal steps under the round-robin load balancer):
    allgather rotate method (torchtitan's default): one all-gather of every rank's K/V, issued before
      the first SDPA step and waited before the second, so it hides behind one step; the backward
      gathers K/V again the same way;
    alltoall rotate method (cp_comm_type p2p): cp − 1 sends of K/V to the next rank, each behind a step;
    backward, both methods: after every step the running fp32 dK/dV (2·KV bytes) goes to the next
      rank (_AllToAllRotater), hidden behind the next step, and the last one is waited for right
      after the loop, fully exposed. A hidden transfer still exposes (1 − cp_overlap) of itself.
    Compiled (torchtitan), every transfer is waited on where it is issued and hides behind nothing
    (s.cp_comm_overlapped False; autopar.frameworks)."""
    kv = cp_kv_bytes(layer, s)
    step_fwd, step_bwd = attn_fwd_s / s.cp, attn_bwd_s / s.cp

    def behind(t: float, window: float) -> float:
        if not s.cp_comm_overlapped:
            return t
        return max(t * (1.0 - p.cp_overlap), t - window)

    if s.cp_comm_type == "allgather":
        gather = comm.all_gather_s(kv * s.cp, spans.cp, cluster, p)
        fwd, kv_bwd = behind(gather, step_fwd), behind(gather, step_bwd)
    else:
        send = comm.send_recv_s(kv, spans.cp.crosses_nodes, cluster, p)
        fwd, kv_bwd = (s.cp - 1) * behind(send, step_fwd), (s.cp - 1) * behind(send, step_bwd)
    dkv = comm.send_recv_s(2.0 * kv, spans.cp.crosses_nodes, cluster, p)
    return fwd, kv_bwd + (s.cp - 1) * behind(dkv, step_bwd) + dkv


def _cp_comm(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams, attn_fwd_s: float) -> float:
    """Exposed forward context-parallel communication of one layer, by Megatron --cp-comm-type:
    p2p: cp − 1 ring sends of the local K and V, overlapped with attention (Liu et al. 2023, Ring
      Attention; causal load balancing with 2·cp chunks keeps the steps equal);
    a2a: four all-to-alls scattering heads and gathering sequence (q, k, v in, output back;
      Jacobs et al. 2023, DeepSpeed-Ulysses), not overlapped;
    allgather: an all-gather of K and V over the cp group before attention, not overlapped."""
    if s.cp == 1 or not layer.num_heads:
        return 0.0
    kv_bytes = cp_kv_bytes(layer, s)
    if s.cp_comm_type == "a2a":
        q_out_bytes = s.tokens * layer.num_heads * (layer.head_dim_qk + layer.head_dim_v) * BF16_BYTES / s.tp
        return comm.all_to_all_s(kv_bytes + q_out_bytes, spans.cp, cluster, p)
    if s.cp_comm_type == "allgather":
        return comm.all_gather_s(kv_bytes * s.cp, spans.cp, cluster, p)
    step = comm.send_recv_s(kv_bytes, spans.cp.crosses_nodes, cluster, p)
    total = (s.cp - 1) * step
    return max(total * (1.0 - p.cp_overlap), total - attn_fwd_s)


# Bytes per expert of the token counts the alltoall dispatcher gathers (torch.histc's fp32 output).
_COUNT_BYTES = 4


def moe_count_gather_s(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams) -> float:
    """Forward only: the alltoall dispatcher's preprocess all-gathers every rank's tokens-per-expert
    counts over the etp·ep group (token_dispatcher.py `_gather_along_first_dim_moe`, MCore 0.9+,
    e.g. commit f1f03922) to size the variable all-to-all; the host then synchronises on those
    counts (`torch.cuda.current_stream().synchronize()` before the all-to-all), so this tiny,
    latency-bound ring (etp·ep − 1 steps) cannot hide behind compute. torchtitan 0.3 exchanges the
    counts with an all-to-all over ep and syncs on `.tolist()` (token_dispatcher.py
    `_token_count_exchange`), priced here the same way. Ignores the host round trip after the sync:
    the all-to-all issued next is long enough for the host to get ahead again. Padded to capacity
    (Split.moe_padded) preprocess returns before the gather: every split is the capacity, known
    without asking the other ranks (drop_and_pad, core_r0.9.0 to core_r0.12.0). The flex dispatcher's
    DeepEP exchanges the same counts over the same group in its notify step and the host waits for the
    received count (deep_ep Buffer.dispatch without num_worst_tokens returns it as a host list,
    megatron/core/transformer/moe/fused_a2a.py): priced the same way."""
    if not layer.num_experts or s.moe_dispatcher == "allgather" or s.ep * s.etp <= 1 or s.moe_padded:
        return 0.0
    span = _etp_ep_span(spans)
    return comm.all_gather_s(layer.num_experts * _COUNT_BYTES * span.size, span, cluster, p)


def _etp_ep_span(spans: Spans) -> comm.GroupSpan:
    """The etp·ep group (Megatron's tensor-and-expert group): etp ranks fastest, then ep."""
    nodes = spans.ep.nodes * spans.etp.nodes
    size = spans.ep.size * spans.etp.size
    return comm.GroupSpan(size, max(1, size // nodes), nodes)


def _ep_comm(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams) -> float:
    """Forward token dispatch + combine of one MoE layer (the backward moves the same bytes;
    moe_count_gather_s is forward only). Megatron-Core token_dispatcher.py (MCore 0.9+, e.g.
    commit f1f03922):
    alltoall: two all-to-alls of the routed token copies over EP (the busiest rank receives
      `moe_load` × the mean), then with etp > 1 an all-gather of the received copies over ETP
      before the experts and a reduce-scatter after them, both of unequal parts (the ranks
      received different counts: output_split_sizes), which torch serves as coalesced
      broadcasts / reduces (comm.all_gather_v_s); padded to capacity (Split.moe_padded) every
      rank holds the same count, so they are plain all-gather / reduce-scatter (output_splits_tp
      None);
    allgather: one all-gather of every rank's tokens (not the top-k copies) over the etp·ep group
      before the experts select theirs, and one reduce-scatter of the outputs back;
    flex: DeepEP's dispatch and combine over the etp·ep group (deepep_transfer_s), no ETP collectives
      (the routing map is replicated over ETP: MoEFlexTokenDispatcher._initialize_metadata)."""
    if not layer.num_experts:
        return 0.0
    local_tokens = s.tokens / (s.tp if s.sp else 1)
    if s.moe_dispatcher == "flex":
        return 2.0 * deepep_transfer_s(layer, s, _etp_ep_span(spans), cluster, p)
    if s.moe_dispatcher == "allgather":
        span = _etp_ep_span(spans)
        gathered = local_tokens * s.hidden * BF16_BYTES * span.size
        return comm.all_gather_s(gathered, span, cluster, p) + comm.reduce_scatter_s(gathered, span, cluster, p)
    routed_bytes = local_tokens * layer.top_k * s.hidden * BF16_BYTES * s.moe_load
    t = 2.0 * comm.all_to_all_s(routed_bytes, spans.ep, cluster, p)
    if s.etp > 1 and s.moe_padded:  # equal counts: plain collectives
        t += comm.all_gather_s(routed_bytes * s.etp, spans.etp, cluster, p)
        t += comm.reduce_scatter_s(routed_bytes * s.etp, spans.etp, cluster, p)
    elif s.etp > 1:  # the ETP ranks hold unequal token counts: list-form collectives (comm.all_gather_v_s)
        t += comm.all_gather_v_s(routed_bytes * s.etp, spans.etp, cluster, p)
        t += comm.reduce_scatter_v_s(routed_bytes * s.etp, spans.etp, cluster, p)
    return t


def _miss(pool: float, unit: float, top_k: int) -> float:
    """Chance that none of top_k experts drawn without replacement from `pool` falls in `unit` of them."""
    out = 1.0
    for i in range(top_k):
        out *= max(pool - unit - i, 0.0) / (pool - i)
    return out


def expected_groups_hit(experts: int, top_k: int, units: int, router_groups: int = 0, router_group_topk: int = 0
                        ) -> float:
    """Expected number of distinct units (EP ranks or hosts: consecutive blocks of experts/units experts)
    that a token's top_k experts fall in, for a balanced router (Megatron's
    --moe-router-force-load-balancing draws random logits): a uniformly random k-subset of the experts,
    units · (1 − C(E − E/u, k) / C(E, k)). Under group-limited routing (router_groups consecutive groups,
    router_group_topk of them picked per token, then top_k experts among theirs; Megatron
    group_limited_topk, DeepSeek-V3 §2.1.2) the k experts come from the picked groups' pool: a unit
    holding c whole groups is missed when none of them is picked or none of the k falls in the picked
    ones (hypergeometric over the picks); a group holding several units is picked with probability
    group_topk/groups. Other layouts are priced without the group limit (its upper bound)."""
    if units <= 1:
        return float(units)
    g, gk = router_groups, router_group_topk
    if not g or not gk or gk >= g or not (g % units == 0 or units % g == 0):
        return units * (1.0 - _miss(experts, experts / units, top_k))
    per_group = experts / g
    pool = gk * per_group
    if units % g == 0:  # a group spans units/g units
        return units * (gk / g) * (1.0 - _miss(pool, experts / units, top_k))
    c = g // units  # groups per unit
    hit = 0.0
    for j in range(1, min(c, gk) + 1):  # j of the unit's groups picked: hypergeometric(g, c, gk)
        picks = math.comb(c, j) * math.comb(g - c, gk - j) / math.comb(g, gk)
        hit += picks * (1.0 - _miss(pool, j * per_group, top_k))
    return units * hit


def deepep_transfer_s(layer: Layer, s: Split, span: comm.GroupSpan, cluster: Cluster, p: CostParams) -> float:
    """One DeepEP normal-kernel dispatch (a combine moves the same bytes back) over the etp·ep group
    `span`, as Megatron's flex dispatcher calls it (deepseek-ai/DeepEP docs/legacy.md, "Normal kernels
    with NVLink and RDMA forwarding"): a token goes once over RDMA to each other host holding one of its
    experts, to the GPU of the same local index there, which forwards it over NVLink to each GPU of the
    host that needs it; inside one host it goes once to each GPU that needs it. A token needs the etp
    ranks of each EP rank holding one of its experts (expected_groups_hit over ep, times etp). Per GPU:
      RDMA bytes   = T·h·2·load · (hosts hit − own host),
      NVLink bytes = T·h·2·load · GPUs hit · (n − 1)/n   (n GPUs of the group per host; the hit GPU is
                     the sender itself 1/n of the time),
    both links busy at once, so the slower one sets the time. Unlike the alltoall dispatcher's copies
    per expert, nothing crosses a link twice for one GPU or host; group-limited routing (DeepSeek-V3's
    4 of 8 groups) caps the hosts a token reaches. Ignores fp8 dispatch (Megatron passes bf16 hidden
    states) and the combine's reduction arithmetic."""
    if span.size <= 1:
        return 0.0
    token_bytes = s.tokens / (s.tp if s.sp else 1) * s.hidden * BF16_BYTES * s.moe_load
    groups = (layer.router_groups, layer.router_group_topk)
    gpus_hit = s.etp * expected_groups_hit(layer.num_experts, layer.top_k, s.ep, *groups)
    n = span.ranks_per_node
    nvl_bytes = token_bytes * gpus_hit * (n - 1) / n
    intra_bw = cluster.intra_node_bytes_per_s * p.intra_node_efficiency * cluster.mesh_link_share(n)
    t = comm.transfer_s(nvl_bytes, nvl_bytes / max(n - 1, 1), intra_bw, p) if n > 1 else 0.0
    alpha = cluster.intra_node_latency_s
    if span.nodes > 1:
        hosts_hit = expected_groups_hit(layer.num_experts, layer.top_k, span.nodes, *groups)
        remote_hosts = hosts_hit * (span.nodes - 1) / span.nodes
        rdma_bytes = token_bytes * remote_hosts
        inter_bw = cluster.inter_node_bytes_per_s_per_gpu * p.inter_node_efficiency
        t = max(t, comm.transfer_s(rdma_bytes, rdma_bytes / (span.nodes - 1), inter_bw, p))
        alpha = cluster.inter_node_latency_s
    return alpha + p.collective_overhead_s + t


_NO_GROUP = comm.GroupSpan(1, 1, 1)


def expert_blind_split(s: Split) -> Split:
    """The split with expert parallelism reset (ep, etp, the MoE load, the dispatcher, sequential experts,
    padding to capacity, shared-expert overlap)."""
    return Split(s.tp, s.sp, s.cp, 1, 1, s.tokens, s.seq_len, s.hidden, s.peak_flops, 1.0, s.cp_comm_type,
                 "alltoall", s.attn_peak_flops, s.attention_kernel, s.cp_ring, s.cp_repeats_kv_heads,
                 s.cp_comm_overlapped, s.tp_backward_overlap, s.eager, False, s.fp8_casts, False, False,
                 s.loss_fwd_bytes, s.loss_bwd_bytes, s.unfused_attention)  # (positional: _replace costs 3x, and a
    # search makes ~10^3)


def expert_blind(s: Split, spans: Spans) -> tuple[Split, Spans]:
    """The split and spans with expert parallelism reset (ep, etp, the MoE load, the dispatcher,
    their groups): no term of a layer without experts reads them (tests/test_search_speed.py
    checks equal costs on every split), so a search prices such a layer once for all its
    expert layouts (autopar.cost.step.StepMemo)."""
    return expert_blind_split(s), Spans(spans.tp, spans.cp, _NO_GROUP, _NO_GROUP)


# CPU time of one Transformer Engine linear's forward as Megatron-Core calls it (TEColumnParallelLinear,
# BF16, TP 1): 140 µs before and 115 µs after TransformerEngine PR #1191 (Sep 2024, "Minor
# optimizations to reduce CPU overheads in modules"); Megatron's own ColumnParallelLinear, 74 µs.
TE_LINEAR_FORWARD_HOST_S = 115e-6
LINEARS_PER_EXPERT = 2  # fc1 (gate and up fused) and fc2


def sequential_experts_host_wait_s(layer: Layer, s: Split, experts_gpu_s: float, dispatch_s: float) -> float:
    """Forward seconds the GPU waits for the host in an MoE layer run as Megatron's SequentialMLP
    (no --moe-grouped-gemm): the host launches each local expert's linears from Python
    (LINEARS_PER_EXPERT · TE_LINEAR_FORWARD_HOST_S each) after the dispatcher's host synchronisation
    on the token counts, ahead of the GPU only by the dispatch it queued (`dispatch_s`: the all-to-all
    and ETP gather, half the layer's forward EP traffic, the combine after the experts being the
    same); the GPU needs `experts_gpu_s` for the experts (their GEMMs, activation, permutations).
    The backward runs in autograd's engine behind twice the GPU work and is taken as GPU-bound.
    Padded to capacity (Split.moe_padded) the dispatcher never synchronises (its counts are built
    on the host, cuda_sync_point stays "no_sync"), so the host queues the experts behind the GPU's
    earlier work and the GPU does not wait."""
    if not s.sequential_experts or not layer.num_experts or s.moe_padded:
        return 0.0
    host_s = max(layer.num_experts // s.ep, 1) * LINEARS_PER_EXPERT * TE_LINEAR_FORWARD_HOST_S
    return max(0.0, host_s - experts_gpu_s - dispatch_s)


def layer_cost(layer: Layer, s: Split, spans: Spans, cluster: Cluster, p: CostParams, tp_overlap: bool,
               gemm_memo: dict | None = None) -> LayerCost:
    fwd, bwd, module_s = _compute(layer, s, cluster, p, gemm_memo)
    tp = _tp_comm(layer, s, spans, cluster, p, tp_overlap)
    tp_bwd = _tp_comm_bwd(layer, s, spans, cluster, p, tp_overlap, tp, gemm_memo)
    if s.cp == 1 or not layer.num_heads:
        cp = cp_bwd = mamba_cp_all_to_all_s(layer, s, spans, cluster, p)
    elif s.cp_ring == "torch":
        cp, cp_bwd = torch_ring_comm_s(layer, s, spans, cluster, p, module_s["core_attn"],
                                       module_s["core_attn"] * p.attention_backward_ratio)
    else:
        cp = _cp_comm(layer, s, spans, cluster, p, module_s["core_attn"])
        cp_bwd = _cp_comm(layer, s, spans, cluster, p, module_s["core_attn"] * p.attention_backward_ratio / 2) * 2
    ep = _ep_comm(layer, s, spans, cluster, p)
    ep_fwd = ep + moe_count_gather_s(layer, s, spans, cluster, p)
    fwd += sequential_experts_host_wait_s(layer, s, module_s.get("moe", 0.0), ep / 2)
    hidden_fwd, hidden_bwd = shared_expert_overlap_s(layer, s, cluster, p, ep, gemm_memo)
    return LayerCost(
        fwd_compute_s=fwd, bwd_compute_s=bwd, tp_comm_fwd_s=tp, tp_comm_bwd_s=tp_bwd, cp_comm_fwd_s=cp,
        cp_comm_bwd_s=cp_bwd, ep_comm_fwd_s=ep_fwd - hidden_fwd, ep_comm_bwd_s=ep - hidden_bwd,
        module_recompute_s=tuple(sorted(module_s.items())),
    )
