"""Token mixers other than softmax attention: their weights, the FLOPs their kernels spend beyond the
weight GEMMs, and the tensors they save for backward, one pure function per mixer. The layer
graph (autopar.model.build) places them in decoder layers; the cost model prices the scan FLOPs
(`Mixer.scan_flops_per_token`) at the attention kernels' efficiency and the GEMMs as GEMMs.

Conventions as in autopar.model.graph: 2 FLOPs per multiply-accumulate, bytes per token at bf16
unless fp32, `split` "tp" for what Megatron divides over tensor-parallel ranks (heads, groups and
their channels), "sp" for what sequence parallelism divides, "none" for what every rank holds.

Sources
- Mamba-2: Dao & Gu 2024, "Transformers are SSMs" (arXiv 2405.21060) §6-7, the SSD chunked
  algorithm; shapes as Megatron-LM megatron/core/ssm/mamba_mixer.py (megatron-core 0.16) and HF
  transformers models/nemotron_h build them: in_proj h -> [z, x, B, C, dt] = 2·d_inner + 2·G·N + H,
  a depthwise conv1d over [x, B, C] (d_inner + 2·G·N channels, with bias), dt_bias, A_log and D
  per head, a gated RMSNorm over d_inner, out_proj d_inner -> h. Megatron splits heads and groups
  over TP (in_proj column-parallel, out_proj row-parallel: tp must divide H and G) and, under CP,
  all-to-alls z, x, B, C, dt from a sequence split to a head split around the conv and the scan
  (megatron/core/ssm/mamba_context_parallel.py: heads / tp must be a multiple of cp).
- Gated DeltaNet: Yang, Kautz & Hatamizadeh 2024 (arXiv 2412.06464), chunked with the WY
  representation of flash-linear-attention's chunk_gated_delta_rule (chunk 64); shapes as HF
  models/qwen3_next Qwen3NextGatedDeltaNet: in_proj_qkvz h -> 2·Hk·dk + 2·Hv·dv, in_proj_ba
  h -> 2·Hv, conv1d over [q, k, v] (2·Hk·dk + Hv·dv channels, no bias), dt_bias and A_log per
  value head, a gated RMSNorm of dv weights shared by the heads, out_proj Hv·dv -> h. Megatron
  (megatron/core/ssm/gated_delta_net.py, 0.16) splits both head counts over TP and has no CP.
- Kimi Delta Attention: Kimi Linear report (arXiv 2510.26692) §3, a delta rule with a
  per-channel decay, the same chunked form; shapes as HF models/kimi_linear
  KimiDeltaAttention: q, k, v projections h -> H·d, a low-rank forget gate (f_a h -> d, f_b
  d -> H·d) and output gate (g_a, g_b likewise), b_proj h -> H, three short convs on q, k, v,
  A_log per head, dt_bias per channel (H·d), an output RMSNorm of d weights, o_proj H·d -> h.
- DeepSeek Sparse Attention's lightning indexer: DeepSeek-V3.2-Exp report §2.1; HF
  models/deepseek_v32 Indexer: wq_b q_lora_rank -> n·d, wk h -> d, a LayerNorm on k (weight
  and bias), weights_proj h -> n; it scores every earlier key with n heads of dim d (a
  quadratic term, run in FP8 by DeepSeek and priced here at bf16), then each query attends only
  its top_k keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.model.graph import BYTES_16BIT as B2
from autopar.model.graph import BYTES_FP32 as B4
from autopar.model.graph import Activation, Gemm
from autopar.schema.model import IndexerSpec, LinearAttentionSpec, MambaSpec

GATED_NORM_FLOPS_PER_ELEMENT = 8  # RMS, normalise, scale, silu gate (exp, add, div) and multiply
SOFTPLUS_FLOPS_PER_ELEMENT = 4  # dt = softplus(dt + dt_bias): add, exp, log1p


@dataclass(frozen=True, slots=True)
class Mixer:
    """A token mixer's contribution to its decoder layer (the layer's pre-norm excluded)."""

    gemms: tuple[Gemm, ...]
    params_tp: int  # non-GEMM weights split over tp (conv, per-head scalars, per-channel norms)
    params_replicated: int  # non-GEMM weights every TP rank holds whole (norms shared by heads)
    activations: tuple[Activation, ...]
    scan_flops_per_token: float  # FLOPs of the conv and the chunked scan, beyond the GEMMs
    elementwise_flops_per_token: float
    elementwise_bytes_per_token_tp: float  # HBM traffic of the conv, gates and norm (tp-split)
    scan_kernel: str = ""  # the scan's kernel family in a cost model's kernel table ("" = attention's)
    scan_bytes_per_token: tuple[float, float] = (0.0, 0.0)  # (forward, backward) HBM bytes of the scan kernels (tp-split)


def ssd_scan_bytes_per_token(num_heads: int, head_dim: int, state_size: int, chunk: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of Mamba-2's chunked SSD kernels as mamba_ssm runs them
    (mamba_ssm/ops/triton/ssd_combined.py @ 2e16fc3, the tree NeMo 25.04 installs; Megatron's
    mamba_split_conv1d_scan_combined calls these kernels). The chunk states, H·P·N per chunk of Q
    tokens, S = H·P·N/Q elements a token, dominate:
      forward: _chunk_state_fwd writes them in fp32 (states_in_fp32=True, 4·S), _state_passing_fwd
        reads them (4·S) and writes the carried states in bf16 (2·S), _chunk_scan_fwd reads those
        (2·S): 12·S; and x (read by the state and the scan kernels), z, out and out_x, 2·H·P bf16
        each: 10·H·P;
      backward (_mamba_chunk_scan_combined_bwd): the states recomputed (12·S as forward), dstates in
        fp32 from _chunk_scan_bwd_dstates, through _state_passing_bwd (read and written, with the
        states read again) and read by the dx, dB and ddA kernels: 22·S more, 34·S; x, z, dout, out
        and their gradients read and written by the five backward kernels: 44·H·P.
    B, C and dt (G·N and H a token) are left out."""
    s = num_heads * head_dim * state_size / chunk
    hp = num_heads * head_dim
    return 12.0 * s + 10.0 * hp, 34.0 * s + 44.0 * hp


