"""Boundary model of a decoder-only transformer: what a preset, a Hugging Face config.json or a
YAML layer-graph file says about the architecture. The layer graph (autopar.model.graph) is built
from it; nothing downstream reads a config file.

A YAML file (see examples/custom-decoder.yaml) holds exactly these fields; unknown keys are errors.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.limits import (MAX_EXPERTS, MAX_FFN_HIDDEN_SIZE, MAX_HEADS, MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_SEQ_LEN,
                            MAX_VOCAB_SIZE)
from autopar.schema.types import Count, Flag, Real

# defer_build: the validator is built on first validation; shipped data is built without one
# (autopar.schema.plain), so `autopar plan` builds none of these classes (issue 15: start-up).
_FROZEN = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q and joint low-rank kv."""

    model_config = _FROZEN

    q_lora_rank: Count | None = Field(None, ge=1, le=MAX_HIDDEN_SIZE, description="Rank of the q down-projection; None = full-rank q.")
    kv_lora_rank: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Rank of the joint kv down-projection.")
    qk_nope_head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Per-head q/k dim without rotary embedding.")
    qk_rope_head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Per-head q/k dim with rotary (k part shared across heads).")
    v_head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Per-head value dim.")


class RopeScaling(BaseModel):
    """RoPE frequency scaling for long context, as the HF config's rope_scaling / rope_parameters
    give it. llama3: Meta's piecewise wavelength scaling (Llama 3.1); yarn: Peng et al. 2023
    (arXiv 2309.00071), DeepSeek-V3's variant with mscale."""

    model_config = _FROZEN

    type: Literal["llama3", "yarn"] = Field(..., description="llama3 (Llama 3.1+) or yarn (DeepSeek-V3).")
    factor: Real = Field(..., gt=0, le=1e6, description="Context extension factor.")
    original_max_position_embeddings: Count = Field(..., ge=1, le=MAX_SEQ_LEN, description="Pre-training context length.")
    low_freq_factor: Real = Field(1.0, gt=0, le=1e6, description="llama3: wavelengths above orig/low are divided by factor.")
    high_freq_factor: Real = Field(4.0, gt=0, le=1e6, description="llama3: wavelengths below orig/high are kept.")
    beta_fast: Real = Field(32.0, gt=0, le=1e6, description="yarn: fast correction boundary (rotations).")
    beta_slow: Real = Field(1.0, gt=0, le=1e6, description="yarn: slow correction boundary (rotations).")
    mscale: Real = Field(1.0, ge=0, le=1e6, description="yarn: attention temperature coefficient.")
    mscale_all_dim: Real = Field(0.0, ge=0, le=1e6, description="yarn: mscale applied to all dims (DeepSeek).")


class MoESpec(BaseModel):
    """Mixture-of-experts FFN, as Megatron (--num-experts ...) and HF configs describe it."""

    model_config = _FROZEN

    num_experts: Count = Field(..., ge=1, le=MAX_EXPERTS, description="Routed experts per MoE layer.")
    top_k: Count = Field(..., ge=1, le=MAX_EXPERTS, description="Experts each token is routed to.")
    expert_ffn_hidden_size: Count = Field(..., ge=1, le=MAX_FFN_HIDDEN_SIZE, description="Intermediate size of one routed expert.")
    num_shared_experts: Count = Field(0, ge=0, le=MAX_EXPERTS, description="Always-active shared experts (DeepSeek).")
    shared_expert_ffn_hidden_size: Count = Field(0, ge=0, le=MAX_FFN_HIDDEN_SIZE, description="Intermediate size of one shared expert.")
    first_k_dense: Count = Field(0, ge=0, le=MAX_LAYERS, description="Leading decoder layers with a dense FFN (DeepSeek first_k_dense_replace).")
    layer_freq: Count = Field(1, ge=1, le=MAX_LAYERS, description="Every layer_freq-th layer (after first_k_dense) is MoE; 1 = all.")
    shared_expert_gate: Flag = Field(False, description="A sigmoid gate (h -> 1) on the shared expert (Qwen2-MoE).")
    score_function: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="Router score: softmax (Mixtral, Qwen3) or sigmoid (DeepSeek-V3 scoring_func).")
    norm_topk_prob: Flag = Field(True, description="Renormalise the top-k scores to sum to 1 (HF norm_topk_prob).")
    expert_bias: Flag = Field(False, description="Aux-loss-free balancing bias on the scores (DeepSeek-V3 noaux_tc).")
    num_groups: Count | None = Field(None, ge=1, le=MAX_EXPERTS, description="Group-limited routing: expert groups (n_group).")
    group_topk: Count | None = Field(None, ge=1, le=MAX_EXPERTS, description="Group-limited routing: groups kept per token (topk_group).")
    routed_scaling_factor: Real = Field(1.0, gt=0, le=1e6, description="Scale on the routed experts' output (DeepSeek: 2.5).")
    aux_loss_coeff: Real = Field(0.0, ge=0, le=1e6, description="Load-balancing loss coefficient (router_aux_loss_coef).")
    aux_loss_per_sequence: Flag = Field(False, description="Balance loss per sequence (DeepSeek seq_aux), not per batch.")
    router_fp32: Flag = Field(False, description="Router logits computed in fp32 (DeepSeek-V3's gate).")

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"moe.top_k ({self.top_k}) exceeds moe.num_experts ({self.num_experts}); lower top_k")
        if self.num_shared_experts and not self.shared_expert_ffn_hidden_size:
            raise ValueError("moe.num_shared_experts > 0 needs moe.shared_expert_ffn_hidden_size")
        if (self.num_groups is None) != (self.group_topk is None):
            raise ValueError("moe.num_groups and moe.group_topk go together; give both or neither")
        if self.num_groups is not None and (self.num_experts % self.num_groups or self.group_topk > self.num_groups):
            raise ValueError(f"moe.num_groups ({self.num_groups}) must divide num_experts ({self.num_experts}) and "
                             f"be at least group_topk ({self.group_topk})")
        return self


