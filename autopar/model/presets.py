"""Named architectures. Each names the paper table or config.json its numbers come from."""

from __future__ import annotations

from typing import Any, TypeVar

from autopar.model.mixers import split_hybrid_pattern
from autopar.schema.model import IndexerSpec, LinearAttentionSpec, MambaSpec, MLASpec, ModelSpec, MoESpec, RopeScaling
from autopar.schema.plain import build

M = TypeVar("M", ModelSpec, MoESpec, MLASpec, RopeScaling, MambaSpec, LinearAttentionSpec, IndexerSpec)


def _checked(cls: type[M], **fields: Any) -> M:
    """cls(**fields), checked in plain Python where the schema allows (autopar.schema.plain): the
    same object, without building Pydantic's validator on the `plan` path (issue 15)."""
    return build(cls, fields)


_SC21 = "Narayanan et al. SC'21 Table 1 (V=51200, s=2048, 4h FFN)"


def _megatron_gpt(name: str, layers: int, hidden: int, heads: int, source: str = _SC21) -> ModelSpec:
    """Megatron GPT: GeLU 4h FFN, LayerNorm, learned positions, tied embeddings, biases, dropout."""
    return _checked(ModelSpec,
        name=name, source=source, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        ffn_hidden_size=4 * hidden, vocab_size=51200, seq_length=2048, activation="gelu",
        normalization="layernorm", position_embedding="learned", tie_embeddings=True, qkv_bias=True,
        attn_out_bias=True, mlp_bias=True, dropout=True, norm_epsilon=1e-5,
    )


# Llama 3.1's rope_scaling (config.json of every Llama-3.1 size)
LLAMA31_ROPE = _checked(RopeScaling, type="llama3", factor=8.0, original_max_position_embeddings=8192,
                        low_freq_factor=1.0, high_freq_factor=4.0)


def _llama(name: str, source: str, layers: int, hidden: int, heads: int, kv: int, ffn: int,
           vocab: int = 128256, seq: int = 8192, rope_scaling: RopeScaling | None = None) -> ModelSpec:
    """Llama 3 / 3.1: rope_theta 500000, rms_norm_eps 1e-5, untied embeddings."""
    return _checked(ModelSpec,
        name=name, source=source, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq, rope_theta=500000.0,
        norm_epsilon=1e-5, rope_scaling=rope_scaling,
        max_position_embeddings=131072 if rope_scaling else 8192,
    )


def _mixtral(name: str, source: str, layers: int, hidden: int, heads: int, ffn: int, vocab: int,
             aux_loss_coeff: float) -> ModelSpec:
    """Mixtral: rope_theta 1e6, rms_norm_eps 1e-5, no sliding window, router_aux_loss_coef per size."""
    return _checked(ModelSpec,
        name=name, source=source, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=8, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=4096, rope_theta=1e6, norm_epsilon=1e-5,
        moe=_checked(MoESpec, num_experts=8, top_k=2, expert_ffn_hidden_size=ffn, aux_loss_coeff=aux_loss_coeff),
    )


def _qwen3_moe(name: str, source: str, layers: int, hidden: int, heads: int, ffn: int, expert_ffn: int) -> ModelSpec:
    return _checked(ModelSpec,
        name=name, source=source, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=4, head_dim=128, ffn_hidden_size=ffn, vocab_size=151936, seq_length=4096, qk_norm=True,
        rope_theta=1e6, norm_epsilon=1e-6,
        moe=_checked(MoESpec, num_experts=128, top_k=8, expert_ffn_hidden_size=expert_ffn, norm_topk_prob=True,
                     aux_loss_coeff=0.001),
    )


