"""Build the layer graph (autopar.model.graph) from a ModelSpec.

Parameter counts follow the Hugging Face implementations module by module (tests pin nine
published totals); activations follow Korthikanti et al. 2022 §4 tensor by tensor, generalized
to GQA, SwiGLU, MoE and MLA. Attention is priced as a fused flash kernel (saves q, k, v, the
output and fp32 log-sum-exp) unless the spec has dropout, which marks a Megatron GPT of the
Korthikanti era: unfused softmax, whose a·s² tensors the paper counts.
"""

from __future__ import annotations

from autopar.model.graph import BYTES_16BIT as B2
from autopar.model.graph import BYTES_FP32 as B4
from autopar.model.graph import BYTES_MASK as B1
from autopar.model.graph import Activation, Gemm, Layer, ModelGraph
from autopar.schema.model import ModelSpec

# Elementwise FLOPs per element, a stated approximation (they are <1% of a layer's FLOPs):
NORM_FLOPS_PER_ELEMENT = 5  # mean/variance or RMS, normalize, scale (and shift)
GELU_FLOPS_PER_ELEMENT = 8  # tanh approximation
SWIGLU_FLOPS_PER_ELEMENT = 5  # silu (exp, add, div, mul) and the gating multiply
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, sub, exp, sum, div
# Unfused attention (Megatron before flash attention): the a·s scores of each token are written by
# the QK^T GEMM, read and written by the fused scale-mask-softmax kernel, read by dropout, which
# writes its output and a 1-byte mask: 2 + 2 + 2 + 2 + 2 + 1 = 11 bytes per score in forward.
UNFUSED_ATTENTION_BYTES_PER_SCORE = 11
# Eager PyTorch (no torch.compile) runs each op of the reference Llama block as its own kernel
# (torchtitan models/norms.py RMSNorm and models/llama/model.py apply_rotary_emb and FeedForward at
# 9dec370, 2024-12-26), bytes per element beyond the fused kernel's read + write of 2 + 2:
# RMSNorm `y = x.float(); (y * rsqrt(y.pow(2).mean(-1) + eps)).type_as(x) * weight`: cast 2 + 4,
# pow 4 + 4, mean 4, multiply 4 + 4, cast back 4 + 2, weight 2 + 2 = 36, fused 4: 32 more.
EAGER_RMSNORM_EXTRA_BYTES = 32
# RoPE on q and k `view_as_real(view_as_complex(x.float()) * freqs).type_as(x)`: cast 2 + 4, complex
# multiply 4 + 4, cast back 4 + 2 = 20, fused 4: 16 more per element of q and k.
EAGER_ROPE_EXTRA_BYTES = 16
# SwiGLU `silu(w1 x) * w3 x`: silu 2 + 2, multiply 2 + 2 + 2 = 10, fused 2 + 2 + 2 = 6: 4 more per
# element of the FFN width. (GELU and LayerNorm are one ATen kernel each in eager too: nothing more.)
EAGER_SWIGLU_EXTRA_BYTES = 4


def _norm_params(spec: ModelSpec, width: int) -> int:
    return width * (2 if spec.normalization == "layernorm" else 1)


