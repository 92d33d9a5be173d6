"""Build a ModelSpec from a Hugging Face config.json, offline (the file only, never the hub).

Field names follow transformers' configuration classes for each supported model_type, in both
the transformers 4 and 5 spellings: RoPE as rope_theta + rope_scaling (4) or rope_parameters
(5, possibly keyed by layer type), experts as num_experts or num_local_experts, the rotary share
as rotary_pct or partial_rotary_factor, sliding windows as use_sliding_window or layer_types.
"""

from __future__ import annotations

from typing import Any, Callable

from autopar.errors import SchemaError, UnsupportedModelError
from autopar.limits import clip_repr
from autopar.schema.model import MLASpec, ModelSpec, MoESpec, RopeScaling


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


def _number(cfg: dict, *keys: str, default: float | None = None) -> float | None:
    """The first present key as a float (a finite, non-boolean number); else a SchemaError."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or \
                value in (float("inf"), float("-inf")):
            raise SchemaError(f"config.json '{key}' is {clip_repr(value)}; it must be a number")
        return float(value)
    return default


def _require_any(cfg: dict, keys: tuple[str, ...], model_type: str) -> Any:
    value = _get(cfg, *keys)
    if value is None:
        raise SchemaError(f"config.json (model_type {model_type}) lacks '{keys[0]}' (or {', '.join(keys[1:])}); "
                          "add it or pass a complete config.json")
    return value


def config_name(cfg: dict) -> str:
    """A config's model name: its _name_or_path, else its architecture class, else its model_type
    (never the folder it sits in, which is often a checkout or cache hash)."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    for name in (cfg.get("_name_or_path"), arch, cfg.get("model_type")):
        if isinstance(name, str) and name.strip():
            return name.strip()
    return "hf-model"