def _deepseek_v3() -> ModelSpec:
    return _checked(ModelSpec,
        name="deepseek-v3", source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 report (arXiv 2412.19437)",
        num_layers=61, hidden_size=7168, num_attention_heads=128, ffn_hidden_size=18432,
        vocab_size=129280, seq_length=4096, mtp_layers=1, rope_theta=10000.0, norm_epsilon=1e-6,
        max_position_embeddings=163840,
        rope_scaling=_checked(RopeScaling, type="yarn", factor=40.0, original_max_position_embeddings=4096,
                              beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
        mla=_checked(MLASpec, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                     v_head_dim=128),
        moe=_checked(MoESpec, num_experts=256, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1,
                     shared_expert_ffn_hidden_size=2048, first_k_dense=3, score_function="sigmoid",
                     expert_bias=True, num_groups=8, group_topk=4, routed_scaling_factor=2.5, aux_loss_coeff=0.001,
                     aux_loss_per_sequence=True, router_fp32=True),
    )

# ---- 2025-26 architectures: each equals spec_from_hf_config of its published config.json
# (tests/test_model_2026.py, fixtures in tests/fixtures/hf) but for its name and source.

NEMOTRON_H_56B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-" \
                         "M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def _nemotron_h_56b() -> ModelSpec:
    layer_pattern, ffn_pattern = split_hybrid_pattern(NEMOTRON_H_56B_PATTERN)
    return _checked(ModelSpec,
        name="nemotron-h-56b", source="nvidia/Nemotron-H-56B-Base-8K config.json (hybrid_override_pattern)",
        num_layers=118, hidden_size=8192, num_attention_heads=64, num_kv_heads=8, head_dim=128, ffn_hidden_size=32768,
        vocab_size=131072, seq_length=8192, max_position_embeddings=8192, activation="relu2",
        layer_pattern=layer_pattern, ffn_pattern=ffn_pattern,
        mamba=_checked(MambaSpec, num_heads=256, head_dim=64, state_size=256, num_groups=8, conv_kernel=4,
                       chunk_size=128))


def _qwen3_next_80b_a3b() -> ModelSpec:
    return _checked(ModelSpec,
        name="qwen3-next-80b-a3b",
        source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json (full_attention_interval 4); MTP: the checkpoint's mtp.* layer",
        num_layers=48, hidden_size=2048, num_attention_heads=16, num_kv_heads=2, head_dim=256, ffn_hidden_size=5120,
        vocab_size=151936, seq_length=8192, max_position_embeddings=262144, rope_theta=10000000.0, rotary_percent=0.25,
        norm_epsilon=1e-06, qk_norm=True, attention_output_gate=True, mtp_layers=1,
        mtp_source="the checkpoint's mtp.* weights (one layer; vLLM qwen3_next_mtp reads mtp_num_hidden_layers, "
                   "default 1)",
        layer_pattern="GGGA" * 12, ffn_pattern="E" * 48,
        linear_attention=_checked(LinearAttentionSpec, kind="gated_deltanet", num_key_heads=16, num_value_heads=32,
                                  key_head_dim=128, value_head_dim=128, conv_kernel=4),
        moe=_checked(MoESpec, num_experts=512, top_k=10, expert_ffn_hidden_size=512, num_shared_experts=1,
                     shared_expert_ffn_hidden_size=512, shared_expert_gate=True, aux_loss_coeff=0.001))


def _kimi_linear_48b_a3b() -> ModelSpec:
    return _checked(ModelSpec,
        name="kimi-linear-48b-a3b", source="moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (linear_attn_config)",
        num_layers=27, hidden_size=2304, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=9216,
        vocab_size=163840, seq_length=4096, layer_pattern="KKKN" * 6 + "KKN",
        mla=_checked(MLASpec, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
        linear_attention=_checked(LinearAttentionSpec, kind="kda", num_key_heads=32, num_value_heads=32,
                                  key_head_dim=128, value_head_dim=128, conv_kernel=4),
        moe=_checked(MoESpec, num_experts=256, top_k=8, expert_ffn_hidden_size=1024, num_shared_experts=1,
                     shared_expert_ffn_hidden_size=1024, first_k_dense=1, score_function="sigmoid", expert_bias=True,
                     routed_scaling_factor=2.446, router_fp32=True))


def _gpt_oss_120b() -> ModelSpec:
    return _checked(ModelSpec,
        name="gpt-oss-120b", source="openai/gpt-oss-120b config.json (layer_types, sinks; experts counted unquantised)",
        num_layers=36, hidden_size=2880, num_attention_heads=64, num_kv_heads=8, head_dim=64, ffn_hidden_size=2880,
        vocab_size=201088, seq_length=8192, max_position_embeddings=131072, rope_theta=150000.0,
        rope_scaling=_checked(RopeScaling, type="yarn", factor=32.0, original_max_position_embeddings=4096),
        sliding_window=128, qkv_bias=True, attn_out_bias=True, attention_sinks=True, layer_pattern="WA" * 18,
        moe=_checked(MoESpec, num_experts=128, top_k=4, expert_ffn_hidden_size=2880, aux_loss_coeff=0.9,
                     expert_mlp_bias=True, router_bias=True))


def _llama4_maverick() -> ModelSpec:
    return _checked(ModelSpec,
        name="llama4-maverick-17b-128e",
        source="meta-llama/Llama-4-Maverick-17B-128E-Instruct config.json text_config (interleave_moe_layer_step 2)",
        num_layers=48, hidden_size=5120, num_attention_heads=40, num_kv_heads=8, head_dim=128, ffn_hidden_size=16384,
        vocab_size=202048, seq_length=8192, max_position_embeddings=1048576, rope_theta=500000.0,
        layer_pattern="CCCN" * 12, ffn_pattern="DE" * 24, attention_chunk_size=8192,
        moe=_checked(MoESpec, num_experts=128, top_k=1, expert_ffn_hidden_size=8192, num_shared_experts=1,
                     shared_expert_ffn_hidden_size=8192, score_function="sigmoid", norm_topk_prob=False,
                     aux_loss_coeff=0.001))


def _kimi_k2() -> ModelSpec:
    return _checked(ModelSpec,
        name="kimi-k2", source="moonshotai/Kimi-K2-Instruct-0905 config.json (DeepseekV3 architecture, 384 experts)",
        num_layers=61, hidden_size=7168, num_attention_heads=64, num_kv_heads=64, ffn_hidden_size=18432,
        vocab_size=163840, seq_length=8192, max_position_embeddings=262144, rope_theta=50000.0, norm_epsilon=1e-06,
        rope_scaling=_checked(RopeScaling, type="yarn", factor=64.0, original_max_position_embeddings=4096,
                              beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
        mla=_checked(MLASpec, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                     v_head_dim=128),
        moe=_checked(MoESpec, num_experts=384, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1,
                     shared_expert_ffn_hidden_size=2048, first_k_dense=1, score_function="sigmoid", expert_bias=True,
                     routed_scaling_factor=2.827, aux_loss_coeff=0.001, aux_loss_per_sequence=True, router_fp32=True))


def _deepseek_v32() -> ModelSpec:
    v3 = _deepseek_v3()
    return v3.model_copy(update=dict(
        name="deepseek-v3.2-exp", seq_length=8192, num_kv_heads=128,
        source="deepseek-ai/DeepSeek-V3.2-Exp config.json: DeepSeek-V3's shapes and the DSA indexer (index_n_heads 64, "
               "index_head_dim 128, index_topk 2048)",
        indexer=_checked(IndexerSpec, num_heads=64, head_dim=128, top_k=2048)))


_BUILDERS = {
    "gpt3-175b": lambda: _megatron_gpt("gpt3-175b", 96, 12288, 96, "Brown et al. 2020 Table 2.1; Megatron GPT conventions"),
    "gpt-1.7b": lambda: _megatron_gpt("gpt-1.7b", 24, 2304, 24),
    "gpt-3.6b": lambda: _megatron_gpt("gpt-3.6b", 30, 3072, 32),
    "gpt-7.5b": lambda: _megatron_gpt("gpt-7.5b", 36, 4096, 32),
    "gpt-18b": lambda: _megatron_gpt("gpt-18b", 40, 6144, 48),
    "gpt-39b": lambda: _megatron_gpt("gpt-39b", 48, 8192, 64),
    "gpt-76b": lambda: _megatron_gpt("gpt-76b", 60, 10240, 80),
    "gpt-145b": lambda: _megatron_gpt("gpt-145b", 80, 12288, 96),
    "gpt-310b": lambda: _megatron_gpt("gpt-310b", 96, 16384, 128),
    "gpt-530b": lambda: _megatron_gpt("gpt-530b", 105, 20480, 128),
    "gpt-1t": lambda: _megatron_gpt("gpt-1t", 128, 25600, 160),
    "llama3-8b": lambda: _llama("llama3-8b", "meta-llama/Meta-Llama-3-8B config.json", 32, 4096, 32, 8, 14336),
    "llama3-70b": lambda: _llama("llama3-70b", "meta-llama/Meta-Llama-3-70B config.json", 80, 8192, 64, 8, 28672),
    "llama3.1-405b": lambda: _llama("llama3.1-405b", "meta-llama/Llama-3.1-405B config.json", 126, 16384, 128, 8, 53248,
                                    rope_scaling=LLAMA31_ROPE),
    "mixtral-8x7b": lambda: _mixtral("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1 config.json", 32, 4096, 32, 14336, 32000, 0.02),
    "mixtral-8x22b": lambda: _mixtral("mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.3 config.json (vocab 32768)", 56, 6144, 48, 16384, 32768, 0.001),
    "qwen3-30b-a3b": lambda: _qwen3_moe("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B config.json", 48, 2048, 32, 6144, 768),
    "qwen3-235b-a22b": lambda: _qwen3_moe("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B config.json", 94, 4096, 64, 12288, 1536),
    "deepseek-v3": _deepseek_v3,
    "nemotron-h-56b": _nemotron_h_56b,
    "qwen3-next-80b-a3b": _qwen3_next_80b_a3b,
    "kimi-linear-48b-a3b": _kimi_linear_48b_a3b,
    "gpt-oss-120b": _gpt_oss_120b,
    "llama4-maverick-17b-128e": _llama4_maverick,
    "kimi-k2": _kimi_k2,
    "deepseek-v3.2-exp": _deepseek_v32,
}

PRESET_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def preset(name: str) -> ModelSpec:
    """The ModelSpec of a preset; KeyError if the name is unknown (load_model turns it into advice)."""
    return _BUILDERS[name]()
