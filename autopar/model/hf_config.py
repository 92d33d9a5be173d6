"""Build a ModelSpec from a Hugging Face config.json, offline (the file only, never the hub).

Field names follow transformers' configuration classes for each supported model_type.
"""

from __future__ import annotations

from typing import Any, Callable

from autopar.errors import SchemaError, UnsupportedModelError
from autopar.limits import clip_repr
from autopar.schema.model import MLASpec, ModelSpec, MoESpec


def _whole(value: Any, key: str) -> Any:
    """value unchanged if it is a whole number (not a bool or float) or None; else a SchemaError."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise SchemaError(f"config.json '{key}' is {clip_repr(value)}; it must be a whole number")


def _get(cfg: dict, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return _whole(cfg[key], key)
    return default


def _require(cfg: dict, key: str, model_type: str) -> Any:
    if cfg.get(key) is None:
        raise SchemaError(f"config.json (model_type {model_type}) lacks '{key}'; add it or pass a complete config.json")
    return _whole(cfg[key], key)


def _flag(cfg: dict, key: str, default: bool) -> bool:
    """A true/false key (absent or null: `default`); anything else is a SchemaError."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SchemaError(f"config.json '{key}' is {clip_repr(value)}; it must be true or false")
    return value


def _rate(cfg: dict, key: str, default: float) -> float:
    """A dropout probability (absent or null: `default`), a finite number from 0 to 1."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise SchemaError(f"config.json '{key}' is {clip_repr(value)}; it must be a probability from 0 to 1")
    return value


def _common(cfg: dict, name: str, model_type: str) -> dict:
    heads = _require(cfg, "num_attention_heads", model_type)
    return dict(
        name=name, source=f"Hugging Face config.json (model_type {model_type})",
        num_layers=_require(cfg, "num_hidden_layers", model_type),
        hidden_size=_require(cfg, "hidden_size", model_type), num_attention_heads=heads,
        num_kv_heads=_get(cfg, "num_key_value_heads", default=heads), head_dim=_get(cfg, "head_dim"),
        ffn_hidden_size=_require(cfg, "intermediate_size", model_type),
        vocab_size=_require(cfg, "vocab_size", model_type),
        seq_length=min(_get(cfg, "max_position_embeddings", default=4096), 8192),
        tie_embeddings=_flag(cfg, "tie_word_embeddings", False),
    )


def _llama_like(cfg: dict, name: str, model_type: str) -> dict:
    kw = _common(cfg, name, model_type)
    bias = _flag(cfg, "attention_bias", model_type == "qwen2")
    kw.update(qkv_bias=bias, attn_out_bias=bias and model_type != "qwen2", mlp_bias=_flag(cfg, "mlp_bias", False),
              qk_norm=model_type in ("qwen3", "qwen3_moe"))
    return kw


def _mixtral(cfg: dict, name: str, model_type: str) -> dict:
    kw = _llama_like(cfg, name, model_type)
    kw["moe"] = MoESpec(num_experts=_require(cfg, "num_local_experts", model_type),
                        top_k=_require(cfg, "num_experts_per_tok", model_type),
                        expert_ffn_hidden_size=kw["ffn_hidden_size"])
    return kw


def _qwen3_moe(cfg: dict, name: str, model_type: str) -> dict:
    kw = _llama_like(cfg, name, model_type)
    if cfg.get("mlp_only_layers"):
        raise SchemaError("config.json: mlp_only_layers is not supported; describe the model as a YAML layer graph")
    kw["moe"] = MoESpec(num_experts=_require(cfg, "num_experts", model_type),
                        top_k=_require(cfg, "num_experts_per_tok", model_type),
                        expert_ffn_hidden_size=_require(cfg, "moe_intermediate_size", model_type),
                        layer_freq=_get(cfg, "decoder_sparse_step", default=1))
    return kw


def _deepseek_v3(cfg: dict, name: str, model_type: str) -> dict:
    kw = _common(cfg, name, model_type)
    kw["num_kv_heads"] = kw["num_attention_heads"]
    kw["head_dim"] = None
    kw["mtp_layers"] = _get(cfg, "num_nextn_predict_layers", default=0)
    kw["mla"] = MLASpec(q_lora_rank=_get(cfg, "q_lora_rank"), kv_lora_rank=_require(cfg, "kv_lora_rank", model_type),
                        qk_nope_head_dim=_require(cfg, "qk_nope_head_dim", model_type),
                        qk_rope_head_dim=_require(cfg, "qk_rope_head_dim", model_type),
                        v_head_dim=_require(cfg, "v_head_dim", model_type))
    shared = _get(cfg, "n_shared_experts", default=0)
    expert_ffn = _require(cfg, "moe_intermediate_size", model_type)
    kw["moe"] = MoESpec(num_experts=_require(cfg, "n_routed_experts", model_type),
                        top_k=_require(cfg, "num_experts_per_tok", model_type), expert_ffn_hidden_size=expert_ffn,
                        num_shared_experts=shared, shared_expert_ffn_hidden_size=expert_ffn if shared else 0,
                        first_k_dense=_get(cfg, "first_k_dense_replace", default=0),
                        layer_freq=_get(cfg, "moe_layer_freq", default=1))
    return kw


def _gpt2(cfg: dict, name: str, model_type: str) -> dict:
    h = _require(cfg, "n_embd", model_type)
    positions = _get(cfg, "n_positions", "n_ctx", default=1024)
    dropout = any(_rate(cfg, k, 0.1) > 0 for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop"))
    return dict(
        name=name, source=f"Hugging Face config.json (model_type {model_type})",
        num_layers=_require(cfg, "n_layer", model_type), hidden_size=h,
        num_attention_heads=_require(cfg, "n_head", model_type), ffn_hidden_size=_get(cfg, "n_inner") or 4 * h,
        vocab_size=_require(cfg, "vocab_size", model_type), seq_length=positions, max_position_embeddings=positions,
        activation="gelu", normalization="layernorm", position_embedding="learned",
        tie_embeddings=_flag(cfg, "tie_word_embeddings", True), qkv_bias=True, attn_out_bias=True, mlp_bias=True,
        dropout=dropout,
    )


def _gpt_neox(cfg: dict, name: str, model_type: str) -> dict:
    kw = _common(cfg, name, model_type)
    bias = _flag(cfg, "attention_bias", True)
    dropout = any(_rate(cfg, k, 0) > 0 for k in ("hidden_dropout", "attention_dropout", "hidden_dropout_prob"))
    kw.update(activation="gelu", normalization="layernorm", qkv_bias=bias, attn_out_bias=bias, mlp_bias=True,
              dropout=dropout, num_kv_heads=kw["num_attention_heads"])
    return kw


_MODEL_TYPE_TO_BUILDER: dict[str, Callable[[dict, str, str], dict]] = {
    "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like, "qwen3": _llama_like,
    "mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_MODEL_TYPE_TO_BUILDER)


def spec_from_hf_config(cfg: dict, name: str) -> ModelSpec:
    """ModelSpec from a parsed config.json dict. Raises UnsupportedModelError or SchemaError."""
    model_type = cfg.get("model_type")
    builder = _MODEL_TYPE_TO_BUILDER.get(model_type) if isinstance(model_type, str) else None
    if builder is None:
        raise UnsupportedModelError(
            f"config.json model_type {clip_repr(model_type)} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)} "
            "(or describe the model as a YAML layer graph, see examples/custom-decoder.yaml)"
        )
    return ModelSpec(**builder(cfg, name, model_type))
