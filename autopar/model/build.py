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
from autopar.model.mixers import Mixer, dsa_indexer, gated_deltanet, kimi_delta_attention, mamba2
from autopar.schema.model import ModelSpec

# Elementwise FLOPs per element, a stated approximation (they are <1% of a layer's FLOPs):
NORM_FLOPS_PER_ELEMENT = 5  # mean/variance or RMS, normalize, scale (and shift)
GELU_FLOPS_PER_ELEMENT = 8  # tanh approximation
SWIGLU_FLOPS_PER_ELEMENT = 5  # silu (exp, add, div, mul) and the gating multiply
RELU2_FLOPS_PER_ELEMENT = 2  # max(x, 0) and the square
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
    """Attention block: gemms, replicated non-gemm params, saved tensors, shape facts. Qwen3-Next's
    output gate doubles the q projection (HF models/qwen3_next q_proj: heads · head_dim · 2), gpt-oss's
    sinks are one learned logit per head (HF models/gpt_oss self_attn.sinks), split with the heads."""
    h, a, kv = spec.hidden_size, spec.num_attention_heads, spec.kv_heads
    acts = [
        Activation("attn_norm_input", "layer_input", "sp", B2 * h),
        Activation("attn_norm_output", "layernorm", "sp", B2 * h),
    ]
    other = _norm_params(spec, h)
    gate = a * spec.head_size if spec.attention_output_gate and spec.mla is None else 0
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
            Gemm("qkv", (a + 2 * kv) * d + gate, h, "col", bias=spec.qkv_bias),
            Gemm("attn_out", h, a * d, "row", bias=spec.attn_out_bias),
        ]
        if gate:
            acts.append(Activation("attn_gate", "kept", "tp", B2 * gate))
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
    """Up (and gate) plus down projection of one FFN of intermediate size `width` (SwiGLU: gate
    and up; GeLU and Nemotron-H's squared ReLU: up only)."""
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
    per = {"swiglu": SWIGLU_FLOPS_PER_ELEMENT, "gelu": GELU_FLOPS_PER_ELEMENT, "relu2": RELU2_FLOPS_PER_ELEMENT}
    return width * per[spec.activation]


def _eager_act_bytes(spec: ModelSpec, width: int) -> int:
    return EAGER_SWIGLU_EXTRA_BYTES * width if spec.activation == "swiglu" else 0


def _eager_norm_bytes(spec: ModelSpec, width: int) -> int:
    return EAGER_RMSNORM_EXTRA_BYTES * width if spec.normalization == "rmsnorm" else 0


def _act_bytes(spec: ModelSpec, width: int) -> int:
    """HBM traffic of the activation function: read fc1 output, write its result."""
    up_elems = 2 * width if spec.activation == "swiglu" else width
    return B2 * (up_elems + width)


_MIXER_OF_LETTER = {"A": "attention", "N": "attention", "W": "attention", "C": "attention", "M": "mamba2",
                    "G": "gated_deltanet", "K": "kda", "-": "none"}


def _recurrent_mixer(spec: ModelSpec, letter: str) -> Mixer:
    """The Mamba-2 (M) or linear-attention (G, K) mixer of a layer (autopar.model.mixers)."""
    if letter == "M":
        return mamba2(spec.mamba, spec.hidden_size)
    if letter == "G":
        return gated_deltanet(spec.linear_attention, spec.hidden_size)
    return kimi_delta_attention(spec.linear_attention, spec.hidden_size)


