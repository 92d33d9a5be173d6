"""DeepSpeed: the engine with ZeRO 0-3 and PipelineModule, training the Hugging Face model autopar
exports (its measured runs of 2021-23 ran Megatron-DeepSpeed's GPT: releases below).

Axes: dp and pp only. The engine has no tensor, context or expert parallelism (Megatron-DeepSpeed
adds them) and no interleaved schedule; PipelineModule partitions the layers evenly and runs only
with ZeRO 0 or 1. ZeRO stage 1 is the default (the optimizer-state partitioning Megatron-DeepSpeed
uses); bytes per parameter 2 + 2 + 12 = 16 (Rajbhandari et al. 2020, ZeRO §3 "2Ψ + 2Ψ + KΨ",
K = 12): stage 1 shards the optimizer, 2 adds gradients, 3 adds weights.

Cost profile, per field (sources):
- attention kernel: the Hugging Face model's SDPA, flash-attn 2 (Megatron-DeepSpeed's GPT uses
  flash-attn 2 when asked, --use-flash-attn-v2, and unfused attention otherwise: the graph marks
  unfused attention by its dropout).
- selective recompute: activation checkpointing (Megatron-DeepSpeed) follows Megatron's; the
  engine itself recomputes whole layers only.
- loss: the exported model's loss (transformers loss_utils.ForCausalLMLoss: logits.float(), then
  cross_entropy) keeps its log-softmax output and allocates an fp32 gradient of the logits at the
  start of backward, and its output keeps the bf16 logits; it runs eager, moving the bytes per logit
  of torchtitan's eager loss (autopar.frameworks.torchtitan.EAGER_LOSS_BYTES). Megatron-DeepSpeed's GPT
  runs Megatron's unfused vocab-parallel cross-entropy (autopar.frameworks.megatron.UNFUSED_LOSS_BYTES;
  megatron/core/tensor_parallel/cross_entropy.py of microsoft/Megatron-DeepSpeed: the same passes).
- gradients: fp16/bf16 gradient partitions, resident.
- parameter gathers: ZeRO-3 gathers per module (each nn.Linear / LayerNorm's parameters when its
  forward pre-hook fires; Rajbhandari et al. 2020 §5), so a full-recompute backward runs the
  module hooks again (forward, recompute, backward: three gathers). It prefetches at most
  stage3_prefetch_bucket_size parameters ahead (default 5e7, DeepSpeed config docs, ZeRO section),
  so a module larger than that is gathered only when it is needed; it frees each module's gathered
  weights after it runs (release_sub_module; a module is kept only when reused within
  stage3_max_reuse_distance = 1e9 elements, shorter than a large model's layer), so it holds the
  computing module's 16-bit weights and its 16-bit gradient until the gradient is reduce-scattered
  (4 bytes per module parameter). Parameters smaller than stage3_param_persistence_threshold
  (default 1e5 elements, deepspeed/runtime/zero/constants.py since v0.3.13) stay unpartitioned:
  norms and biases are never gathered.
- checkpoints: save_checkpoint writes the 16-bit module weights (mp_rank_*_model_states.pt) and
  each rank's ZeRO partition of the fp32 master weights and two Adam moments
  (*_optim_states.pt): 2 + 12 = 14 bytes per parameter, synchronously (the engine has no
  background save).
- TP backward: Megatron-DeepSpeed's tp all-reduce, charged as the forward.
- elementwise kernels: the Hugging Face model's eager code (LlamaRMSNorm upcasts to fp32, the MLP is
  act(gate)·up; it compiles only when the training script calls engine.compile()). LayerNorm and
  GELU are one ATen kernel each, so the GPT models of the measured runs move the same bytes either
  way.
- release "megatron-deepspeed" (microsoft/Megatron-DeepSpeed, vTrain's runs): DeepSpeed running
  Megatron's own GPT, with its fused kernels and vocab-parallel cross-entropy instead of a Hugging
  Face model, and Megatron-LM's pipeline scatter/gather.
- release "0.3", DeepSpeed 0.3.13-0.5.5 (March-October 2021, the SC'21 ZeRO-3 runs, also
  Megatron-DeepSpeed) on PyTorch <= 1.8: partition_parameters._allgather_param calls
  torch.cuda.synchronize() before every parameter all-gather and fetch_sub_module waits for it, so
  gathers never overlap compute ("the async version is not async at all", DeepSpeed PR #1188, Oct
  2021); and it passes torch.distributed.all_gather / reduce_scatter a list of one tensor per rank,
  which ProcessGroupNCCL (torch/lib/c10d/ProcessGroupNCCL.cpp, allgather/reduce_scatter) serves
  through a flat buffer and one copy_ per rank (same PR: "torch.distributed.all_gather will do
  implicit memcpy"; fixed with _all_gather_base in v0.5.6); the list-form collective's flat copy
  adds 2 bytes per gathered parameter (ProcessGroupNCCL newLikeFlat): 6 bytes.
  Its persistent parameters are partitioned with the rest at the end of backward
  (stage3.py _partition_all_parameters, release_and_reset_parameter on every named parameter) and
  gathered again after every step (_post_step: persistent_parameters[0].all_gather(...)), through
  partition_parameters._allgather_params: one all_gather of their slices, then for each parameter
  and each rank a narrow(...).copy_() into the replicated tensor, one copy kernel per parameter
  per rank (v0.3.13 to v0.5.4; v0.5.5 coalesced it).
"""

from __future__ import annotations

from dataclasses import replace

