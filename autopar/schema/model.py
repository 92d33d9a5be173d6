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
    expert_mlp_bias: Flag = Field(False, description="Biases on every routed expert's projections (gpt-oss).")
    router_bias: Flag = Field(False, description="A bias on the router's logits (gpt-oss).")

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


class MambaSpec(BaseModel):
    """Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060; Megatron-LM
    megatron/core/ssm/mamba_mixer.py; HF models/nemotron_h): d_inner = num_heads · head_dim."""

    model_config = _FROZEN

    num_heads: Count = Field(..., ge=1, le=MAX_HEADS, description="SSM heads (HF mamba_num_heads).")
    head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Channels per SSM head (HF mamba_head_dim).")
    state_size: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="SSM state size N (HF ssm_state_size).")
    num_groups: Count = Field(..., ge=1, le=MAX_HEADS, description="B/C groups shared by heads (HF n_groups).")
    conv_kernel: Count = Field(4, ge=1, le=1024, description="Depthwise causal conv1d width (HF conv_kernel).")
    chunk_size: Count = Field(128, ge=1, le=MAX_SEQ_LEN, description="SSD chunk length of the chunked scan (HF chunk_size).")
    conv_bias: Flag = Field(True, description="A bias on the conv1d (HF use_conv_bias).")
    proj_bias: Flag = Field(False, description="Biases on in_proj and out_proj (HF use_bias).")

    @model_validator(mode="after")
    def _check(self) -> "MambaSpec":
        if self.num_heads % self.num_groups:
            raise ValueError(f"mamba.num_heads ({self.num_heads}) must be a multiple of mamba.num_groups "
                             f"({self.num_groups}); use a group count that divides the heads")
        return self


class LinearAttentionSpec(BaseModel):
    """Delta-rule linear attention with a key_head_dim × value_head_dim state per value head:
    Gated DeltaNet (Yang et al. 2024, arXiv 2412.06464; HF models/qwen3_next) or Kimi Delta
    Attention (Kimi Linear report, arXiv 2510.26692; HF models/kimi_linear)."""

    model_config = _FROZEN

    kind: Literal["gated_deltanet", "kda"] = Field(..., description="gated_deltanet (Qwen3-Next) or kda (Kimi-Linear).")
    num_key_heads: Count = Field(..., ge=1, le=MAX_HEADS, description="Query/key heads (HF linear_num_key_heads).")
    num_value_heads: Count = Field(..., ge=1, le=MAX_HEADS, description="Value heads (HF linear_num_value_heads).")
    key_head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Query/key head dim d_k.")
    value_head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Value head dim d_v.")
    conv_kernel: Count = Field(4, ge=1, le=1024, description="Short causal conv1d width on q, k, v.")
    chunk_size: Count = Field(64, ge=1, le=MAX_SEQ_LEN, description="Chunk length of the chunked (WY) form "
                              "(flash-linear-attention chunk_gated_delta_rule / chunk_kda: 64).")

    @model_validator(mode="after")
    def _check(self) -> "LinearAttentionSpec":
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"linear_attention.num_value_heads ({self.num_value_heads}) must be a multiple of "
                             f"num_key_heads ({self.num_key_heads})")
        if self.kind == "kda" and self.num_value_heads != self.num_key_heads:
            raise ValueError("linear_attention of kind kda has one head count; set num_value_heads = num_key_heads")
        return self