def ssd_scan_flops_per_token(num_heads: int, head_dim: int, state_size: int, num_groups: int, chunk: int) -> float:
    """Forward FLOPs per token of Mamba-2's chunked SSD scan (Dao & Gu 2024 §6, the four steps of
    ssd_minimal / the Triton kernels of mamba_chunk_scan_combined), with H heads of P channels,
    state N, G groups of B/C and chunk Q:
      1. C·Bᵀ within each chunk, per group: a Q×Q block over N        → 2·Q·N·G per token
      2. the masked (Q×Q) scores times x, per head                     → 2·Q·P·H
      3. chunk states Bᵀ·x, per head, (N×Q)·(Q×P)                      → 2·N·P·H
      4. output from the carried states C·h, per head, (Q×N)·(N×P)     → 2·N·P·H
      and the inter-chunk recurrence, one N×P update per head a chunk → 2·N·P·H/Q.
    Full Q×Q blocks are counted (the kernels compute the masked half); ignores the exp/cumsum of
    the decays (H·Q per token)."""
    q, n, p, h, g = chunk, state_size, head_dim, num_heads, num_groups
    return 2.0 * q * n * g + 2.0 * q * p * h + 4.0 * n * p * h + 2.0 * n * p * h / q


def delta_rule_scan_flops_per_token(num_heads: int, key_dim: int, value_dim: int, chunk: int) -> float:
    """Forward FLOPs per token of a chunked (gated) delta rule (Yang et al. 2024 §3.3, the WY form
    of flash-linear-attention's chunk_gated_delta_rule; KDA's chunk_kda the same with a per-channel
    decay), per head with key dim dk, value dim dv and chunk C:
      K·Kᵀ in the chunk (the WY matrix)                     2·C·dk
      its triangular inverse (C³/3 MACs a chunk)           2·C²/3
      W = A·(β⊙K), U = A·(β⊙V)                             2·C·dk + 2·C·dv
      state update: W·S, then Kᵀ·(U − W·S)                 2·dk·dv + 2·dk·dv
      output Q·S + (Q·Kᵀ ⊙ mask)·(U − W·S)                 2·dk·dv + 2·C·dk + 2·C·dv
    = 6·C·dk + 4·C·dv + 6·dk·dv + 2·C²/3 per value head (q and k are repeated to the value heads).
    Ignores the gates' cumulative sums and exponentials (C·dk per token at most)."""
    c, dk, dv = chunk, key_dim, value_dim
    return num_heads * (6.0 * c * dk + 4.0 * c * dv + 6.0 * dk * dv + 2.0 * c * c / 3.0)


def conv_flops_per_token(channels: int, kernel: int) -> float:
    """A depthwise causal conv1d: kernel MACs per channel per token."""
    return 2.0 * channels * kernel