def _attention(spec: ModelSpec) -> tuple[list[Gemm], int, list[Activation], dict]:
    """Attention block: gemms, replicated non-gemm params, saved tensors, shape facts."""
    h, a, kv = spec.hidden_size, spec.num_attention_heads, spec.kv_heads
    acts = [
        Activation("attn_norm_input", "layer_input", "sp", B2 * h),
        Activation("attn_norm_output", "layernorm", "sp", B2 * h),
    ]
    other = _norm_params(spec, h)
    if spec.mla is not None:
        m = spec.mla
        dqk, dv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        gemms = []
        if m.q_lora_rank:
            gemms += [Gemm("q_down", m.q_lora_rank, h, "none"), Gemm("q_up", a * dqk, m.q_lora_rank, "col")]
            other += _norm_params(spec, m.q_lora_rank)
            acts += [Activation("q_latent", "kept", "sp", 2 * B2 * m.q_lora_rank)]  # down output + its norm
        else:
            gemms += [Gemm("q", a * dqk, h, "col")]
        gemms += [
            Gemm("kv_down", m.kv_lora_rank + m.qk_rope_head_dim, h, "none"),
            Gemm("kv_up", a * (m.qk_nope_head_dim + dv), m.kv_lora_rank, "col"),
            Gemm("attn_out", h, a * dv, "row", bias=spec.attn_out_bias),
        ]
        other += _norm_params(spec, m.kv_lora_rank)
        acts += [
            Activation("kv_latent", "kept", "sp", B2 * (2 * m.kv_lora_rank + m.qk_rope_head_dim)),
            Activation("q", "mla_up_proj", "tp", B2 * a * dqk),
            Activation("k", "mla_up_proj", "tp", B2 * a * dqk),
            Activation("v", "mla_up_proj", "tp", B2 * a * dv),
        ]
        kv_heads = a
    else:
        d = spec.head_size
        dqk = dv = d
        gemms = [
            Gemm("qkv", (a + 2 * kv) * d, h, "col", bias=spec.qkv_bias),
            Gemm("attn_out", h, a * d, "row", bias=spec.attn_out_bias),
        ]
        if spec.qk_norm:
            other += 2 * d
        acts += [
            Activation("q", "kept", "tp", B2 * a * d),
            Activation("k", "kept", "tp", B2 * kv * d),
            Activation("v", "kept", "tp", B2 * kv * d),
        ]
        kv_heads = kv
    acts += _core_attention_acts(spec, a, dv)
    shape = dict(num_heads=a, num_kv_heads=kv_heads, head_dim_qk=dqk, head_dim_v=dv)
    return gemms, other, acts, shape


def _core_attention_acts(spec: ModelSpec, a: int, dv: int) -> list[Activation]:
    """Softmax/dropout tensors (unfused, Korthikanti) or flash's log-sum-exp, plus the context."""
    acts = [Activation("attn_context", "kept", "tp", B2 * a * dv)]
    if spec.dropout:
        acts += [
            Activation("softmax_output", "core_attn", "tp", 0.0, B2 * a),
            Activation("attn_dropout_mask", "core_attn", "tp", 0.0, B1 * a),
            Activation("attn_dropout_output", "core_attn", "tp", 0.0, B2 * a),
            Activation("attn_out_dropout_mask", "kept", "sp", B1 * spec.hidden_size),
        ]
    else:
        acts += [Activation("softmax_lse", "core_attn", "tp", B4 * a)]
    return acts


def _ffn_gemms(spec: ModelSpec, width: int, prefix: str, split: str, experts: int = 1, tokens: float = 1.0,
               bias: bool = False) -> list[Gemm]:
    """Up (and gate) plus down projection of one FFN of intermediate size `width`."""
    col, row = ("expert_col", "expert_row") if split == "expert" else ("col", "row")
    h = spec.hidden_size
    up_n = 2 * width if spec.activation == "swiglu" else width
    return [
        Gemm(f"{prefix}_fc1", up_n, h, col, bias=bias, num_experts=experts, tokens_per_token=tokens),
        Gemm(f"{prefix}_fc2", h, width, row, bias=bias, num_experts=experts, tokens_per_token=tokens),
    ]


def _ffn_acts(spec: ModelSpec, width: int, prefix: str, up_module: str, act_module: str, split: str,
              tokens: float = 1.0) -> list[Activation]:
    up_elems = 2 * width if spec.activation == "swiglu" else width
    return [
        Activation(f"{prefix}_fc1_output", up_module, split, B2 * up_elems * tokens),
        Activation(f"{prefix}_act_output", act_module, split, B2 * width * tokens),
    ]


def _act_flops(spec: ModelSpec, width: int) -> int:
    return width * (SWIGLU_FLOPS_PER_ELEMENT if spec.activation == "swiglu" else GELU_FLOPS_PER_ELEMENT)


def _eager_act_bytes(spec: ModelSpec, width: int) -> int:
    return EAGER_SWIGLU_EXTRA_BYTES * width if spec.activation == "swiglu" else 0


def _eager_norm_bytes(spec: ModelSpec, width: int) -> int:
    return EAGER_RMSNORM_EXTRA_BYTES * width if spec.normalization == "rmsnorm" else 0


def _act_bytes(spec: ModelSpec, width: int) -> int:
    """HBM traffic of the activation function: read fc1 output, write its result."""
    up_elems = 2 * width if spec.activation == "swiglu" else width
    return B2 * (up_elems + width)


