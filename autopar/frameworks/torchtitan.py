"""torchtitan 0.3 (with torchao 0.18 on PyTorch 2.9+): what a torchtitan user gets.

Axes: FSDP2 (ZeRO 2 = reshard_after_forward False, 3 = full shard, the default; 0 = replicas),
HSDP (zero_shard_size), tp, pp with interleaving, cp (PyTorch's ring attention, K/V all-gathered),
ep. torchtitan builds models from Python configs: a model trains only when a model_registry flavour
has its shape (FLAVOURS), so a model without one is refused before any search.

Cost profile, per field (sources):
- attention kernel: torch SDPA, whose flash backend is FlashAttention-2 (PyTorch 2.5 docs,
  torch.nn.attention.SDPBackend); under CP torchtitan restricts SDPA to the flash and
  memory-efficient backends (utils.get_train_context) and flash (FA2) is chosen; without CP flash
  is chosen too, cuDNN SDPA being opt-in since pytorch#138522.
- selective recompute: the selective AC "op" policy (torchtitan/models/llama3/parallelize:
  _save_list of mm and SDPA, every second mm recomputed) keeps the SDPA outputs, the block input and
  every second matmul output and recomputes the rest; whatever modules a plan lists, it is this
  policy, labelled selective(op).
- loss: torch.nn.functional.cross_entropy on the fp32-cast logits keeps its log-softmax output and
  allocates an fp32 gradient of the logits at the start of backward. Compiled with the model
  (--compile.components model,loss, as autopar exports it) its HBM traffic is priced at a fused
  minimum (read the bf16 logits, write and re-read the fp32 softmax: 10 + 20 bytes per logit, not
  read from Inductor's kernels); eager (torch_compile false, and release 2024-12) it moves
  EAGER_LOSS_BYTES.
- gradients: FSDP2 frees sharded gradients at zero_grad (set_to_none), so no gradient is resident
  at the forward/backward peak of the first microbatch. Bytes per parameter: fp32 sharded weights 4
  + fp32 grads 4 + moments 8 = 16, all sharded over the FSDP group at zero 2 and 3; zero 2
  (reshard_after_forward=False) keeps the stage's bf16 weights gathered, twice.
- fp8: torchao's float8 linears save the bf16 inputs and re-cast them; dynamic scaling is an amax
  pass and a cast per tensor on every call, the weights included, with the bytes torchao's own
  roofline model gives them: rowwise in torchtitan 0.3 (its only recipe: each operand cast again in
  backward along the axis its GEMM needs); tensorwise in torchtitan of Dec 2024 (release 2024-12).
- pipeline parallelism with FSDP: torchtitan builds the blocks with reshard_after_forward=False
  when pp is on ("For PP, do not reshard after forward to avoid per-microbatch all-gathers",
  parallelize.apply_fsdp, reshard_after_forward_policy "default"), and PyTorch's pipelining turns
  off resharding and gradient reduction for every backward but the last
  (torch/distributed/pipelining/stage.py, _PipelineStageBase.backward_maybe_with_nosync:
  set_reshard_after_backward(False), set_requires_gradient_sync(False); _post_backward restores
  them). So a stage's bf16 weights are gathered once per step and stay gathered, its gradients
  accumulate unsharded in the fp32 reduce dtype, and they are reduce-scattered once, after the last
  microbatch: 2 + 4 bytes per stage parameter held through the step, one gather pass and one
  reduce-scatter pass per step instead of per microbatch (at zero 2, the gradients' 4 bytes on top
  of the weights zero 2 holds anyway).
- parameter gathers: FSDP2 gathers one transformer block at a time (fully_shard per block) with one
  block of prefetch; the recompute of an AC-wrapped block runs inside the block's unsharded
  backward (two gathers); it holds the computing block and the prefetched one in bf16.
- TP: DTensor TP, no async TP by default (tp_comm_overlap = async TP, a compile pass).
- context parallelism: PyTorch's ring attention (torch/distributed/tensor/experimental/_attention.py
  at torch 1963fc8) replaces F.scaled_dot_product_attention, so it sees the K/V that torchtitan's
  Llama has already repeated to the query heads (repeat_kv before SDPA); its "allgather" rotate
  method (torchtitan's default, --parallelism.context-parallel-rotate-method) gathers every rank's
  K/V once, behind the first SDPA step; it merges each step's output and log-sum-exp into an fp32
  running output (_SDPAMerger, convert_to_f32=True), accumulates dq/dk/dv in fp32 and passes the
  running fp32 dK/dV to the next rank after every backward step (_AllToAllRotater), waiting for the
  last one right after the loop. torchtitan compiles each block (apply_compile, fullgraph), and a
  functional collective traced by torch.compile is waited on right where it is issued
  (_functional_collectives._maybe_wrap_tensor; Inductor's reorder_for_compute_comm_overlap is off
  by default), so none of these transfers overlaps an SDPA step.
- elementwise kernels: plain PyTorch (models/norms.py RMSNorm with an fp32 upcast, complex-number
  RoPE, silu·mul), fused only under torch.compile (plan field torch_compile, --compile.enable; on
  by default as autopar exports it).
- checkpoints: torch.distributed.checkpoint writes the FSDP-sharded fp32 parameters and two Adam
  moments, 4 + 8 = 12 bytes per parameter (components/checkpointer); --checkpoint.async-mode async
  saves in a background thread once the state is staged in host memory.
- layer split: torchtitan's own rule for uneven pipeline splits (autopar.cost.layout
  torchtitan_layer_counts).
- release "2024-12", commit 9dec370 with torchao eab345c (the torchtitan-2412 runs): float8
  linears with dynamic tensorwise scaling, the default then (--float8.scaling_type_* dynamic).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autopar.frameworks.base import FrameworkProfile, FrameworkSpec

# Eager torch.nn.functional.cross_entropy(pred.float(), labels), HBM bytes per logit (forward, backward):
# the cast (2 + 4); log_softmax over a vocabulary row too long for one block's shared memory
# (aten/src/ATen/native/cuda/SoftMax.cu cunn_SoftMaxForward: a max pass, a sum-of-exp pass, then the
# output pass: 4 + 4 + 4 + 4): 22; backward: nll_loss_backward writes a zero fp32 gradient (4),
# log_softmax_backward (cunn_SoftMaxBackward) sums the gradient (4) and writes the input gradient from it
# and the saved output (4 + 4 + 4), the cast's backward writes bf16 (4 + 2): 26.
EAGER_LOSS_BYTES = (22.0, 26.0)

PROFILE = FrameworkProfile(
    name="torchtitan", version="torchtitan 0.3 with torchao 0.18 on PyTorch 2.9+",
    attention_kernel_by_arch=(("ampere", "fa2"), ("hopper", "fa2"), ("blackwell", "fa2")),
    selective_policy="op_sac", fused_cross_entropy=False, persistent_gradients=False,
    fp8_one_byte_saved_inputs=False, gather_unit="block", gathers_under_full_recompute=2, prefetch_depth=1,
    cp_ring="torch", cp_repeats_kv_heads=True, cp_comm_overlapped=False, elementwise="compile",
    fp8_casts="torchao_rowwise", unfused_loss_bytes_per_logit=EAGER_LOSS_BYTES)


# torchtitan 9dec370 leaves the loss out of torch.compile (train.py: "compiling loss function causes CUDA
# errors, turning off for now"), so it runs eager.
DEC_2024 = replace(PROFILE, version="torchtitan 9dec370 (Dec 2024) with torchao eab345c on PyTorch 2.6 nightly",
                   fp8_casts="torchao_tensorwise", loss_bytes_per_logit=EAGER_LOSS_BYTES)


# A model's shape as torchtitan's registry fixes it: these fields of autopar.schema.model.ModelSpec
# (mla as its five dims), then the MoE fields (None for a dense model).
_SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "head_size", "ffn_hidden_size",
                 "vocab_size", "activation", "normalization", "position_embedding", "qkv_bias", "attn_out_bias",
                 "mlp_bias", "qk_norm", "mla")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_MOE_SHAPE_FIELDS = ("num_experts", "top_k", "expert_ffn_hidden_size", "num_shared_experts",
                     "shared_expert_ffn_hidden_size", "first_k_dense", "layer_freq", "shared_expert_gate")


def _registry_shape(layers: int, hidden: int, heads: int, kv_heads: int, head: int, ffn: int, vocab: int, *,
                    qk_norm: bool = False, mla: tuple[int, ...] | None = None,
                    moe: tuple | None = None) -> tuple:
    """A flavour's shape: torchtitan's models are SwiGLU, RMSNorm and RoPE without biases."""
    return (layers, hidden, heads, kv_heads, head, ffn, vocab, "swiglu", "rmsnorm", "rope", False, False, False,
            qk_norm, mla, moe)


def _shape(spec) -> tuple:
    """`spec`'s shape in the form of _registry_shape."""
    out = [getattr(spec, f) for f in _SHAPE_FIELDS]
    if spec.mla is not None:
        out[-1] = tuple(getattr(spec.mla, f) for f in _MLA_FIELDS)
    moe = tuple(getattr(spec.moe, f) for f in _MOE_SHAPE_FIELDS) if spec.moe else None
    return (*out, moe)


