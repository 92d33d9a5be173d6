"""Named architectures. Each names the paper table or config.json its numbers come from."""

from __future__ import annotations

from typing import Any, TypeVar

from autopar.schema.model import MLASpec, ModelSpec, MoESpec, RopeScaling
from autopar.schema.plain import build

M = TypeVar("M", ModelSpec, MoESpec, MLASpec, RopeScaling)


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
}

PRESET_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def preset(name: str) -> ModelSpec:
    """The ModelSpec of a preset; KeyError if the name is unknown (load_model turns it into advice)."""
    return _BUILDERS[name]()