class ModelSpec(BaseModel):
    """A decoder-only transformer. Sizes are counts; bytes and FLOPs are derived in the graph."""

    model_config = _FROZEN

    name: str = Field(..., min_length=1, description="Model name used in tables and exports.")
    source: str = Field("", description="Where the architecture numbers come from (paper, config.json).")
    num_layers: Count = Field(..., ge=1, le=MAX_LAYERS, description="Decoder layers (without MTP layers).")
    hidden_size: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Model width h.")
    num_attention_heads: Count = Field(..., ge=1, le=MAX_HEADS, description="Query heads a.")
    num_kv_heads: Count | None = Field(None, ge=1, le=MAX_HEADS, description="Key/value heads (GQA/MQA); None = num_attention_heads.")
    head_dim: Count | None = Field(None, ge=1, le=MAX_HIDDEN_SIZE, description="Per-head dim; None = hidden_size / num_attention_heads.")
    ffn_hidden_size: Count = Field(..., ge=1, le=MAX_FFN_HIDDEN_SIZE, description="Dense FFN intermediate size.")
    vocab_size: Count = Field(..., ge=1, le=MAX_VOCAB_SIZE, description="Vocabulary size as stored in the embedding table.")
    seq_length: Count = Field(2048, ge=1, le=MAX_SEQ_LEN, description="Default training sequence length.")
    max_position_embeddings: Count | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="Learned position table size; None = seq_length.")
    activation: Literal["gelu", "swiglu"] = Field("swiglu", description="FFN activation: GeLU (2 matrices) or SwiGLU (3).")
    normalization: Literal["layernorm", "rmsnorm"] = Field("rmsnorm", description="LayerNorm has a bias, RMSNorm not.")
    position_embedding: Literal["learned", "rope"] = Field("rope", description="Learned absolute table or rotary.")
    rope_theta: Real = Field(10000.0, gt=0, le=1e12, description="RoPE base (HF rope_theta; Llama 3: 500000).")
    rope_scaling: RopeScaling | None = Field(None, description="RoPE long-context scaling; None = plain RoPE.")
    rotary_percent: Real = Field(1.0, gt=0, le=1, description="Share of the head dim that is rotated (Pythia 0.25).")
    norm_epsilon: Real = Field(1e-5, gt=0, le=1, description="Epsilon of every LayerNorm/RMSNorm (HF rms_norm_eps).")
    sliding_window: Count | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="Attention window in tokens (Mistral); None = full.")
    tie_embeddings: Flag = Field(False, description="Output head shares the input embedding matrix.")
    qkv_bias: Flag = Field(False, description="Bias on the q, k, v projections.")
    attn_out_bias: Flag = Field(False, description="Bias on the attention output projection.")
    mlp_bias: Flag = Field(False, description="Biases on the FFN projections.")
    qk_norm: Flag = Field(False, description="Per-head RMSNorm on q and k (Qwen3).")
    dropout: Flag = Field(False, description="Attention/hidden dropout active in training (saves masks).")
    mla: MLASpec | None = Field(None, description="Multi-head latent attention; None = standard attention.")
    moe: MoESpec | None = Field(None, description="Mixture of experts; None = dense FFN everywhere.")
    mtp_layers: Count = Field(0, ge=0, le=MAX_LAYERS, description="Multi-token-prediction modules (DeepSeek-V3: 1).")

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelSpec":
        a, kv = self.num_attention_heads, self.kv_heads
        if self.head_dim is None and self.mla is None and self.hidden_size % a:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads ({a}); "
                "set head_dim explicitly or pick a dividing head count"
            )
        if a % kv:
            raise ValueError(
                f"num_attention_heads ({a}) is not divisible by num_kv_heads ({kv}); "
                "use a kv head count that divides the query heads"
            )
        if self.moe and self.moe.first_k_dense > self.num_layers:
            raise ValueError(f"moe.first_k_dense ({self.moe.first_k_dense}) exceeds num_layers ({self.num_layers})")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) has an MoE FFN."""
        if self.moe is None or index < self.moe.first_k_dense:
            return False
        return (index - self.moe.first_k_dense) % self.moe.layer_freq == 0
