"""Megatron-LM (Megatron-Core with Transformer Engine): what a Megatron user gets.

Axes: tp, pp with interleaving (vpp), cp (Transformer Engine's --cp-comm-type p2p / a2a /
allgather), ep and etp, sequence parallelism. ZeRO: 1 is the distributed optimizer
(--use-distributed-optimizer), 2 and 3 are Megatron-FSDP (--data-parallel-sharding-strategy
optim_grads / optim_grads_params). The search leaves stage 3 out unless it is pinned
(autopar.search.space.zero_options says why).

Cost profile, per field (sources):
- attention kernel: Megatron-Core runs Transformer Engine's DotProductAttention, whose default
  backend on Hopper is cuDNN's fused flash attention and on Ampere flash-attn 2 (TE 1.x docs,
  "Attention backends"); on Blackwell cuDNN trains head dims up to 128 and MLA's 192/128 only, so
  a model with larger heads (Nemotron-4 340B's 192, Qwen3-Next's 256) runs flash-attn 2 there
  (TE_CUDNN_HEAD_DIM_LIMITS). `autopar profile` measurements override every family.
- selective recompute: --recompute-granularity selective drops the tensors of the listed modules
  (Korthikanti et al. 2022 §5).
- loss: the vocab-parallel cross-entropy works in place on the fp32 logits. Its HBM traffic per logit
  is counted from the code (UNFUSED_LOSS_BYTES / FUSED_LOSS_BYTES below); autopar's export passes
  --cross-entropy-loss-fusion (the plan's cross_entropy_fusion, on unless turned off).
- gradients: an fp32 main-grad buffer (--accumulate-allreduce-grads-in-fp32), resident; bytes per
  parameter of (weights, gradients, optimizer) 2 + 4 + 12 = 18 (Megatron-LM docs,
  distrib_optimizer.md); with --grad-reduce-in-bf16 (mcore DistributedDataParallelConfig
  grad_reduce_in_fp32 False; NeMo optim.grad_sync_dtype bf16) the gradient buffer is bf16.
- fp8: Transformer Engine saves the fp8 casts (1 byte) of GEMM inputs for the weight gradient, casts
  input and output gradient with fused cast-transpose kernels and caches the weights' casts over
  the step's microbatches ("te"); the output layer and the router run in bf16.
- parameter gathers (Megatron-FSDP): one transformer block at a time with one block of prefetch,
  the recompute of a checkpointed block inside its unsharded backward (two gathers); it holds the
  computing block and the prefetched one in bf16 (4 bytes per block parameter).
- TP backward under sequence parallelism: the column-parallel linear
  (megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication, since
  the sequence-parallel work of 2022; Transformer Engine's Linear does the same) saves its sp-split
  input, re-gathers it with an async all-gather behind the dgrad GEMM and launches the input
  gradient's reduce-scatter async behind the wgrad GEMM.
- context parallelism: handed to Transformer Engine's attention, which moves K/V with their own
  (grouped) heads, overlapped with the attention steps.
- elementwise kernels: fused norms (Transformer Engine / Apex), RoPE (--apply-rope-fusion, on by
  default) and bias-activation (--bias-swiglu-fusion / --bias-gelu-fusion, on by default).
- checkpoints: distributed checkpointing (--ckpt-format torch_dist) writes the model's bf16
  weights and the distributed optimizer's fp32 main parameters and two Adam moments, 2 + 12 = 14
  bytes per parameter, every rank its shard; --async-save writes in the background once each
  rank's tensors are copied to host memory.
- tied embeddings under pp > 1 keep a second copy of the embedding on the last stage
  (shared_embedding all-reduce).
- release "pre-core", Megatron-LM before Megatron-Core's pipeline (commit 27fc468 of January 2021
  to 3c92fa9 of March 2023; the SC'21 and 2022 runs): without sequence parallelism a
  stage-boundary send is split over the tp ranks and all-gathered on receipt
  (p2p_communication.py, scatter_gather_tensors_in_pipeline; Narayanan et al. SC'21 §4.1);
  Megatron-Core sends the whole tensor.
- release "nemo-apex", NeMo 1.x with `optim.name: distributed_fused_adam` (every NeMo-Framework-
  Launcher training config of tag 24.07, until "switch to mcore's optimizer", 3dd35614 of Dec 2024;
  the dgxc-benchmarking 24.x recipes but Grok-1's): Apex's DistributedFusedAdam, which NeMo builds
  for a bf16 O2 model with an fp32 optimizer with store_params=False, store_param_remainders=True
  (megatron_base_model.py setup_optimization): it keeps the two fp32 Adam moments and the 16 low bits
  of each fp32 master weight (the bf16 weight holds the high 16), 4 + 4 + 2 = 10 bytes per parameter
  sharded over DP, where Megatron's distributed optimizer keeps a whole fp32 copy, 12.
"""