def _rope_parameters(cfg: dict) -> dict:
    """The RoPE settings as one flat dict (rope_theta, rope_type, factor, ...): transformers 5's
    rope_parameters (for the full-attention layers when keyed by layer type) or 4's rope_theta +
    rope_scaling."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))
    out = dict(params) if isinstance(params, dict) else {}
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        out = {**scaling, **out}
    if cfg.get("rope_theta") is not None:
        out.setdefault("rope_theta", cfg["rope_theta"])
    if out.get("rope_type") is None and out.get("type") is not None:
        out["rope_type"] = out["type"]
    return out


def _rope_kwargs(cfg: dict, model_type: str, default_theta: float = 10000.0) -> dict:
    """rope_theta and rope_scaling of the spec; unsupported scaling types are refused."""
    rp = _rope_parameters(cfg)
    kw: dict[str, Any] = {"rope_theta": _number(rp, "rope_theta", default=default_theta)}
    rope_type = rp.get("rope_type") or "default"
    if rope_type == "default" or (rope_type == "linear" and _number(rp, "factor", default=1.0) == 1.0):
        return kw
    if rope_type not in ("llama3", "yarn"):
        raise SchemaError(f"config.json (model_type {model_type}): RoPE scaling {clip_repr(rope_type)} is not "
                          "supported (llama3 and yarn are); remove rope_scaling or describe the model as a YAML "
                          "layer graph")
    orig = _get(rp, "original_max_position_embeddings", default=_get(cfg, "max_position_embeddings"))
    if orig is None:
        raise SchemaError(f"config.json (model_type {model_type}): {rope_type} RoPE scaling lacks "
                          "'original_max_position_embeddings'; add it")
    factor = _number(rp, "factor")
    if factor is None:
        raise SchemaError(f"config.json (model_type {model_type}) lacks 'factor' in its {rope_type} RoPE scaling; "
                          "add it")
    fields = ("low_freq_factor", "high_freq_factor") if rope_type == "llama3" else \
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")
    extra = {k: _number(rp, k) for k in fields if rp.get(k) is not None}
    kw["rope_scaling"] = RopeScaling(type=rope_type, factor=factor, original_max_position_embeddings=orig, **extra)
    return kw


def _sliding_window(cfg: dict, model_type: str, num_layers: int) -> int | None:
    """The attention window when every layer slides (Mistral; Qwen with use_sliding_window and
    max_window_layers 0); None for full attention; mixed per-layer windows are refused."""
    window = _get(cfg, "sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        sliding = [t == "sliding_attention" for t in types]
    elif model_type in ("qwen2", "qwen3", "qwen3_moe"):
        if not _flag(cfg, "use_sliding_window", False):
            return None
        first = _get(cfg, "max_window_layers", default=num_layers)  # layers i >= max_window_layers slide
        sliding = [i >= first for i in range(num_layers)]
    else:
        return window or None
    if not any(sliding) or not window:
        return None
    if not all(sliding):
        raise SchemaError(f"config.json (model_type {model_type}): sliding-window attention on {sum(sliding)} of "
                          f"{len(sliding)} layers is not supported (one window for every layer is); describe the "
                          "model as a YAML layer graph")
    return window


# transformers' configuration-class defaults where config.json omits the epsilon
_DEFAULT_NORM_EPS = {"mixtral": 1e-5, "gpt_neox": 1e-5, "gpt2": 1e-5}


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
        max_position_embeddings=_get(cfg, "max_position_embeddings"),  # the context it was trained for, kept
        tie_embeddings=_flag(cfg, "tie_word_embeddings", False),
        norm_epsilon=_number(cfg, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                             default=_DEFAULT_NORM_EPS.get(model_type, 1e-6)),
        **_rope_kwargs(cfg, model_type),
    )


def _llama_like(cfg: dict, name: str, model_type: str) -> dict:
    kw = _common(cfg, name, model_type)
    bias = _flag(cfg, "attention_bias", model_type == "qwen2")
    kw.update(qkv_bias=bias, attn_out_bias=bias and model_type != "qwen2", mlp_bias=_flag(cfg, "mlp_bias", False),
              qk_norm=model_type in ("qwen3", "qwen3_moe"),
              sliding_window=_sliding_window(cfg, model_type, kw["num_layers"]))
    return kw


_NUM_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")  # transformers 4/5 spellings


def _mixtral(cfg: dict, name: str, model_type: str) -> dict:
    kw = _llama_like(cfg, name, model_type)
    kw["moe"] = MoESpec(num_experts=_require_any(cfg, _NUM_EXPERTS, model_type),
                        top_k=_require(cfg, "num_experts_per_tok", model_type),
                        expert_ffn_hidden_size=kw["ffn_hidden_size"],
                        aux_loss_coeff=_number(cfg, "router_aux_loss_coef", default=0.0))
    return kw


def _qwen3_moe(cfg: dict, name: str, model_type: str) -> dict:
    kw = _llama_like(cfg, name, model_type)
    if cfg.get("mlp_only_layers"):
        raise SchemaError("config.json: mlp_only_layers is not supported; describe the model as a YAML layer graph")
    kw["moe"] = MoESpec(num_experts=_require_any(cfg, _NUM_EXPERTS, model_type),
                        top_k=_require(cfg, "num_experts_per_tok", model_type),
                        expert_ffn_hidden_size=_require(cfg, "moe_intermediate_size", model_type),
                        layer_freq=_get(cfg, "decoder_sparse_step", default=1),
                        norm_topk_prob=_flag(cfg, "norm_topk_prob", False),
                        aux_loss_coeff=_number(cfg, "router_aux_loss_coef", default=0.0))
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
                        layer_freq=_get(cfg, "moe_layer_freq", default=1), **_deepseek_router(cfg, model_type))
    return kw


def _deepseek_router(cfg: dict, model_type: str) -> dict:
    """DeepSeek-V3's gate (modeling_deepseek.MoEGate): sigmoid scores in fp32, an e_score_correction
    bias under topk_method noaux_tc, n_group/topk_group group-limited routing, routed_scaling_factor,
    and a sequence-wise balance loss aux_loss_alpha when seq_aux."""
    score = cfg.get("scoring_func", "sigmoid")
    if score not in ("softmax", "sigmoid"):
        raise SchemaError(f"config.json (model_type {model_type}): scoring_func {clip_repr(score)} is not supported "
                          "(softmax and sigmoid are)")
    groups, group_topk = _get(cfg, "n_group"), _get(cfg, "topk_group")
    grouped = groups is not None and group_topk is not None and groups > 1
    return dict(score_function=score, norm_topk_prob=_flag(cfg, "norm_topk_prob", True),
                expert_bias=cfg.get("topk_method", "noaux_tc") == "noaux_tc",
                num_groups=groups if grouped else None, group_topk=group_topk if grouped else None,
                routed_scaling_factor=_number(cfg, "routed_scaling_factor", default=1.0),
                aux_loss_coeff=_number(cfg, "aux_loss_alpha", "router_aux_loss_coef", default=0.0),
                aux_loss_per_sequence=_flag(cfg, "seq_aux", False), router_fp32=True)


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
        dropout=dropout, norm_epsilon=_number(cfg, "layer_norm_epsilon", default=1e-5),
    )


def _gpt_neox(cfg: dict, name: str, model_type: str) -> dict:
    kw = _common(cfg, name, model_type)
    bias = _flag(cfg, "attention_bias", True)
    dropout = any(_rate(cfg, k, 0) > 0 for k in ("hidden_dropout", "attention_dropout", "hidden_dropout_prob"))
    rp = _rope_parameters(cfg)
    kw.update(activation="gelu", normalization="layernorm", qkv_bias=bias, attn_out_bias=bias, mlp_bias=True,
              dropout=dropout, num_kv_heads=kw["num_attention_heads"],
              rope_theta=_number(rp, "rope_theta", default=_number(cfg, "rotary_emb_base", default=10000.0)),
              rotary_percent=_number(cfg, "rotary_pct", "partial_rotary_factor",
                                     default=_number(rp, "partial_rotary_factor", default=1.0)))
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