def mamba2(m: MambaSpec, hidden: int) -> Mixer:
    """Mamba-2 mixer (see the module docstring for the shapes). Saved for backward, per token (the
    memory-efficient path of Megatron's MambaMixer / mamba_split_conv1d_scan_combined): the
    in_proj output [z, x, B, C, dt], the conv output [x, B, C], dt and its cumulative decay in
    fp32, the scan output y and the gated norm's output (out_proj's input). The chunk states are
    recomputed in backward, not saved."""
    d_inner = m.num_heads * m.head_dim
    bc = 2 * m.num_groups * m.state_size
    conv_dim = d_inner + bc
    in_n = 2 * d_inner + bc + m.num_heads
    gemms = (Gemm("mamba_in_proj", in_n, hidden, "col", bias=m.proj_bias),
             Gemm("mamba_out_proj", hidden, d_inner, "row", bias=m.proj_bias))
    params_tp = conv_dim * m.conv_kernel + (conv_dim if m.conv_bias else 0) + 3 * m.num_heads + d_inner
    acts = (Activation("mamba_in_proj_output", "kept", "tp", B2 * in_n),
            Activation("mamba_conv_output", "kept", "tp", B2 * conv_dim),
            Activation("mamba_dt_fp32", "kept", "tp", 2 * B4 * m.num_heads),
            Activation("mamba_scan_output", "kept", "tp", B2 * d_inner),
            Activation("mamba_norm_output", "kept", "tp", B2 * d_inner))
    scan = ssd_scan_flops_per_token(m.num_heads, m.head_dim, m.state_size, m.num_groups, m.chunk_size)
    scan += conv_flops_per_token(conv_dim, m.conv_kernel)
    ew_flops = GATED_NORM_FLOPS_PER_ELEMENT * d_inner + SOFTPLUS_FLOPS_PER_ELEMENT * m.num_heads
    # conv: read + write conv_dim; gated norm: read y and z, write its output
    ew_bytes = B2 * (2 * conv_dim + 3 * d_inner)
    return Mixer(gemms, params_tp, 0, acts, scan, float(ew_flops), float(ew_bytes), "ssd",
                 ssd_scan_bytes_per_token(m.num_heads, m.head_dim, m.state_size, m.chunk_size))


def gated_deltanet(la: LinearAttentionSpec, hidden: int) -> Mixer:
    """Gated DeltaNet (Qwen3-Next; see the module docstring for the shapes). Saved per token (what
    flash-linear-attention's chunk_gated_delta_rule keeps for backward, plus the projections'
    outputs): the in_proj outputs, the conv output [q, k, v], the gate g and β in fp32, the WY
    matrix A (C values per value head, bf16 after solve_tril), the scan output and the gated
    norm's output. The chunk states are recomputed in backward."""
    kd, vd = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
    hv = la.num_value_heads
    conv_dim = 2 * kd + vd
    gemms = (Gemm("gdn_in_proj_qkvz", 2 * kd + 2 * vd, hidden, "col"),
             Gemm("gdn_in_proj_ba", 2 * hv, hidden, "col"),
             Gemm("gdn_out_proj", hidden, vd, "row"))
    params_tp = conv_dim * la.conv_kernel + 2 * hv
    acts = (Activation("gdn_in_proj_output", "kept", "tp", B2 * (2 * kd + 2 * vd + 2 * hv)),
            Activation("gdn_conv_output", "kept", "tp", B2 * conv_dim),
            Activation("gdn_gate_beta_fp32", "kept", "tp", 2 * B4 * hv),
            Activation("gdn_wy_matrix", "kept", "tp", B2 * la.chunk_size * hv),
            Activation("gdn_scan_output", "kept", "tp", B2 * vd),
            Activation("gdn_norm_output", "kept", "tp", B2 * vd))
    scan = delta_rule_scan_flops_per_token(hv, la.key_head_dim, la.value_head_dim, la.chunk_size)
    scan += conv_flops_per_token(conv_dim, la.conv_kernel)
    ew_flops = GATED_NORM_FLOPS_PER_ELEMENT * vd + SOFTPLUS_FLOPS_PER_ELEMENT * hv
    ew_bytes = B2 * (2 * conv_dim + 3 * vd)
    return Mixer(gemms, params_tp, la.value_head_dim, acts, scan, float(ew_flops), float(ew_bytes))


