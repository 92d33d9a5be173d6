"""Build a ModelSpec from a Hugging Face config.json, offline (the file only, never the hub).

Field names follow transformers' configuration classes for each supported model_type, in both
the transformers 4 and 5 spellings: RoPE as rope_theta + rope_scaling (4) or rope_parameters
(5, possibly keyed by layer type), experts as num_experts or num_local_experts, the rotary share
as rotary_pct or partial_rotary_factor, sliding windows as use_sliding_window or layer_types.
"""

from __future__ import annotations

from typing import Any, Callable

from autopar.errors import SchemaError, UnsupportedModelError
from autopar.limits import MAX_LAYERS, clip_repr
from autopar.model.mixers import split_hybrid_pattern
from autopar.schema.model import (IndexerSpec, LinearAttentionSpec, MambaSpec, MLASpec, ModelSpec, MoESpec,
                                  RopeScaling)


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


def _positive(cfg: dict, key: str, model_type: str, default: int | None = None) -> int:
    """An interval or step that must be at least 1 (0 would divide by zero or mean nothing)."""
    value = _get(cfg, key, default=default)
    if value is None:
        return _require(cfg, key, model_type)
    if value < 1:
        raise SchemaError(f"config.json (model_type {model_type}) '{key}' is {value}; it must be at least 1 "
                          "(1 = every layer)")
    return value


def _bounded_layers(kw: dict, model_type: str) -> int:
    """num_hidden_layers, refused above MAX_LAYERS before a per-layer list is built from it (a
    hostile 10**12 would otherwise hang the builders that expand intervals into layer lists)."""
    layers = kw["num_layers"]
    if not 1 <= layers <= MAX_LAYERS:
        raise SchemaError(f"config.json (model_type {model_type}) 'num_hidden_layers' is {clip_repr(layers)}; it must "
                          f"be from 1 to {MAX_LAYERS}")
    return layers


def _pattern_from_letters(cfg: dict, key: str, model_type: str, num_layers: int, allowed: str) -> str:
    value = cfg.get(key)
    if not isinstance(value, str):
        raise SchemaError(f"config.json (model_type {model_type}) lacks '{key}' as a string; add it")
    if len(value) != num_layers:
        raise SchemaError(f"config.json '{key}' has {len(value)} letters but num_hidden_layers is {num_layers}; "
                          "give one letter per layer")
    bad = sorted(set(value) - set(allowed))
    if bad:
        raise SchemaError(f"config.json '{key}' letter {clip_repr(bad[0])} (layer {value.index(bad[0])}) is not one "
                          f"of {' '.join(allowed)}; use one of them per layer")
    return value


def _nemotron_h(cfg: dict, name: str, model_type: str) -> dict:
    """Nemotron-H (HF models/nemotron_h): one block per layer of hybrid_override_pattern, M Mamba-2,
    * attention (no positional embedding), - squared-ReLU MLP, E MoE; every block pre-norm."""
    kw = _common(cfg, name, model_type)
    layers = kw["num_layers"]
    pattern = _pattern_from_letters(cfg, "hybrid_override_pattern", model_type, layers, "M*-E")
    layer_pattern, ffn_pattern = split_hybrid_pattern(pattern)
    kw.update(layer_pattern=layer_pattern, ffn_pattern=ffn_pattern,
              head_dim=_get(cfg, "attention_head_dim", "head_dim"),
              activation="relu2" if cfg.get("mlp_hidden_act", "relu2") == "relu2" else "gelu",
              mlp_bias=_flag(cfg, "mlp_bias", False), qkv_bias=_flag(cfg, "attention_bias", False),
              attn_out_bias=_flag(cfg, "attention_bias", False))
    kw["mamba"] = MambaSpec(num_heads=_require(cfg, "mamba_num_heads", model_type),
                            head_dim=_require(cfg, "mamba_head_dim", model_type),
                            state_size=_require(cfg, "ssm_state_size", model_type),
                            num_groups=_require(cfg, "n_groups", model_type),
                            conv_kernel=_get(cfg, "conv_kernel", default=4), chunk_size=_get(cfg, "chunk_size", default=128),
                            conv_bias=_flag(cfg, "use_conv_bias", True), proj_bias=_flag(cfg, "use_bias", False))
    if "E" in pattern:
        shared = _get(cfg, "n_shared_experts", default=0)
        kw["moe"] = MoESpec(num_experts=_require_any(cfg, ("n_routed_experts", "num_experts"), model_type),
                            top_k=_require(cfg, "num_experts_per_tok", model_type),
                            expert_ffn_hidden_size=_require(cfg, "moe_intermediate_size", model_type),
                            num_shared_experts=1 if shared else 0,
                            shared_expert_ffn_hidden_size=_get(cfg, "moe_shared_expert_intermediate_size", default=0)
                            if shared else 0, score_function="sigmoid", router_fp32=True)
    return kw