from autopar.frameworks.base import FrameworkProfile, FrameworkSpec
from autopar.frameworks.megatron import UNFUSED_LOSS_BYTES
from autopar.frameworks.torchtitan import EAGER_LOSS_BYTES

PROFILE = FrameworkProfile(
    name="deepspeed", version="DeepSpeed 0.3-0.19 (measured runs: Megatron-DeepSpeed; export: Hugging Face models)",
    attention_kernel_by_arch=(("ampere", "fa2"), ("hopper", "fa2"), ("blackwell", "fa2")),
    selective_policy="kept", fused_cross_entropy=False, persistent_gradients=True,
    fp8_one_byte_saved_inputs=False, gather_unit="module", gathers_under_full_recompute=3, prefetch_depth=1,
    prefetch_max_params=5e7, persistence_threshold_params=1e5, elementwise="eager",
    loss_bytes_per_logit=EAGER_LOSS_BYTES)

# Megatron-DeepSpeed's GPT recomputes selectively as Megatron does (its --recompute-granularity selective).
MEGATRON_DEEPSPEED = replace(PROFILE, version="DeepSpeed 0.9+ running Megatron-DeepSpeed's GPT",
                             selective_policy="modules", fused_cross_entropy=True, elementwise="fused", pipeline_scatter_gather=True,
                             loss_bytes_per_logit=UNFUSED_LOSS_BYTES)

V0_3 = replace(PROFILE, version="DeepSpeed 0.3.13-0.5.5 (2021) on PyTorch <= 1.8, Megatron-DeepSpeed",
               selective_policy="modules", synchronous_gathers=True, per_rank_copies=True, persistent_regather=True,
               gathered_bytes_per_unit_param=6.0,
               elementwise="fused", fused_cross_entropy=True, pipeline_scatter_gather=True,
               loss_bytes_per_logit=UNFUSED_LOSS_BYTES)


def plan_refusals(model_spec, gpus: int, plan) -> list[str]:
    """Every reason the DeepSpeed engine cannot run `plan` beyond the plan validator's rules
    (empty = exportable); the search filters by these and the exporter refuses with them."""
    out = []
    for axis in ("tp", "cp", "ep"):
        if getattr(plan, axis) > 1:
            out.append(f"{axis} {getattr(plan, axis)}: the DeepSpeed engine has no tensor, context or expert "
                       "parallelism (Megatron-DeepSpeed adds them); export to megatron or set it to 1")
    if plan.vpp > 1:
        out.append(f"vpp {plan.vpp}: PipelineModule runs one stage per rank (no interleaved schedule); set vpp 1")
    if str(plan.precision) == "fp8":
        out.append("fp8: the DeepSpeed engine trains in bf16 or fp16, fp8 GEMMs need Transformer Engine; use bf16")
    if plan.zero_shard_size is not None:
        out.append("zero_shard_size: DeepSpeed 0.19 removed MiCS hybrid sharding (ZeRO++ hpZ only splits the "
                   "secondary weight copy); drop zero_shard_size")
    stages = plan.pp * plan.vpp
    counts = plan.layers_per_stage
    uneven = len(set(counts)) > 1 if counts is not None else model_spec.num_layers % stages != 0
    if plan.pp > 1 and uneven:
        shown = list(counts) if counts is not None else f"{model_spec.num_layers} over pp {plan.pp}"
        out.append(f"layers per stage {shown}: PipelineModule partitions the decoder layers evenly; "
                   "use a layer count divisible by pp or export to megatron")
    if plan.pp > 1 and (model_spec.position_embedding == "learned" or model_spec.normalization == "layernorm"):
        # the exported train_deepspeed.py cuts a Llama-family decoder (.layers, .norm, .rotary_emb)
        out.append(f"pp {plan.pp}: the exported training script's PipelineModule takes a decoder with rotary "
                   "embeddings and a final RMSNorm (transformers' Llama family); this model's GPT-2/NeoX-style "
                   "decoder has not those; set pp 1 or export to megatron")
    rc = plan.recompute
    if str(rc.mode) == "selective" and set(rc.modules) != {"core_attn"}:
        out.append(f"selective recompute of {', '.join(rc.modules)}: DeepSpeed recomputes whole layers only; "
                   "use full, none or selective core_attn")
    if str(rc.mode) == "full" and rc.num_layers is not None and plan.pp > 1:
        out.append(f"full recompute of {rc.num_layers} layers per stage: PipelineModule checkpoints every "
                   "`activation_checkpoint_interval` layers; use full recompute of every layer")
    if plan.moe_capacity_factor is not None:
        out.append("moe capacity factor: the DeepSpeed engine has no MoE routing settings; drop it")
    return out


SPEC = FrameworkSpec(
    name="deepspeed", title="DeepSpeed",
    zero_stages=(0, 1, 2, 3), default_zero=1,
    zero_sharded=((0, ()), (1, ("optimizer",)), (2, ("optimizer", "gradients")),
                  (3, ("optimizer", "gradients", "weights"))),
    searched_zero_stages=(0, 1, 2, 3),
    cp_comm_types=(), default_cp_comm_type="p2p",
    offers_tp=False, offers_ep=False, offers_interleaving=False, offers_fp8=False,
    even_layer_split=True, max_zero_with_pp=1,
    state_bytes_per_param=(2.0, 2.0, 12.0), checkpoint_bytes_per_param=14.0, async_checkpoint=False,
    profile=PROFILE, releases=(("0.3", V0_3), ("megatron-deepspeed", MEGATRON_DEEPSPEED)),
    plan_refusals=plan_refusals,
    exporter="autopar.export:deepspeed_files", importer="autopar.export.importers:plan_from_deepspeed_config",
)