def kimi_delta_attention(la: LinearAttentionSpec, hidden: int) -> Mixer:
    """Kimi Delta Attention (Kimi-Linear; see the module docstring for the shapes). The low-rank
    down-projections of the two gates (h -> d) are replicated on every TP rank, as MLA's are; the
    up-projections are column-parallel. Saved per token: q, k, v (after their convs), the
    per-channel decay g in fp32, β, the WY matrix, the gate's low-rank outputs, the scan output
    and the gated norm's output."""
    h, d = la.num_key_heads, la.key_head_dim
    hd = h * d
    gemms = (Gemm("kda_q", hd, hidden, "col"), Gemm("kda_k", hd, hidden, "col"), Gemm("kda_v", hd, hidden, "col"),
             Gemm("kda_f_a", d, hidden, "none"), Gemm("kda_f_b", hd, d, "col"),
             Gemm("kda_g_a", d, hidden, "none"), Gemm("kda_g_b", hd, d, "col"),
             Gemm("kda_b", h, hidden, "col"), Gemm("kda_o", hidden, hd, "row"))
    params_tp = 3 * hd * la.conv_kernel + h + hd
    acts = (Activation("kda_qkv_proj_output", "kept", "tp", B2 * 3 * hd),
            Activation("kda_conv_output", "kept", "tp", B2 * 3 * hd),
            Activation("kda_decay_fp32", "kept", "tp", B4 * hd),
            Activation("kda_beta_fp32", "kept", "tp", B4 * h),
            Activation("kda_wy_matrix", "kept", "tp", B2 * la.chunk_size * h),
            Activation("kda_gate_latents", "kept", "sp", B2 * 2 * d),
            Activation("kda_output_gate", "kept", "tp", B2 * hd),
            Activation("kda_scan_output", "kept", "tp", B2 * hd),
            Activation("kda_norm_output", "kept", "tp", B2 * hd))
    scan = delta_rule_scan_flops_per_token(h, d, la.value_head_dim, la.chunk_size)
    scan += conv_flops_per_token(3 * hd, la.conv_kernel)
    ew_flops = GATED_NORM_FLOPS_PER_ELEMENT * hd + SOFTPLUS_FLOPS_PER_ELEMENT * hd
    ew_bytes = B2 * (2 * 3 * hd + 3 * hd)
    return Mixer(gemms, params_tp, d, acts, scan, float(ew_flops), float(ew_bytes))


def dsa_indexer(ix: IndexerSpec, hidden: int, q_lora_rank: int) -> tuple[tuple[Gemm, ...], int, float,
                                                                           tuple[Activation, ...]]:
    """The lightning indexer's GEMMs, its replicated LayerNorm (weight + bias on k), its score
    FLOPs per key (2·n·d per query-key pair, plus the n head weights' sum), and what it saves
    (its q, k and head weights). wk and weights_proj read the layer input and are replicated, as
    MLA's down-projections are; wq_b reads the q latent and is split by heads."""
    gemms = (Gemm("indexer_q", ix.num_heads * ix.head_dim, q_lora_rank, "col"),
             Gemm("indexer_k", ix.head_dim, hidden, "none"),
             Gemm("indexer_weights", ix.num_heads, hidden, "none"))
    acts = (Activation("indexer_q", "kept", "tp", B2 * ix.num_heads * ix.head_dim),
            Activation("indexer_k", "kept", "sp", B2 * ix.head_dim),
            Activation("indexer_weights", "kept", "sp", B4 * ix.num_heads))
    per_key = 2.0 * ix.num_heads * ix.head_dim + 2.0 * ix.num_heads
    return gemms, 2 * ix.head_dim, per_key, acts


# Megatron-LM's hybrid layer symbols (megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols;
# HF Nemotron-H hybrid_override_pattern): one block per layer, as (layer_pattern, ffn_pattern) letters.
HYBRID_SYMBOL_TO_LETTERS = {"M": ("M", "-"), "*": ("N", "-"), "-": ("-", "D"), "E": ("-", "E")}


def split_hybrid_pattern(pattern: str) -> tuple[str, str]:
    """(layer_pattern, ffn_pattern) of a Megatron hybrid pattern (its letters checked by the caller).
    Attention layers of a hybrid stack carry no positional embedding (Nemotron-H): N."""
    return ("".join(HYBRID_SYMBOL_TO_LETTERS[c][0] for c in pattern),
            "".join(HYBRID_SYMBOL_TO_LETTERS[c][1] for c in pattern))


def hybrid_pattern(layer_pattern: str, ffn_pattern: str) -> str | None:
    """The Megatron hybrid pattern of a one-block-per-layer stack, or None where a layer has both a
    mixer and a feed-forward block, or a mixer Megatron's hybrid stack has no symbol for."""
    letters_to_symbol = {v: k for k, v in HYBRID_SYMBOL_TO_LETTERS.items()}
    letters_to_symbol[("A", "-")] = "*"
    out = [letters_to_symbol.get((m, f)) for m, f in zip(layer_pattern, ffn_pattern)]
    return None if None in out else "".join(out)