@dataclass(frozen=True, slots=True)
class Flavour:
    """A torchtitan 0.3 model_registry flavour, the config_registry function that trains it, its
    shape, and the autopar preset with that shape (torchtitan/models/<module>/__init__.py,
    config_registry.py; tests/test_frameworks.py checks each shape against its preset)."""

    module: str
    flavor: str
    config_fn: str
    preset: str
    shape: tuple
    fixed: tuple[tuple[str, float], ...] = ()  # settings the flavour hard-codes: (spec path, value)
    bf16_config_fn: str | None = None  # the recipe to start bf16 plans from, when config_fn builds float8

    def recipe(self, fp8: bool) -> str:
        return self.config_fn if fp8 or self.bf16_config_fn is None else self.bf16_config_fn


FLAVOURS: tuple[Flavour, ...] = (
    Flavour("llama3", "8B", "llama3_8b", "llama3-8b", _registry_shape(32, 4096, 32, 8, 128, 14336, 128256)),
    Flavour("llama3", "70B", "llama3_70b", "llama3-70b", _registry_shape(80, 8192, 64, 8, 128, 28672, 128256)),
    # llama3_405b builds Float8Linear unconditionally: bf16 plans start from llama3_70b's recipe
    Flavour("llama3", "405B", "llama3_405b", "llama3.1-405b", _registry_shape(126, 16384, 128, 8, 128, 53248, 128256),
            bf16_config_fn="llama3_70b"),
    Flavour("qwen3", "30B-A3B", "qwen3_30b_a3b", "qwen3-30b-a3b",
            _registry_shape(48, 2048, 32, 4, 128, 6144, 151936, qk_norm=True, moe=(128, 8, 768, 0, 0, 0, 1, False))),
    # 235B-A22B is in qwen3's model_registry with no config_registry recipe of its own: it trains from
    # 30B-A3B's recipe with the model swapped (the generated module sets config.model_spec)
    Flavour("qwen3", "235B-A22B", "qwen3_30b_a3b", "qwen3-235b-a22b",
            _registry_shape(94, 4096, 64, 4, 128, 12288, 151936, qk_norm=True, moe=(128, 8, 1536, 0, 0, 0, 1, False))),
    Flavour("deepseek_v3", "671B", "deepseek_v3_671b", "deepseek-v3",
            _registry_shape(61, 7168, 128, 128, 56, 18432, 129280, mla=(1536, 512, 128, 64, 128),
                            moe=(256, 8, 2048, 1, 2048, 3, 1, False)),
            (("rope_scaling.mscale_all_dim", 1.0),)),
)
_FLAVOUR_BY_SHAPE = {f.shape: f for f in reversed(FLAVOURS)}  # the first flavour of a shape wins