def _qwen3_next(cfg: dict, name: str, model_type: str) -> dict:
    """Qwen3-Next (HF models/qwen3_next): Gated DeltaNet layers with gated full attention on every
    full_attention_interval-th layer (or as layer_types lists them), 512-expert MoE with a gated
    shared expert, and the one MTP layer the checkpoint ships (mtp.*, beside num_hidden_layers)."""
    kw = _llama_like(cfg, name, model_type)
    layers = _bounded_layers(kw, model_type)
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers and "linear_attention" in types:
        full = [t == "full_attention" for t in types]
    else:
        interval = _positive(cfg, "full_attention_interval", model_type, default=4)
        full = [(i + 1) % interval == 0 for i in range(layers)]
    sparse = _positive(cfg, "decoder_sparse_step", model_type, default=1)
    dense_only = cfg.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense_only):
        raise SchemaError(f"config.json 'mlp_only_layers' must list layer indices from 0 to {layers - 1}")
    kw.update(layer_pattern="".join("A" if f else "G" for f in full),
              ffn_pattern="".join("D" if i in dense_only or (i + 1) % sparse else "E" for i in range(layers)),
              qk_norm=True, attention_output_gate=True, sliding_window=None,
              rotary_percent=_number(cfg, "partial_rotary_factor", default=1.0),
              mtp_layers=_get(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=1),
              mtp_source="the checkpoint's mtp.* weights (one layer; vLLM qwen3_next_mtp reads mtp_num_hidden_layers, "
                         "default 1)")
    kw["linear_attention"] = LinearAttentionSpec(
        kind="gated_deltanet", num_key_heads=_require(cfg, "linear_num_key_heads", model_type),
        num_value_heads=_require(cfg, "linear_num_value_heads", model_type),
        key_head_dim=_require(cfg, "linear_key_head_dim", model_type),
        value_head_dim=_require(cfg, "linear_value_head_dim", model_type),
        conv_kernel=_get(cfg, "linear_conv_kernel_dim", default=4))
    shared = _get(cfg, "shared_expert_intermediate_size", default=0)
    kw["moe"] = MoESpec(num_experts=_require_any(cfg, _NUM_EXPERTS, model_type),
                        top_k=_require(cfg, "num_experts_per_tok", model_type),
                        expert_ffn_hidden_size=_require(cfg, "moe_intermediate_size", model_type),
                        num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared,
                        shared_expert_gate=bool(shared), norm_topk_prob=_flag(cfg, "norm_topk_prob", True),
                        aux_loss_coeff=_number(cfg, "router_aux_loss_coef", default=0.0))
    return kw


def _one_based_layers(cfg: dict, key: str, layers: int) -> list[int]:
    value = cfg.get(key)
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= layers
                                              for i in value):
        raise SchemaError(f"config.json linear_attn_config '{key}' must list layer numbers from 1 to {layers}")
    return value


def _kimi_linear(cfg: dict, name: str, model_type: str) -> dict:
    """Kimi-Linear (HF models/kimi_linear): Kimi Delta Attention on linear_attn_config's kda_layers,
    MLA without RoPE (mla_use_nope) on its full_attn_layers (1-based), DeepSeek-style MoE."""
    kw = _deepseek_v3({**cfg, "n_routed_experts": _require_any(cfg, ("n_routed_experts", *_NUM_EXPERTS), model_type),
                       "num_experts_per_tok": _require_any(cfg, ("num_experts_per_tok", "num_experts_per_token"),
                                                           model_type),
                       "n_shared_experts": _get(cfg, "num_shared_experts", "n_shared_experts", default=0),
                       "n_group": _get(cfg, "num_expert_group", "n_group"),
                       "scoring_func": cfg.get("moe_router_activation_func", cfg.get("scoring_func", "sigmoid")),
                       "norm_topk_prob": _flag(cfg, "moe_renormalize", True)}, name, model_type)
    la = cfg.get("linear_attn_config")
    if not isinstance(la, dict):
        raise SchemaError("config.json (model_type kimi_linear) lacks 'linear_attn_config'; add it")
    layers = _bounded_layers(kw, model_type)
    kda, full = _one_based_layers(la, "kda_layers", layers), _one_based_layers(la, "full_attn_layers", layers)
    if sorted(kda + full) != list(range(1, layers + 1)):
        raise SchemaError(f"config.json linear_attn_config: kda_layers and full_attn_layers must list each of the "
                          f"{layers} layers once; fix the lists")
    nope = _flag(cfg, "mla_use_nope", False)
    kw["layer_pattern"] = "".join("K" if i + 1 in kda else ("N" if nope else "A") for i in range(layers))
    heads = _require(la, "num_heads", model_type)
    dim = _require(la, "head_dim", model_type)
    kw["linear_attention"] = LinearAttentionSpec(kind="kda", num_key_heads=heads, num_value_heads=heads,
                                                 key_head_dim=dim, value_head_dim=dim,
                                                 conv_kernel=_get(la, "short_conv_kernel_size", default=4))
    return kw