def _mixer_block(spec: ModelSpec, letter: str) -> dict:
    """The token-mixer half of a decoder layer (its pre-norm included): attention of the layer
    pattern's letter (A full, N full without RoPE, W sliding window, C chunked), a recurrent mixer
    (M, G, K), or nothing (-)."""
    h = spec.hidden_size
    out = dict(gemms=[], other=0, other_tp=0, acts=[], ew_flops=0.0, ew_tp=0.0, eager_tp=0.0, attn_coef=0.0,
               index_coef=0.0, scan=0.0, scan_kernel="", scan_bytes=(0.0, 0.0), norms=0, shape=dict(num_heads=0, num_kv_heads=0, head_dim_qk=0, head_dim_v=0),
               window=None, chunk=None, top_k=None, cp_a2a=0.0)
    if letter == "-":
        return out
    out["norms"] = 1
    if letter in "ANWC":
        gemms, other, acts, shape = _attention(spec)
        a, dqk, dv = shape["num_heads"], shape["head_dim_qk"], shape["head_dim_v"]
        if spec.attention_sinks:
            out["other_tp"] += a
        if spec.indexer is not None:
            ix_gemms, ix_norm, per_key, ix_acts = dsa_indexer(spec.indexer, h, spec.mla.q_lora_rank or h)
            gemms += ix_gemms
            other += ix_norm
            acts += ix_acts
            out["index_coef"], out["top_k"] = per_key, spec.indexer.top_k
        out.update(gemms=gemms, other=other, acts=acts, shape=shape, attn_coef=2.0 * a * (dqk + dv),
                   window=spec.sliding_window if letter == "W" else None,
                   chunk=spec.attention_chunk_size if letter == "C" else None)
        if spec.position_embedding == "rope" and letter != "N":
            out["ew_tp"] += B2 * 2 * (a + shape["num_kv_heads"]) * dqk  # read+write q and k
            out["eager_tp"] += EAGER_ROPE_EXTRA_BYTES * (a + shape["num_kv_heads"]) * dqk
        if spec.qk_norm:
            out["eager_tp"] += _eager_norm_bytes(spec, (a + shape["num_kv_heads"]) * dqk)
        return out
    mixer = _recurrent_mixer(spec, letter)
    acts = [Activation("mixer_norm_input", "layer_input", "sp", B2 * h),
            Activation("mixer_norm_output", "layernorm", "sp", B2 * h), *mixer.activations]
    # Megatron's Mamba CP (mamba_context_parallel.py): z, x, B, C, dt to the head split and y back
    cp_a2a = (mixer.gemms[0].n + mixer.gemms[-1].k) * B2 if letter == "M" else 0.0
    out.update(gemms=list(mixer.gemms), other=_norm_params(spec, h) + mixer.params_replicated,
               other_tp=mixer.params_tp, acts=acts, ew_flops=mixer.elementwise_flops_per_token,
               ew_tp=mixer.elementwise_bytes_per_token_tp, scan=mixer.scan_flops_per_token, cp_a2a=cp_a2a,
               scan_kernel=mixer.scan_kernel, scan_bytes=mixer.scan_bytes_per_token)
    return out


def _ffn_block(spec: ModelSpec, letter: str, first: bool) -> dict:
    """The feed-forward half of a decoder layer (its pre-norm included): a dense MLP (D), routed
    experts with their router and shared experts (E), or nothing (-). `first`: no mixer before
    it, so its norm input is the layer input (what full recompute keeps)."""
    h = spec.hidden_size
    out = dict(gemms=[], other=0, acts=[], ew_flops=0.0, ew_tp=0.0, eager_tp=0.0, norms=0, moe=False)
    if letter == "-":
        return out
    gemms: list[Gemm] = []
    acts = [Activation("mlp_norm_input", "layer_input" if first else "kept", "sp", B2 * h),
            Activation("mlp_norm_output", "layernorm", "sp", B2 * h)]
    ew_tp = eager_tp = 0.0
    ew_flops = 0.0
    other = _norm_params(spec, h)
    if letter == "E":
        e = spec.moe
        gemms.append(Gemm("router", e.num_experts, h, "none", bias=e.router_bias))
        gemms += _ffn_gemms(spec, e.expert_ffn_hidden_size, "expert", "expert", e.num_experts, e.top_k,
                            bias=e.expert_mlp_bias)
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
    out.update(gemms=gemms, other=other, acts=acts, ew_flops=ew_flops, ew_tp=ew_tp, eager_tp=eager_tp, norms=1,
               moe=letter == "E")
    return out


