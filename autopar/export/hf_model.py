"""The model as a Hugging Face config.json (transformers 4 spelling), for frameworks whose config
has no model section: a DeepSpeed training script builds the model with
`AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(<folder>))`.

The inverse of autopar.model.hf_config: spec_from_hf_config(hf_config_from_spec(s)) == s for
every spec some accepted model_type describes; other specs are refused with the reason.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import ExportError
from autopar.schema.model import ModelSpec

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                  "deepseek_v3": "DeepseekV3ForCausalLM", "gpt2": "GPT2LMHeadModel",
                  "gpt_neox": "GPTNeoXForCausalLM"}


def model_type_of(spec: ModelSpec) -> str:
    """The transformers model_type whose modeling code has the spec's architecture."""
    if spec.position_embedding == "learned":
        return "gpt2"
    if spec.normalization == "layernorm":
        return "gpt_neox"
    if spec.mla is not None:
        return "deepseek_v3"
    if spec.moe is not None:
        return "qwen3_moe" if spec.qk_norm else "mixtral"
    if spec.qk_norm:
        return "qwen3"
    if spec.qkv_bias and not spec.attn_out_bias:
        return "qwen2"
    return "mistral" if spec.sliding_window else "llama"


def _rope(spec: ModelSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_theta": spec.rope_theta}
    sc = spec.rope_scaling
    if sc is not None:
        fields = ("low_freq_factor", "high_freq_factor") if sc.type == "llama3" else \
            ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")
        out["rope_scaling"] = {"rope_type": sc.type, "factor": sc.factor,
                               "original_max_position_embeddings": sc.original_max_position_embeddings,
                               **{k: getattr(sc, k) for k in fields}}
    return out


def _decoder(spec: ModelSpec, model_type: str) -> dict[str, Any]:
    out = {"num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
           "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.kv_heads,
           "intermediate_size": spec.ffn_hidden_size, "vocab_size": spec.vocab_size,
           "max_position_embeddings": max(spec.max_position_embeddings or spec.seq_length, spec.seq_length),
           "rms_norm_eps": spec.norm_epsilon, "tie_word_embeddings": spec.tie_embeddings, "hidden_act": "silu",
           **_rope(spec)}
    if spec.head_dim is not None:
        out["head_dim"] = spec.head_dim
    if model_type in ("llama", "mistral", "mixtral", "qwen3", "qwen3_moe"):
        out["attention_bias"] = spec.qkv_bias
    if model_type == "llama":
        out["mlp_bias"] = spec.mlp_bias
    if model_type in ("mistral", "mixtral"):
        out["sliding_window"] = spec.sliding_window
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        out |= {"use_sliding_window": spec.sliding_window is not None, "sliding_window": spec.sliding_window,
                "max_window_layers": 0 if spec.sliding_window else spec.num_layers}
    return out


def _moe(spec: ModelSpec, model_type: str) -> dict[str, Any]:
    moe = spec.moe
    if model_type == "mixtral":
        return {"num_local_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "router_aux_loss_coef": moe.aux_loss_coeff}
    if model_type == "qwen3_moe":
        return {"num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "moe_intermediate_size": moe.expert_ffn_hidden_size, "decoder_sparse_step": moe.layer_freq,
                "norm_topk_prob": moe.norm_topk_prob, "router_aux_loss_coef": moe.aux_loss_coeff,
                "mlp_only_layers": []}
    return {"n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": moe.expert_ffn_hidden_size, "n_shared_experts": moe.num_shared_experts or None,
            "first_k_dense_replace": moe.first_k_dense, "moe_layer_freq": moe.layer_freq,
            "scoring_func": moe.score_function, "norm_topk_prob": moe.norm_topk_prob,
            "topk_method": "noaux_tc" if moe.expert_bias else "greedy",
            "n_group": moe.num_groups or 1, "topk_group": moe.group_topk or 1,
            "routed_scaling_factor": moe.routed_scaling_factor, "aux_loss_alpha": moe.aux_loss_coeff,
            "seq_aux": moe.aux_loss_per_sequence}


_ARCHITECTURES_2026 = {"nemotron_h": "NemotronHForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
                       "kimi_linear": "KimiLinearForCausalLM", "gpt_oss": "GptOssForCausalLM",
                       "llama4_text": "Llama4ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM"}


def model_type_2026(spec: ModelSpec) -> str | None:
    """The model_type of the 2025-26 families (HF transformers 5 has each): None for the others."""
    letters = set(spec.layer_pattern or "")
    if "M" in letters:
        return "nemotron_h"
    if "G" in letters:
        return "qwen3_next"
    if "K" in letters:
        return "kimi_linear"
    if spec.attention_sinks:
        return "gpt_oss"
    if spec.indexer is not None:
        return "deepseek_v32"
    if spec.attention_chunk_size is not None or "N" in letters and spec.mla is None:
        return "llama4_text"
    return None


def _config_2026(spec: ModelSpec, model_type: str) -> dict[str, Any]:
    """config.json keys of a 2025-26 family, the inverse of its builder in autopar.model.hf_config."""
    from autopar.model.mixers import hybrid_pattern

    n, moe = spec.num_layers, spec.moe
    if model_type == "nemotron_h":
        m = spec.mamba
        cfg = _decoder(spec, model_type)
        cfg |= {"hybrid_override_pattern": hybrid_pattern(spec.layer_pattern, spec.ffn_pattern or "D" * n) or "",
                "attention_head_dim": cfg.pop("head_dim", spec.head_size), "mlp_hidden_act": spec.activation,
                "mamba_num_heads": m.num_heads, "mamba_head_dim": m.head_dim, "ssm_state_size": m.state_size,
                "n_groups": m.num_groups, "conv_kernel": m.conv_kernel, "chunk_size": m.chunk_size,
                "use_conv_bias": m.conv_bias, "use_bias": m.proj_bias, "mlp_bias": spec.mlp_bias,
                "attention_bias": spec.qkv_bias}
        cfg.pop("rope_theta", None)
        if moe is not None:
            cfg |= {"n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                    "moe_intermediate_size": moe.expert_ffn_hidden_size, "n_shared_experts": moe.num_shared_experts,
                    "moe_shared_expert_intermediate_size": moe.shared_expert_ffn_hidden_size}
        return cfg
    if model_type == "qwen3_next":
        la = spec.linear_attention
        cfg = _decoder(spec, model_type)
        cfg |= {"layer_types": ["linear_attention" if c == "G" else "full_attention" for c in spec.layer_pattern],
                "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads,
                "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
                "linear_conv_kernel_dim": la.conv_kernel, "partial_rotary_factor": spec.rotary_percent,
                "num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "moe_intermediate_size": moe.expert_ffn_hidden_size, "norm_topk_prob": moe.norm_topk_prob,
                "shared_expert_intermediate_size": moe.shared_expert_ffn_hidden_size, "decoder_sparse_step": 1,
                "mlp_only_layers": [i for i in range(n) if spec.ffn_of(i) == "D"],
                "router_aux_loss_coef": moe.aux_loss_coeff, "mtp_num_hidden_layers": spec.mtp_layers}
        return cfg
    if model_type == "gpt_oss":
        cfg = _decoder(spec, model_type)
        cfg |= {"layer_types": ["sliding_attention" if c == "W" else "full_attention" for c in spec.layer_pattern],
                "sliding_window": spec.sliding_window, "attention_bias": spec.qkv_bias,
                "num_local_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "router_aux_loss_coef": moe.aux_loss_coeff}
        return cfg
    if model_type == "llama4_text":
        cfg = _decoder(spec, model_type)
        cfg |= {"intermediate_size": moe.expert_ffn_hidden_size, "intermediate_size_mlp": spec.ffn_hidden_size,
                "moe_layers": [i for i in range(n) if spec.ffn_of(i) == "E"],
                "no_rope_layers": [int(c != "N") for c in spec.layer_pattern],
                "attention_chunk_size": spec.attention_chunk_size, "attention_bias": spec.qkv_bias,
                "num_local_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "router_aux_loss_coef": moe.aux_loss_coeff}
        return cfg
    cfg = _decoder(spec, model_type) | _mla_keys(spec) | _moe(spec, "deepseek_v3")
    cfg.pop("head_dim", None)
    if model_type == "deepseek_v32":
        ix = spec.indexer
        return cfg | {"index_n_heads": ix.num_heads, "index_head_dim": ix.head_dim, "index_topk": ix.top_k}
    kda, la = [i + 1 for i in range(n) if spec.layer_pattern[i] == "K"], spec.linear_attention
    return cfg | {"linear_attn_config": {"kda_layers": kda, "full_attn_layers": [i + 1 for i in range(n)
                                                                                 if i + 1 not in kda],
                                         "num_heads": la.num_key_heads, "head_dim": la.key_head_dim,
                                         "short_conv_kernel_size": la.conv_kernel},
                  "mla_use_nope": "N" in spec.layer_pattern, "moe_router_activation_func": moe.score_function,
                  "moe_renormalize": moe.norm_topk_prob, "num_shared_experts": moe.num_shared_experts}


def _mla_keys(spec: ModelSpec) -> dict[str, Any]:
    mla = spec.mla
    return {"q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank, "qk_nope_head_dim": mla.qk_nope_head_dim,
            "qk_rope_head_dim": mla.qk_rope_head_dim, "v_head_dim": mla.v_head_dim,
            "num_nextn_predict_layers": spec.mtp_layers}


def hf_config_from_spec(spec: ModelSpec) -> dict[str, Any]:
    """config.json keys of the spec's model_type, or ExportError when no model_type has its
    architecture (checked by reading the result back)."""
    from autopar.model.hf_config import spec_from_hf_config

    new = model_type_2026(spec)
    model_type = new or model_type_of(spec)
    cfg: dict[str, Any] = {"architectures": [(_ARCHITECTURES_2026 if new else _ARCHITECTURES)[model_type]],
                           "model_type": model_type, "_name_or_path": spec.name}
    if new:
        cfg |= _config_2026(spec, model_type)
    elif model_type == "gpt2":
        cfg |= {"n_layer": spec.num_layers, "n_embd": spec.hidden_size, "n_head": spec.num_attention_heads,
                "n_inner": spec.ffn_hidden_size, "vocab_size": spec.vocab_size,
                "n_positions": spec.max_position_embeddings or spec.seq_length,
                "layer_norm_epsilon": spec.norm_epsilon, "tie_word_embeddings": spec.tie_embeddings}
        cfg |= {k: 0.1 if spec.dropout else 0.0 for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop")}
    elif model_type == "gpt_neox":
        cfg |= _decoder(spec, model_type)
        cfg |= {"layer_norm_eps": cfg.pop("rms_norm_eps"), "rotary_emb_base": cfg.pop("rope_theta"),
                "rotary_pct": spec.rotary_percent, "attention_bias": spec.qkv_bias, "hidden_act": "gelu",
                "hidden_dropout": 0.1 if spec.dropout else 0.0, "attention_dropout": 0.1 if spec.dropout else 0.0}
    else:
        cfg |= _decoder(spec, model_type)
        if model_type == "deepseek_v3":
            mla = spec.mla
            cfg |= {"q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
                    "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
                    "v_head_dim": mla.v_head_dim, "num_nextn_predict_layers": spec.mtp_layers}
            cfg.pop("head_dim", None)
        if spec.moe is not None:
            cfg |= _moe(spec, model_type)
    back = spec_from_hf_config(cfg, spec.name)
    fields = set(ModelSpec.model_fields) - {"source", "seq_length", "max_position_embeddings"}
    differ = sorted(f for f in fields if getattr(back, f) != getattr(spec, f))
    if differ:
        raise ExportError(f"no Hugging Face model_type describes {spec.name} ({model_type} differs in "
                          f"{', '.join(differ)}); describe the model in the training script yourself")
    return cfg