def _decoder_layer(spec: ModelSpec, index: int, moe: bool, kind: str | None = None) -> Layer:
    h = spec.hidden_size
    gemms, other, acts, shape = _attention(spec)
    other += _norm_params(spec, h)
    acts += [
        Activation("mlp_norm_input", "kept", "sp", B2 * h),
        Activation("mlp_norm_output", "layernorm", "sp", B2 * h),
    ]
    ew_tp = 0.0
    eager_tp = 0.0
    ew_flops = 2 * NORM_FLOPS_PER_ELEMENT * h + 2 * h  # two norms, two residual adds
    if moe:
        e = spec.moe
        gemms.append(Gemm("router", e.num_experts, h, "none"))
        gemms += _ffn_gemms(spec, e.expert_ffn_hidden_size, "expert", "expert", e.num_experts, e.top_k)
        acts += [
            Activation("router_probs", "moe", "sp", B4 * e.num_experts),
            Activation("expert_input", "moe", "sp", B2 * h * e.top_k),
            Activation("expert_output", "moe", "sp", B2 * h * e.top_k),
        ]
        acts += _ffn_acts(spec, e.expert_ffn_hidden_size, "expert", "moe", "moe_act", "sp", e.top_k)
        ew_tp += _act_bytes(spec, e.expert_ffn_hidden_size) * e.top_k
        eager_tp += _eager_act_bytes(spec, e.expert_ffn_hidden_size) * e.top_k
        ew_flops += _act_flops(spec, e.expert_ffn_hidden_size) * e.top_k
        if e.num_shared_experts:
            width = e.shared_expert_ffn_hidden_size * e.num_shared_experts
            gemms += _ffn_gemms(spec, width, "shared", "dense")
            if e.shared_expert_gate:
                gemms.append(Gemm("shared_gate", 1, h, "none"))
            acts += _ffn_acts(spec, width, "shared", "shared_experts", "shared_experts", "tp")
            ew_tp += _act_bytes(spec, width)
            eager_tp += _eager_act_bytes(spec, width)
            ew_flops += _act_flops(spec, width)
    else:
        gemms += _ffn_gemms(spec, spec.ffn_hidden_size, "mlp", "dense", bias=spec.mlp_bias)
        acts += _ffn_acts(spec, spec.ffn_hidden_size, "mlp", "mlp", "mlp", "tp")
        ew_tp += _act_bytes(spec, spec.ffn_hidden_size)
        eager_tp += _eager_act_bytes(spec, spec.ffn_hidden_size)
        ew_flops += _act_flops(spec, spec.ffn_hidden_size)
    if spec.dropout:
        acts.append(Activation("mlp_dropout_mask", "kept", "sp", B1 * h))
    a, dqk, dv = shape["num_heads"], shape["head_dim_qk"], shape["head_dim_v"]
    # sp-side traffic: 2 norms (read+write 2h each) and 2 residual adds (read 2, write 1).
    ew_sp = B2 * (2 * 2 * h + 2 * 3 * h)
    if spec.position_embedding == "rope":
        ew_tp += B2 * 2 * (a + shape["num_kv_heads"]) * dqk  # read+write q and k
        eager_tp += EAGER_ROPE_EXTRA_BYTES * (a + shape["num_kv_heads"]) * dqk
    if spec.qk_norm:
        eager_tp += _eager_norm_bytes(spec, (a + shape["num_kv_heads"]) * dqk)
    layer_kind = kind or ("moe" if moe else "dense")
    return Layer(
        index=index, kind=layer_kind, name=f"{layer_kind}_{index}", gemms=tuple(gemms),
        other_params_tp=0, other_params_replicated=other, activations=tuple(acts),
        attn_flops_per_token_per_seq=2.0 * a * (dqk + dv),
        elementwise_bytes_per_token_per_seq_tp=float(UNFUSED_ATTENTION_BYTES_PER_SCORE * a) if spec.dropout else 0.0,
        elementwise_flops_per_token=float(ew_flops),
        elementwise_bytes_per_token_tp=float(ew_tp), elementwise_bytes_per_token_sp=float(ew_sp),
        eager_bytes_per_token_tp=float(eager_tp), eager_bytes_per_token_sp=float(2 * _eager_norm_bytes(spec, h)),
        top_k=spec.moe.top_k if moe else 0, num_experts=spec.moe.num_experts if moe else 0,
        attention_window=spec.sliding_window, **shape,
    )