def _gpt_oss(cfg: dict, name: str, model_type: str) -> dict:
    """gpt-oss (HF models/gpt_oss): sliding-window and full attention as layer_types lists them,
    with attention sinks and biases; 128 experts with biased projections and a biased router."""
    kw = _common(cfg, name, model_type)
    layers = kw["num_layers"]
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != layers or \
            not all(t in ("sliding_attention", "full_attention") for t in types):
        raise SchemaError(f"config.json (model_type {model_type}) 'layer_types' must list sliding_attention or "
                          f"full_attention for each of the {layers} layers")
    window = _get(cfg, "sliding_window") if "sliding_attention" in types else None
    if "sliding_attention" in types and not window:
        raise SchemaError("config.json (model_type gpt_oss) lists sliding_attention layers but no 'sliding_window'; add it")
    bias = _flag(cfg, "attention_bias", True)
    kw.update(layer_pattern="".join("W" if t == "sliding_attention" else "A" for t in types), sliding_window=window,
              qkv_bias=bias, attn_out_bias=bias, attention_sinks=True)
    kw["moe"] = MoESpec(num_experts=_require_any(cfg, _NUM_EXPERTS, model_type),
                        top_k=_require_any(cfg, ("num_experts_per_tok", "experts_per_token"), model_type),
                        expert_ffn_hidden_size=kw["ffn_hidden_size"], expert_mlp_bias=True, router_bias=True,
                        aux_loss_coeff=_number(cfg, "router_aux_loss_coef", default=0.0))
    return kw


def _llama4(cfg: dict, name: str, model_type: str) -> dict:
    """Llama 4 text model (HF models/llama4 Llama4TextConfig): MoE on every
    interleave_moe_layer_step-th layer (moe_layers = step-1, 2·step-1, ...) with one shared expert
    and a sigmoid top-k router; a NoPE layer every no_rope_layer_interval-th, full attention, and
    chunked attention (attention_chunk_size) on the RoPE layers; dense layers intermediate_size_mlp
    wide. A Llama4ForConditionalGeneration config is read through its text_config."""
    text = cfg.get("text_config") if model_type == "llama4" else cfg
    if not isinstance(text, dict):
        raise SchemaError("config.json (model_type llama4) lacks 'text_config'; pass the text model's config")
    kw = _common(text, name, model_type)
    layers = _bounded_layers(kw, model_type)
    if isinstance(text.get("moe_layers"), list):
        moe_layers = set(_one_based_layers({"moe_layers": [i + 1 for i in text["moe_layers"]]}, "moe_layers", layers))
        moe_layers = {i - 1 for i in moe_layers}
    else:
        step = _positive(text, "interleave_moe_layer_step", model_type, default=1)
        moe_layers = set(range(step - 1, layers, step))
    rope = text.get("no_rope_layers")
    if not (isinstance(rope, list) and len(rope) == layers):
        interval = _positive(text, "no_rope_layer_interval", model_type, default=4)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    chunk = _get(text, "attention_chunk_size")
    expert_ffn = _require(text, "intermediate_size", model_type)
    kw.update(layer_pattern="".join(("C" if chunk else "A") if r else "N" for r in rope),
              ffn_pattern="".join("E" if i in moe_layers else "D" for i in range(layers)),
              ffn_hidden_size=_get(text, "intermediate_size_mlp", default=expert_ffn), attention_chunk_size=chunk,
              qkv_bias=_flag(text, "attention_bias", False), attn_out_bias=_flag(text, "attention_bias", False))
    kw["moe"] = MoESpec(num_experts=_require_any(text, _NUM_EXPERTS, model_type),
                        top_k=_require(text, "num_experts_per_tok", model_type), expert_ffn_hidden_size=expert_ffn,
                        num_shared_experts=1, shared_expert_ffn_hidden_size=expert_ffn, score_function="sigmoid",
                        norm_topk_prob=False, aux_loss_coeff=_number(text, "router_aux_loss_coef", default=0.0))
    return kw


def _deepseek_v32(cfg: dict, name: str, model_type: str) -> dict:
    """DeepSeek-V3.2 (HF models/deepseek_v32): DeepSeek-V3 with the DSA lightning indexer on every
    layer (index_n_heads, index_head_dim, index_topk)."""
    kw = _deepseek_v3(cfg, name, model_type)
    kw["indexer"] = IndexerSpec(num_heads=_require(cfg, "index_n_heads", model_type),
                                head_dim=_require(cfg, "index_head_dim", model_type),
                                top_k=_require(cfg, "index_topk", model_type))
    return kw


_MODEL_TYPE_TO_BUILDER: dict[str, Callable[[dict, str, str], dict]] = {
    "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like, "qwen3": _llama_like,
    "mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox,
    "nemotron_h": _nemotron_h, "qwen3_next": _qwen3_next, "kimi_linear": _kimi_linear, "gpt_oss": _gpt_oss,
    "llama4": _llama4, "llama4_text": _llama4, "kimi_k2": _deepseek_v3, "deepseek_v32": _deepseek_v32,
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