def _decoder_layer(spec: ModelSpec, index: int, decoder_index: int) -> Layer:
    """Decoder layer `decoder_index` (MTP modules: past spec.num_layers) at graph position `index`:
    its mixer block, then its feed-forward block, each pre-norm with a residual add."""
    h = spec.hidden_size
    m_letter, f_letter = spec.mixer_of(decoder_index), spec.ffn_of(decoder_index)
    mix = _mixer_block(spec, m_letter)
    ffn = _ffn_block(spec, f_letter, first=m_letter == "-")
    blocks = mix["norms"] + ffn["norms"]
    # per block: a norm (5 FLOPs an element) and a residual add; sp-side traffic: the norm reads +
    # writes h, the residual add reads 2h and writes h
    ew_flops = blocks * (NORM_FLOPS_PER_ELEMENT * h + h) + mix["ew_flops"] + ffn["ew_flops"]
    ew_sp = B2 * blocks * (2 * h + 3 * h)
    layer_kind = "moe" if ffn["moe"] else "dense"
    variant = m_letter + f_letter if spec.is_hybrid else ""
    # TP blocks: an attention or Mamba/linear mixer, and a dense MLP (an MoE's experts talk over EP)
    tp_blocks = (m_letter != "-") + (f_letter == "D")
    return Layer(
        index=index, kind=layer_kind, name=f"{layer_kind}_{index}", gemms=tuple(mix["gemms"] + ffn["gemms"]),
        other_params_tp=mix["other_tp"], other_params_replicated=mix["other"] + ffn["other"],
        activations=tuple(mix["acts"] + ffn["acts"]),
        attn_flops_per_token_per_seq=mix["attn_coef"],
        elementwise_bytes_per_token_per_seq_tp=(float(UNFUSED_ATTENTION_BYTES_PER_SCORE * mix["shape"]["num_heads"])
                                                if spec.dropout else 0.0),
        elementwise_flops_per_token=float(ew_flops),
        elementwise_bytes_per_token_tp=float(mix["ew_tp"] + ffn["ew_tp"]), elementwise_bytes_per_token_sp=float(ew_sp),
        eager_bytes_per_token_tp=float(mix["eager_tp"] + ffn["eager_tp"]),
        eager_bytes_per_token_sp=float(blocks * _eager_norm_bytes(spec, h)),
        top_k=spec.moe.top_k if ffn["moe"] else 0, num_experts=spec.moe.num_experts if ffn["moe"] else 0,
        router_groups=(spec.moe.num_groups or 0) if ffn["moe"] else 0,
        router_group_topk=(spec.moe.group_topk or 0) if ffn["moe"] else 0,
        attention_window=mix["window"], attention_chunk=mix["chunk"], attention_top_k=mix["top_k"],
        mixer=_MIXER_OF_LETTER[m_letter], variant=variant, scan_flops_per_token=mix["scan"],
        scan_kernel=mix["scan_kernel"], scan_bytes_fwd_per_token=mix["scan_bytes"][0],
        scan_bytes_bwd_per_token=mix["scan_bytes"][1],
        index_flops_per_token_per_seq=mix["index_coef"], tp_blocks=float(tp_blocks) if spec.is_hybrid else 0.0,
        cp_a2a_bytes_per_token=mix["cp_a2a"], norm_tensors=blocks * (2 if spec.normalization == "layernorm" else 1),
        **mix["shape"],
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
        loss_logits_per_token_tp=float(v),  # the loss's traffic is the framework's (FrameworkProfile.loss_bytes_per_logit)
        elementwise_bytes_per_token_sp=float(2 * B2 * h), eager_bytes_per_token_sp=float(_eager_norm_bytes(spec, h)),
    )


def _mtp_layer(spec: ModelSpec, index: int, depth: int) -> Layer:
    """DeepSeek-V3 MTP module: two norms, eh_proj (2h -> h), one decoder layer, a final norm; the
    embedding and output head are shared with the main model (their weights count once)."""
    h = spec.hidden_size
    inner = _decoder_layer(spec, spec.num_layers + depth, spec.num_layers + depth)
    gemms = inner.gemms + (Gemm("eh_proj", h, 2 * h, "col"), Gemm("mtp_output", spec.vocab_size, h, "vocab", tied=True))
    acts = inner.activations + (Activation("mtp_concat", "kept", "sp", B2 * 2 * h),) + tuple(_head_acts(spec))
    return Layer(
        index=index, kind="mtp", name=f"mtp_{depth}", gemms=gemms, other_params_tp=0,
        other_params_replicated=inner.other_params_replicated + 3 * _norm_params(spec, h),
        activations=acts, attn_flops_per_token_per_seq=inner.attn_flops_per_token_per_seq,
        elementwise_flops_per_token=inner.elementwise_flops_per_token + SOFTMAX_FLOPS_PER_ELEMENT * spec.vocab_size,
        elementwise_bytes_per_token_tp=inner.elementwise_bytes_per_token_tp, loss_logits_per_token_tp=float(spec.vocab_size),
        elementwise_bytes_per_token_sp=inner.elementwise_bytes_per_token_sp,
        eager_bytes_per_token_tp=inner.eager_bytes_per_token_tp,
        eager_bytes_per_token_sp=inner.eager_bytes_per_token_sp + 3 * _eager_norm_bytes(spec, h),
        num_heads=inner.num_heads, num_kv_heads=inner.num_kv_heads, head_dim_qk=inner.head_dim_qk,
        head_dim_v=inner.head_dim_v, top_k=inner.top_k, num_experts=inner.num_experts,
        router_groups=inner.router_groups, router_group_topk=inner.router_group_topk,
        attention_window=inner.attention_window, attention_top_k=inner.attention_top_k,
        index_flops_per_token_per_seq=inner.index_flops_per_token_per_seq,
    )


def build_graph(spec: ModelSpec) -> ModelGraph:
    """Layers in execution order: embedding, decoders (dense/MoE), MTP modules, head + loss."""
    layers = [_embedding_layer(spec)]
    for i in range(spec.num_layers):
        layers.append(_decoder_layer(spec, len(layers), i))
    for depth in range(spec.mtp_layers):
        layers.append(_mtp_layer(spec, len(layers), depth))
    layers.append(_head_layer(spec, len(layers)))
    return ModelGraph(spec=spec, layers=tuple(layers))