def flavour_for(spec) -> Flavour | None:
    """The registry flavour whose architecture `spec` has (by shape, whatever the model is called):
    one shape tuple and one dict look-up (the search asks once per model)."""
    return _FLAVOUR_BY_SHAPE.get(_shape(spec))


def no_flavour_reason(spec) -> str | None:
    """Why torchtitan cannot build `spec` at all (None = a registry flavour has its shape)."""
    if flavour_for(spec) is not None:
        return None
    known = ", ".join(f"{f.module} {f.flavor} ({f.preset})" for f in FLAVOURS)
    return (f"{spec.name} has the shape of no torchtitan 0.3 model_registry flavour, so no config_registry entry "
            f"builds it (torchtitan builds models from Python configs, not flags; supported: {known}); use "
            "--framework megatron")


def model_refusals(spec) -> list[str]:
    """Why torchtitan cannot train model `spec` in any layout (empty = it can): no flavour has its
    shape, the generated config module cannot set what it differs in, or it has MTP layers."""
    reason = no_flavour_reason(spec)
    if reason:
        return [reason]
    out = []
    if spec.sliding_window is not None:
        out.append(f"sliding window {spec.sliding_window}: torchtitan's attention configs have no window; use "
                   "--framework megatron")
    if spec.rotary_percent != 1.0:
        out.append(f"rotary percent {spec.rotary_percent}: torchtitan rotates the whole head dim")
    sc = spec.rope_scaling
    if sc is not None and sc.type == "yarn" and sc.mscale != sc.mscale_all_dim:
        out.append(f"YaRN mscale {sc.mscale} != mscale_all_dim {sc.mscale_all_dim}: torchtitan's RoPE has no "
                   "cos/sin magnitude scaling")
    flavour = flavour_for(spec)
    for path, value in flavour.fixed:
        head, _, attr = path.partition(".")
        got = getattr(getattr(spec, head), attr) if attr and getattr(spec, head) is not None else None
        if got is not None and got != value:
            out.append(f"{path} {got}: torchtitan's {flavour.module} {flavour.flavor} fixes it at {value}")
    if spec.mtp_layers:
        out.append(f"{spec.mtp_layers} MTP layer(s): torchtitan's {spec.name} config builds no MTP module and no "
                   "flag adds one; use --framework megatron")
    kinds = [what for what, present in (
        ("per-layer mixers or feed-forward blocks (layer_pattern / ffn_pattern)", spec.is_hybrid),
        ("attention sinks", spec.attention_sinks), ("a gated attention output", spec.attention_output_gate),
        ("chunked attention", spec.attention_chunk_size is not None), ("a DSA indexer", spec.indexer is not None),
        (f"{spec.activation} MLPs", spec.activation == "relu2")) if present]
    if kinds:
        out.append(f"{', '.join(kinds)}: the {flavour.module} {flavour.flavor} flavour's layers are uniform "
                   "attention + MLP blocks without them; use --framework megatron or deepspeed")
    return out