from __future__ import annotations

from dataclasses import replace

from autopar.frameworks.base import FrameworkProfile, FrameworkSpec

# The vocab-parallel cross-entropy's HBM bytes per logit (forward, backward), op by op from the code.
# Unfused (megatron/core/tensor_parallel/cross_entropy.py at core_r0.8.0, Megatron-LM's loss without
# --cross-entropy-loss-fusion; the same ops in megatron/mpu/cross_entropy.py of 2021 and in
# Megatron-DeepSpeed's copy): forward casts the bf16 logits to fp32 (2 + 4), reads them for the max (4),
# subtracts it (4 + 4), exponentiates (4 + 4), reads them for the sum (4) and divides by it in place
# (4 + 4): 38; backward scales the saved softmax by the loss gradient in place (4 + 4) and the cast's
# backward writes the gradient in bf16 (4 + 2): 14.
# Fused (--cross-entropy-loss-fusion: megatron/core/fusions/fused_cross_entropy.py, each step a
# jit_fuser = torch.compile kernel): cast and max in one (2 + 4), subtract-exp-sum in one (4 + 4), the
# division (4 + 4): 22; backward one kernel updating the saved softmax and writing the bf16 gradient
# (4 + 4 + 2): 10.
UNFUSED_LOSS_BYTES = (38.0, 14.0)
FUSED_LOSS_BYTES = (22.0, 10.0)

# Transformer Engine's UnfusedDotProductAttention (TE 2.x transformer_engine/pytorch/attention.py, the
# attention backend "unfused"; without dropout: a dropout model's graph prices its own unfused attention,
# autopar.model.build.UNFUSED_ATTENTION_BYTES_PER_SCORE), HBM bytes per score of the full s × s matrix each
# head materialises, forward: torch.baddbmm writes the bf16 scores (2); FusedScaleMaskSoftmax's causal
# kernel (scaled_upper_triang_masked_softmax, for key lengths 16 < s < 16384: softmax.py
# is_kernel_available) reads the lower triangle (2 × 1/2) and writes every probability (2); the AV
# torch.bmm reads them (2): 7. The backward moves twice that, as autopar.cost.layer prices every unfused
# pass: dP written by dO·Vᵀ (2), the softmax backward reads P and dP and writes dS (6), dQ and dK read
# dS (4), dV reads P (2): 14. Longer keys take PyTorch's softmax, which moves more; not priced.
TE_UNFUSED_BYTES_PER_SCORE = 7.0

# Transformer Engine's UnfusedDotProductAttention saves its bf16 softmax output P (s × s per head) for
# the backward (dV = Pᵀ·dO and the softmax backward; no dropout, so no mask or dropped copy): 2 bytes per
# score, dropped with the core_attn module (selective recompute) or the whole layer (full).
TE_UNFUSED_SAVED_BYTES_PER_SCORE = 2.0

# Head dims Transformer Engine's cuDNN backend trains (TE v2.16 transformer_engine/common/fused_attn/
# fused_attn.cpp nvte_get_fused_attn_backend, bf16/fp16 arbitrary-seqlen, training): on Hopper up to 256
# (cuDNN 9.5+); on Blackwell up to 128, and MLA's 192/128 (cuDNN 9.11+, added in TE 2.5 by #1797). Above
# that Transformer Engine leaves Blackwell to FlashAttention (dot_product_attention/utils.py
# get_attention_backend: flash-attn 2 takes head dims up to 256 on sm100; FlashAttention 3 is Hopper's).
TE_CUDNN_HEAD_DIM_LIMITS = (("hopper", 256, ()), ("blackwell", 128, ((192, 128),)))

