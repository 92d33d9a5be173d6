"""The ordered layer graph of a decoder-only transformer: embedding, decoder layers, MTP modules,
final norm + output head + loss. Every later stage (cost model, partitioner, exporters) reads
these frozen records; nothing recomputes architecture arithmetic elsewhere.

Conventions
- FLOPs: 2 per multiply-accumulate. "Per token" means per token of one sequence of the batch.
- Attention core FLOPs (QK^T and AV) are quadratic in sequence length s. A layer stores the
  non-causal coefficient; `attention_flops_per_token(s, causal=True)` halves it, because a causal
  (flash) kernel skips the masked upper triangle. Megatron's published TFLOP/s count non-causal.
- Activation bytes are the tensors a layer saves for its backward pass, per token, at 16-bit
  (bf16/fp16) unless the tensor is fp32 (softmax statistics, logits for the loss) or a 1-byte
  dropout mask. For a GPT layer with unfused attention and dropout they sum to Korthikanti et al.
  2022 ("Reducing Activation Recomputation in Large Transformer Models", Eq. 1): 34·h + 5·a·s.
- `split` names the parallel axis that divides a tensor or weight on one GPU:
    "tp"   tensor parallel (column/row-parallel weights, per-head activations),
    "sp"   divided by tp only when sequence parallelism is on (norms, dropout, residuals),
    "none" replicated on every TP rank,
  and every activation is further divided by cp (the sequence is split). Routed-expert tensors
  are "sp": Megatron's MoE needs sp with tp > 1, so each rank dispatches its tokens/tp and gets
  back about tokens/tp · top_k (ETP gathers tokens and splits widths, which cancels); EP does
  not divide per-GPU expert activations.
- `module` on an activation is the Megatron recompute unit that drops it under selective
  recompute (--recompute-modules: core_attn, layernorm, mlp, moe, moe_act, shared_experts,
  mla_up_proj); "layer_input" is what full recompute keeps; "kept" is never dropped by a
  selective module.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autopar.caching import cached_property
from autopar.schema.model import ModelSpec

BYTES_16BIT = 2
BYTES_FP32 = 4
BYTES_MASK = 1


@dataclass(frozen=True, slots=True)
class Gemm:
    """One weight matmul y = x·W with W of shape (k, n) (full, before any split).

    split: "col" (n split by tp), "row" (k split by tp), "vocab" (n split by tp, vocab-parallel),
    "none" (replicated), "expert_col"/"expert_row" (one per expert, split by etp).
    tokens_per_token: rows of x per layer input token (top_k for routed experts, in total over
    all experts; 1 otherwise). tied: the weight is stored in another layer (tied embeddings,
    MTP's shared head), so it holds no parameters here.
    """

    name: str
    n: int
    k: int
    split: str
    bias: bool = False
    num_experts: int = 1
    tokens_per_token: float = 1.0
    tied: bool = False

    @property
    def params(self) -> int:
        if self.tied:
            return 0
        return self.num_experts * (self.n * self.k + (self.n if self.bias else 0))

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.n * self.k * self.tokens_per_token

    @property
    def is_expert(self) -> bool:
        return self.split.startswith("expert")


@dataclass(frozen=True, slots=True)
class Activation:
    """A tensor saved for backward: bytes per token = bytes_per_token + bytes_per_token_per_seq·s."""

    name: str
    module: str
    split: str
    bytes_per_token: float
    bytes_per_token_per_seq: float = 0.0


def attended_keys_per_query(seq_len: int, window: int | None, causal: bool = True, chunk: int | None = None) -> float:
    """Mean keys a query attends to, in the continuum limit flash kernels' FLOPs follow: full
    non-causal s; causal s/2 (the lower triangle); a causal sliding window w (Beltagy et al. 2020,
    Longformer; Mistral 7B, Jiang et al. 2023): query i sees min(i, w) keys, mean w − w²/(2s) for
    w < s; the same for DeepSeek Sparse Attention's top-k keys (query i attends min(i, k)). Chunked
    attention of chunk c (Llama 4 attention_chunk_size, HF models/llama4: a query sees the earlier
    keys of its own chunk): s = q·c + r gives (q·c² + r²)/(2s) causal, twice that without the mask.
    Ignores the diagonal's +1/2 and the kernel's block granularity at the band edge."""
    if chunk is not None and chunk < seq_len:
        whole, rest = divmod(seq_len, chunk)
        mean = (whole * chunk * chunk + rest * rest) / seq_len
        return mean / 2 if causal else float(mean)
    if window is None or window >= seq_len:
        return seq_len / 2 if causal else float(seq_len)
    if not causal:
        return float(min(seq_len, 2 * window))
    return window - window * window / (2 * seq_len)


def scored_keys_per_query(seq_len: int, window: int | None, chunk: int | None = None) -> int:
    """Keys per query whose scores an unfused attention saves for backward: the whole row s
    (Korthikanti et al. 2022's 5·a·s bytes), or the band w of a sliding window kernel (the chunk
    c of a chunked one)."""
    limit = min(x for x in (window, chunk, seq_len) if x is not None)
    return limit


@dataclass(frozen=True, slots=True)
class Layer:
    """One node of the layer graph. kind: embedding | dense | moe | mtp | head. A decoder layer's
    kind names its feed-forward block (moe: routed experts; dense: a dense MLP or none) and `mixer`
    its token mixer (attention | mamba2 | gated_deltanet | kda | none: autopar.model.mixers);
    `variant` tells decoder layers of one kind apart when a hybrid model mixes them (its
    layer_pattern and ffn_pattern letters; "" for a model whose decoder layers are all alike)."""

    index: int
    kind: str
    name: str
    gemms: tuple[Gemm, ...]
    other_params_tp: int
    other_params_replicated: int
    activations: tuple[Activation, ...]
    attn_flops_per_token_per_seq: float = 0.0
    elementwise_flops_per_token: float = 0.0
    elementwise_bytes_per_token_tp: float = 0.0
    elementwise_bytes_per_token_sp: float = 0.0
    elementwise_bytes_per_token_per_seq_tp: float = 0.0  # unfused softmax/dropout over a·s scores
    # Logits per token the loss runs over (the vocabulary, tp-split): the framework's loss moves
    # FrameworkProfile.loss_bytes_per_logit over each (autopar.cost.layer.loss_s)
    loss_logits_per_token_tp: float = 0.0
    # What eager PyTorch ops move beyond the fused minimum above (autopar.model.build.eager_*):
    eager_bytes_per_token_tp: float = 0.0
    eager_bytes_per_token_sp: float = 0.0
    attention_window: int | None = None  # sliding-window attention: keys per query at most; None = full
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim_qk: int = 0
    head_dim_v: int = 0
    top_k: int = 0
    num_experts: int = 0
    router_groups: int = 0  # group-limited routing: expert groups (moe.num_groups; 0 = none)
    router_group_topk: int = 0  # and the groups a token may pick from (moe.group_topk)
    mixer: str = "attention"
    variant: str = ""
    scan_flops_per_token: float = 0.0  # a recurrent mixer's conv + chunked scan (autopar.model.mixers)
    scan_kernel: str = ""  # the scan's kernel family (Mixer.scan_kernel); "" = priced as attention
    scan_bytes_fwd_per_token: float = 0.0  # HBM bytes of the scan kernels, forward (tp-split)
    scan_bytes_bwd_per_token: float = 0.0  # and backward
    index_flops_per_token_per_seq: float = 0.0  # DSA indexer: FLOPs per earlier key, every key scored
    attention_chunk: int | None = None  # chunked attention (Llama 4): a query sees its own chunk only
    attention_top_k: int | None = None  # DSA: keys a query attends to at most
    tp_blocks: float = 0.0  # TP-parallel blocks of a decoder layer (0: as its kind, autopar.cost.layer)
    cp_a2a_bytes_per_token: float = 0.0  # Mamba CP: bytes per token all-to-all'd each way (tp-split)
    norm_tensors: int = 0  # parameter tensors of the layer's norms (a weight each, and a bias for LayerNorm)

    # Derived once at construction (the cost model reads them for every layer of every plan):
    params: int = field(init=False, repr=False, compare=False)  # all weights
    params_expert: int = field(init=False, repr=False, compare=False)  # routed experts: / (ep·etp) on one GPU
    params_tp: int = field(init=False, repr=False, compare=False)  # / tp: col/row/vocab matrices, col biases
    params_replicated: int = field(init=False, repr=False, compare=False)  # whole on every TP rank
    active_params: int = field(init=False, repr=False, compare=False)  # touched by one token
    matmul_flops_per_token: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """params_tp: column/row/vocab-parallel matrices and column-parallel biases (row biases are
        replicated); params_replicated: norms, routers, low-rank down-projections, row biases;
        active_params: routed experts count top_k of num_experts."""
        params = sum(g.params for g in self.gemms) + self.other_params_tp + self.other_params_replicated
        expert = sum(g.params for g in self.gemms if g.is_expert)
        tp = self.other_params_tp
        for g in self.gemms:
            if g.tied or g.split not in ("col", "row", "vocab"):
                continue
            tp += g.n * g.k + (g.n if g.bias and g.split != "row" else 0)
        active = params if not self.num_experts else params - expert + expert * self.top_k // self.num_experts
        for name, value in (("params", params), ("params_expert", expert), ("params_tp", tp),
                            ("params_replicated", params - expert - tp), ("active_params", active),
                            ("matmul_flops_per_token", sum(g.flops_per_token for g in self.gemms))):
            object.__setattr__(self, name, value)

    @property
    def cost_key(self) -> str:
        """The name the cost model files this layer's cost under: decoder layers that cost alike
        share it (their kind and variant), every other layer has its own (its name)."""
        if self.kind in ("dense", "moe"):
            return f"{self.kind}:{self.variant}" if self.variant else self.kind
        return self.name

    def attended_keys(self, seq_len: int, causal: bool = True) -> float:
        """Mean keys one query attends to in this layer (see attended_keys_per_query)."""
        window = self.attention_window if self.attention_top_k is None else self.attention_top_k
        return attended_keys_per_query(seq_len, window, causal, self.attention_chunk)

    @property
    def fused_priced_attention(self) -> bool:
        """Softmax attention this graph prices as a fused kernel: an attention mixer with heads and no
        unfused scores of its own (a dropout model's, elementwise_bytes_per_token_per_seq_tp). Only
        such a layer switches to Transformer Engine's unfused path under attention_backend "unfused"."""
        return (self.mixer == "attention" and self.num_heads > 0 and self.attn_flops_per_token_per_seq > 0
                and self.elementwise_bytes_per_token_per_seq_tp == 0)

    def scored_keys(self, seq_len: int) -> int:
        """Keys per query an unfused kernel materialises scores for (see scored_keys_per_query)."""
        return scored_keys_per_query(seq_len, self.attention_window, self.attention_chunk)

    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """QK^T + AV FLOPs per token: the per-key coefficient times the keys a query attends to
        (causal: the lower triangle only, half; a sliding window: the band; a chunk; DSA's top-k),
        plus a DSA indexer's scores of every earlier key."""
        core = self.attn_flops_per_token_per_seq * self.attended_keys(seq_len, causal)
        if self.index_flops_per_token_per_seq:
            core += self.index_flops_per_token_per_seq * attended_keys_per_query(seq_len, None, causal)
        return core

    def forward_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        return (
            self.matmul_flops_per_token
            + self.attention_flops_per_token(seq_len, causal)
            + self.scan_flops_per_token
            + self.elementwise_flops_per_token
        )

    def activation_bytes_per_token(self, seq_len: int) -> dict[str, float]:
        """Saved bytes per token by tensor, unsplit (tp = sp = cp = 1), no recompute."""
        keys = self.scored_keys(seq_len)
        return {a.name: a.bytes_per_token + a.bytes_per_token_per_seq * keys for a in self.activations}


@dataclass(frozen=True)
class ModelGraph:
    """A model's ordered layers plus its spec. Layers: embedding, decoders, mtp..., head."""

    spec: ModelSpec
    layers: tuple[Layer, ...]

    @cached_property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @cached_property
    def active_params(self) -> int:
        return sum(layer.active_params for layer in self.layers)

    @cached_property
    def layer_classes(self) -> tuple[int, ...]:
        """A number per layer, equal for layers that differ only in index and name (what the cost
        model reads of them is the same: autopar.cost.step.StepMemo shares their results)."""
        class_of: dict[Layer, int] = {}
        return tuple(class_of.setdefault(replace(x, index=0, name=""), len(class_of)) for x in self.layers)

    @cached_property
    def cost_kinds(self) -> tuple[tuple[Layer, ...], tuple[int, ...]]:
        """One layer of each cost kind, in graph order (all dense decoders cost alike, all MoE
        decoders alike, the other layers each its own by name), and each layer's kind index."""
        kind_to_index: dict[str, int] = {}
        kinds: list[Layer] = []
        index = []
        for layer in self.layers:
            key = layer.cost_key
            if key not in kind_to_index:
                kind_to_index[key] = len(kinds)
                kinds.append(layer)
            index.append(kind_to_index[key])
        return tuple(kinds), tuple(index)

    @cached_property
    def attention_head_dims(self) -> tuple[tuple[int, int], ...]:
        """The (query/key, value) head dims of the graph's fused-priced softmax attention layers
        (Layer.fused_priced_attention), sorted, each once: what a framework's choice of attention
        kernel reads (FrameworkProfile.attention_kernel)."""
        return tuple(sorted({(x.head_dim_qk, x.head_dim_v) for x in self.layers if x.fused_priced_attention}))

    @property
    def decoder_layers(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.kind in ("dense", "moe"))

    def params_by_kind(self) -> dict[str, int]:
        kind_to_params: dict[str, int] = {}
        for layer in self.layers:
            kind_to_params[layer.kind] = kind_to_params.get(layer.kind, 0) + layer.params
        return kind_to_params

    def flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Training FLOPs per token = 3 × forward (backward is twice the forward), no recompute."""
        return 3.0 * sum(layer.forward_flops_per_token(seq_len, causal) for layer in self.layers)

    def model_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """6·N_active (matmul weights only, embedding lookups excluded) + attention + the recurrent
        mixers' scans, as MFU counts it."""
        matmul = sum(layer.matmul_flops_per_token for layer in self.layers)
        attn = sum(layer.attention_flops_per_token(seq_len, causal) + layer.scan_flops_per_token
                   for layer in self.layers)
        return 3.0 * (matmul + attn)

    @cached_property
    def mtp_params(self) -> int:
        """Parameters of the MTP modules (counted in total_params; 0 without them)."""
        return sum(layer.params for layer in self.layers if layer.kind == "mtp")