class IndexerSpec(BaseModel):
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2-Exp report; HF models/deepseek_v32):
    index heads score every earlier key, and each query attends only its top_k keys."""

    model_config = _FROZEN

    num_heads: Count = Field(..., ge=1, le=MAX_HEADS, description="Indexer heads (index_n_heads).")
    head_dim: Count = Field(..., ge=1, le=MAX_HIDDEN_SIZE, description="Indexer head dim (index_head_dim).")
    top_k: Count = Field(..., ge=1, le=MAX_SEQ_LEN, description="Keys each query attends to (index_topk).")


# One letter per decoder layer (ModelSpec.layer_pattern): its token mixer.
MIXER_LETTERS = {"A": "full attention", "N": "full attention without RoPE (NoPE)", "W": "sliding-window attention",
                 "C": "chunked attention", "M": "Mamba-2", "G": "Gated DeltaNet", "K": "Kimi Delta Attention",
                 "-": "no mixer"}
# One letter per decoder layer (ModelSpec.ffn_pattern): its feed-forward block.
FFN_LETTERS = {"D": "dense MLP", "E": "MoE", "-": "no feed-forward"}


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
    activation: Literal["gelu", "swiglu", "relu2"] = Field("swiglu", description="FFN activation: GeLU (2 matrices), "
                                                            "SwiGLU (3) or squared ReLU (2, Nemotron-H relu2).")
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
    layer_pattern: str | None = Field(None, max_length=MAX_LAYERS, description=(
        "Token mixer of each decoder layer, one letter each: A full attention, N full attention without RoPE, "
        "W sliding window (sliding_window), C chunked (attention_chunk_size), M Mamba-2 (mamba), G Gated "
        "DeltaNet, K Kimi Delta Attention (linear_attention), - none; None = A everywhere (W with sliding_window)."))
    ffn_pattern: str | None = Field(None, max_length=MAX_LAYERS, description=(
        "Feed-forward block of each decoder layer: D dense, E MoE, - none; None = MoE as moe.first_k_dense and "
        "moe.layer_freq say."))
    attention_chunk_size: Count | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="Chunked attention (Llama 4): "
                                               "a query attends within its chunk of this many tokens.")
    attention_sinks: Flag = Field(False, description="A learned sink logit per head in the softmax (gpt-oss).")
    attention_output_gate: Flag = Field(False, description="A sigmoid gate on the attention output from a doubled q "
                                        "projection (Qwen3-Next gated attention).")
    mamba: MambaSpec | None = Field(None, description="Mamba-2 mixer of the M layers.")
    linear_attention: LinearAttentionSpec | None = Field(None, description="Linear attention of the G / K layers.")
    indexer: IndexerSpec | None = Field(None, description="DeepSeek Sparse Attention indexer on every attention layer.")
    mtp_source: str = Field("", description="Where the MTP modules come from when the checkpoint ships them beside "
                            "the config's layers (e.g. Qwen3-Next's mtp.* weights).")

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
        self._check_patterns()
        return self

    def _check_patterns(self) -> None:
        """Each pattern has one known letter per decoder layer, and every letter has its settings."""
        for field, pattern, letters in (("layer_pattern", self.layer_pattern, MIXER_LETTERS),
                                        ("ffn_pattern", self.ffn_pattern, FFN_LETTERS)):
            if pattern is None:
                continue
            if len(pattern) != self.num_layers:
                raise ValueError(f"{field} has {len(pattern)} letters but num_layers is {self.num_layers}; give one "
                                 "letter per decoder layer")
            bad = sorted(set(pattern) - set(letters))
            if bad:
                raise ValueError(f"{field} letter {bad[0]!r} (layer {pattern.index(bad[0])}) is not one of "
                                 f"{' '.join(letters)}; use one of them per layer")
        mixers, ffns = set(self.layer_pattern or ""), set(self.ffn_pattern or "")
        needs = (("W", self.sliding_window, "sliding_window"), ("C", self.attention_chunk_size, "attention_chunk_size"),
                 ("M", self.mamba, "mamba"), ("E", self.moe, "moe"))
        for letter, value, field in needs:
            if letter in mixers | ffns and value is None:
                raise ValueError(f"a layer of kind {letter} needs {field}; set it or change the pattern")
        for letter, kind in (("G", "gated_deltanet"), ("K", "kda")):
            if letter in mixers and (self.linear_attention is None or self.linear_attention.kind != kind):
                raise ValueError(f"a layer of kind {letter} needs linear_attention of kind {kind}; set it or change "
                                 "layer_pattern")
        for field, value in (("sliding_window", self.sliding_window), ("attention_chunk_size", self.attention_chunk_size)):
            if value is not None and value > self.seq_length:
                raise ValueError(f"{field} ({value}) is larger than seq_length ({self.seq_length}); a window that "
                                 f"covers the sequence is full attention: drop {field} or raise seq_length")
        if self.layer_pattern and self.ffn_pattern:
            empty = [i for i, (m, f) in enumerate(zip(self.layer_pattern, self.ffn_pattern)) if m == f == "-"]
            if empty:
                raise ValueError(f"decoder layer {empty[0]} has neither a mixer nor a feed-forward block; give it one "
                                 "in layer_pattern or ffn_pattern")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) has an MoE FFN (an MTP module past the decoder
        layers: whenever the model has experts)."""
        if self.ffn_pattern is not None and index < self.num_layers:
            return self.ffn_pattern[index] == "E"
        if self.moe is None or index < self.moe.first_k_dense:
            return False
        if index >= self.num_layers:
            return True
        return (index - self.moe.first_k_dense) % self.moe.layer_freq == 0

    def mixer_of(self, index: int) -> str:
        """The layer_pattern letter of decoder layer `index` (MTP modules, past the decoder layers:
        full attention, A)."""
        if self.layer_pattern is not None and index < self.num_layers:
            return self.layer_pattern[index]
        return "W" if self.sliding_window is not None and self.layer_pattern is None else "A"

    def ffn_of(self, index: int) -> str:
        """The ffn_pattern letter of decoder layer `index`."""
        if self.ffn_pattern is not None and index < self.num_layers:
            return self.ffn_pattern[index]
        return "E" if self.is_moe_layer(index) else "D"

    def mixer_counts(self) -> dict:
        """What the plan rules (autopar.schema.rules.Context) read of the recurrent mixers: the gcd
        of the head and group counts tp must divide (Mamba-2 heads and groups: Megatron's
        MambaMixer splits both; linear key and value heads: its GatedDeltaNet; 0 = none), the
        Mamba heads that heads / tp must be a multiple of cp for (mamba_context_parallel.py), and
        the mixer no context parallelism splits (delta-rule scans: no CP in Megatron-Core 0.16's
        GatedDeltaNet or any framework here; DSA: Megatron's DSAttention refuses CP)."""
        from math import gcd

        letters = set(self.layer_pattern or "")
        counts, mamba, blocker = [], 0, ""
        if "M" in letters and self.mamba is not None:
            counts += [self.mamba.num_heads, self.mamba.num_groups]
            mamba = self.mamba.num_heads
        if letters & {"G", "K"} and self.linear_attention is not None:
            la = self.linear_attention
            counts += [la.num_key_heads, la.num_value_heads]
            blocker = "Gated DeltaNet" if la.kind == "gated_deltanet" else "Kimi Delta Attention"
        if self.indexer is not None:
            blocker = blocker or "DeepSeek Sparse Attention"
        mixer_heads = 0
        for n in counts:
            mixer_heads = gcd(mixer_heads, n)
        windows = [w for w, letter in ((self.sliding_window, "W"), (self.attention_chunk_size, "C"))
                   if w is not None and (letter in letters or self.layer_pattern is None and letter == "W")]
        return dict(mixer_heads=mixer_heads, mamba_heads=mamba, cp_blocker=blocker, max_window=max(windows, default=0))

    @property
    def is_hybrid(self) -> bool:
        """Decoder layers differ in their mixer or drop a block (the patterns are set)."""
        return self.layer_pattern is not None or self.ffn_pattern is not None