def plan_refusals(model_spec, gpus: int, plan) -> list[str]:
    """Every reason torchtitan cannot run `plan` of a model it can build, beyond the plan validator's
    rules (empty = exportable); the search filters by these and the exporter refuses with them."""
    out = []
    if plan.zero == 0 and plan.cp > 1:
        out.append("zero 0 with cp > 1: torchtitan always shards parameters over dp_shard·cp (FSDP over the cp "
                   "ranks); use zero 2 or 3")
    if plan.zero == 0 and plan.zero_shard_size is not None:
        out.append("zero_shard_size with zero 0: nothing is sharded; drop it or use zero 2/3")
    dp = gpus // (plan.tp * plan.pp * plan.cp)
    shard = 1 if plan.zero == 0 else (plan.zero_shard_size or dp)
    if plan.ep > 1 and (shard * plan.cp * plan.tp) % plan.ep:
        out.append(f"ep {plan.ep} must divide dp_shard·cp·tp = {shard}·{plan.cp}·{plan.tp} (torchtitan borrows "
                   "expert ranks from FSDP and TP); change ep or the sharding")
    moe = model_spec.moe is not None
    expert_tp = plan.etp if plan.etp is not None else plan.tp
    if moe and expert_tp != (1 if plan.ep > 1 else plan.tp):
        out.append(f"etp {expert_tp}: torchtitan shards experts by ep alone when ep > 1 (etp 1) and by tp when "
                   "ep = 1 (etp = tp); set etp accordingly")
    if moe and plan.ep > 1 and plan.moe_dispatcher == "allgather":  # flex: the shared rule (schema/rules.py)
        out.append("moe dispatcher allgather: torchtitan dispatches tokens to experts with all-to-all")
    if plan.moe_capacity_factor is not None:
        out.append("moe capacity factor: torchtitan's MoE is dropless; drop the capacity factor")
    if plan.cp > 1 and plan.cp_comm_type != "allgather":
        out.append(f"cp_comm_type {plan.cp_comm_type}: torchtitan's context parallelism all-gathers K/V (torch's "
                   "default rotate method); plan cp_comm_type allgather")
    if str(plan.recompute.mode) == "full" and plan.recompute.num_layers is not None:
        out.append(f"full recompute of {plan.recompute.num_layers} layers per stage: torchtitan checkpoints every "
                   "block or none; use full recompute of every layer")
    return out


SPEC = FrameworkSpec(
    name="torchtitan", title="torchtitan",
    # none: torchao's MX training converter (mxfp8 on Blackwell) is not written by autopar's export yet,
    # and torchtitan has no NVFP4 training recipe
    block_scaled_precisions=(),
    zero_stages=(0, 2, 3), default_zero=3,
    zero_sharded=((0, ()), (2, ("optimizer", "gradients", "weights")), (3, ("optimizer", "gradients", "weights"))),
    searched_zero_stages=(0, 2, 3),
    cp_comm_types=("allgather",), default_cp_comm_type="allgather",
    default_torch_compile=True, selective_label="selective(op)",
    state_bytes_per_param=(4.0, 4.0, 8.0), zero2_keeps_weights_gathered=True, pp_keeps_stage_unsharded=True,
    layer_split="torchtitan",
    checkpoint_bytes_per_param=12.0, async_checkpoint=True,
    profile=PROFILE, releases=(("2024-12", DEC_2024),),
    model_refusals=model_refusals, plan_refusals=plan_refusals,
    exporter="autopar.export:torchtitan_files",
)