def _embedding_layer(spec: ModelSpec) -> Layer:
    h = spec.hidden_size
    positions = (spec.max_position_embeddings or spec.seq_length) * h if spec.position_embedding == "learned" else 0
    acts = [Activation("embedding_dropout_mask", "kept", "sp", B1 * h)] if spec.dropout else []
    return Layer(
        index=0, kind="embedding", name="embedding", gemms=(),
        other_params_tp=spec.vocab_size * h, other_params_replicated=positions,
        activations=tuple(acts), elementwise_bytes_per_token_sp=float(B2 * h * (2 if positions else 1)),
    )


def _head_acts(spec: ModelSpec) -> list[Activation]:
    return [
        Activation("final_norm_input", "kept", "sp", B2 * spec.hidden_size),
        Activation("head_input", "kept", "sp", B2 * spec.hidden_size),
        Activation("logits_fp32", "kept", "tp", B4 * spec.vocab_size),
    ]


def _head_layer(spec: ModelSpec, index: int) -> Layer:
    h, v = spec.hidden_size, spec.vocab_size
    return Layer(
        index=index, kind="head", name="head",
        gemms=(Gemm("output", v, h, "vocab", tied=spec.tie_embeddings),),
        other_params_tp=0, other_params_replicated=_norm_params(spec, h),
        activations=tuple(_head_acts(spec)),
        elementwise_flops_per_token=float(NORM_FLOPS_PER_ELEMENT * h + SOFTMAX_FLOPS_PER_ELEMENT * v),
        elementwise_bytes_per_token_tp=float((B2 + 2 * B4) * v),  # read logits, write+read fp32 softmax
        elementwise_bytes_per_token_sp=float(2 * B2 * h), eager_bytes_per_token_sp=float(_eager_norm_bytes(spec, h)),
    )


def _mtp_layer(spec: ModelSpec, index: int, depth: int) -> Layer:
    """DeepSeek-V3 MTP module: two norms, eh_proj (2h -> h), one decoder layer, a final norm; the
    embedding and output head are shared with the main model (their weights count once)."""
    h = spec.hidden_size
    inner = _decoder_layer(spec, spec.num_layers + depth, spec.is_moe_layer(spec.num_layers + depth))
    gemms = inner.gemms + (Gemm("eh_proj", h, 2 * h, "col"), Gemm("mtp_output", spec.vocab_size, h, "vocab", tied=True))
    acts = inner.activations + (Activation("mtp_concat", "kept", "sp", B2 * 2 * h),) + tuple(_head_acts(spec))
    return Layer(
        index=index, kind="mtp", name=f"mtp_{depth}", gemms=gemms, other_params_tp=0,
        other_params_replicated=inner.other_params_replicated + 3 * _norm_params(spec, h),
        activations=acts, attn_flops_per_token_per_seq=inner.attn_flops_per_token_per_seq,
        elementwise_flops_per_token=inner.elementwise_flops_per_token + SOFTMAX_FLOPS_PER_ELEMENT * spec.vocab_size,
        elementwise_bytes_per_token_tp=inner.elementwise_bytes_per_token_tp + (B2 + 2 * B4) * spec.vocab_size,
        elementwise_bytes_per_token_sp=inner.elementwise_bytes_per_token_sp,
        eager_bytes_per_token_tp=inner.eager_bytes_per_token_tp,
        eager_bytes_per_token_sp=inner.eager_bytes_per_token_sp + 3 * _eager_norm_bytes(spec, h),
        num_heads=inner.num_heads, num_kv_heads=inner.num_kv_heads, head_dim_qk=inner.head_dim_qk,
        head_dim_v=inner.head_dim_v, top_k=inner.top_k, num_experts=inner.num_experts,
        attention_window=inner.attention_window,
    )


def build_graph(spec: ModelSpec) -> ModelGraph:
    """Layers in execution order: embedding, decoders (dense/MoE), MTP modules, head + loss."""
    layers = [_embedding_layer(spec)]
    for i in range(spec.num_layers):
        layers.append(_decoder_layer(spec, len(layers), spec.is_moe_layer(i)))
    for depth in range(spec.mtp_layers):
        layers.append(_mtp_layer(spec, len(layers), depth))
    layers.append(_head_layer(spec, len(layers)))
    return ModelGraph(spec=spec, layers=tuple(layers))