PROFILE = FrameworkProfile(
    name="megatron", version="Megatron-Core 0.8-0.16 with Transformer Engine 1.x",
    attention_kernel_by_arch=(("ampere", "fa2"), ("hopper", "cudnn"), ("blackwell", "cudnn")),
    kernel_head_dim_limits=TE_CUDNN_HEAD_DIM_LIMITS,
    selective_policy="modules", fused_cross_entropy=True, persistent_gradients=True,
    fp8_one_byte_saved_inputs=True, gather_unit="block", gathers_under_full_recompute=2, prefetch_depth=1,
    tp_backward_overlap=True, loss_bytes_per_logit=FUSED_LOSS_BYTES, unfused_loss_bytes_per_logit=UNFUSED_LOSS_BYTES)

# No fused cross-entropy yet (it came with Megatron-Core): the unfused loss whatever the plan says.
PRE_CORE = replace(PROFILE, version="Megatron-LM of 2021-22, before Megatron-Core's pipeline (March 2023)",
                   pipeline_scatter_gather=True, loss_bytes_per_logit=UNFUSED_LOSS_BYTES)

NEMO_APEX = replace(PROFILE, version="NeMo 1.x with Apex DistributedFusedAdam (store_param_remainders)",
                    optimizer_bytes_per_param=10.0)

def refuses_plans_of(model_spec) -> bool:
    """Whether plan_refusals can refuse a plan of this model: only models with Mamba-2 layers."""
    return model_spec is not None and "M" in (model_spec.layer_pattern or "")


def plan_refusals(model_spec, gpus: int, plan) -> list[str]:
    """What Megatron-Core 0.16's hybrid stack cannot run for a model with Mamba-2 layers
    (megatron/core/ssm/mamba_block.py _select_layers_for_pipeline_parallel): interleaved stages,
    and layer splits other than even with the first and last stage apart
    (--decoder-first/last-pipeline-num-layers); every other plan is checked by megatron_rules."""
    if not refuses_plans_of(model_spec):
        return []
    out = []
    if plan.vpp > 1:
        out.append(f"vpp {plan.vpp}: Megatron's hybrid (Mamba) stack has no interleaved pipeline; use vpp 1")
    counts = getattr(plan, "layers_per_stage", None)
    if counts is not None and len(set(counts[1:-1])) > 1:
        out.append(f"layers per stage {list(counts)}: Megatron's hybrid stack splits the middle stages evenly "
                   "(only the first and last may differ); even out the middle stages")
    return out


SPEC = FrameworkSpec(
    name="megatron", title="Megatron-LM (Megatron-Core)",
    # --fp8-recipe mxfp8 and --fp4-format e2m1 --fp4-recipe nvfp4 (megatron/training/arguments.py,
    # core_r0.14.0 and later: Transformer Engine 2.x MXFP8BlockScaling / NVFP4BlockScaling)
    block_scaled_precisions=("mxfp8", "nvfp4"),
    zero_stages=(0, 1, 2, 3), default_zero=1,
    zero_sharded=((0, ()), (1, ("optimizer",)), (2, ("optimizer", "gradients")),
                  (3, ("optimizer", "gradients", "weights"))),
    searched_zero_stages=(0, 1, 2),
    cp_comm_types=("p2p", "a2a", "allgather"), default_cp_comm_type="p2p",
    grad_reduce_in_bf16_settable=True, sequential_experts_settable=True, attention_backend_settable=True,
    shared_expert_overlap_settable=True, flex_dispatcher=True, default_cross_entropy_fusion=True,
    state_bytes_per_param=(2.0, 4.0, 12.0), tied_embedding_copy_with_pp=True,
    checkpoint_bytes_per_param=14.0, async_checkpoint=True,
    profile=PROFILE, releases=(("pre-core", PRE_CORE), ("nemo-apex", NEMO_APEX)), plan_refusals=plan_refusals,
    refuses_plans_of=refuses_plans_of,
    exporter="autopar.export:megatron_files", importer="autopar.export.importers:plan_from_megatron_args",
)
