"""What a training framework does differently, as the cost model needs it: which attention kernel
it launches, how it checkpoints "selective", whether its loss is fused, whether gradients stay
resident, how ZeRO-3/FSDP gathers parameters. One profile per framework (and the version the
shipped numbers describe); the cost terms read the profile, never the framework's name.

Sources, per field:
- attention kernel: Megatron-Core runs Transformer Engine's DotProductAttention, whose default
  backend on Hopper is cuDNN's fused flash attention and on Ampere flash-attn 2 (TE 1.x docs,
  "Attention backends"); torchtitan calls torch SDPA, whose flash backend is FlashAttention-2
  (PyTorch 2.5 docs, torch.nn.attention.SDPBackend); DeepSpeed's Megatron-DeepSpeed GPT uses
  flash-attn 2 when asked (--use-flash-attn-v2) and unfused attention otherwise (the graph marks
  unfused attention by its dropout). `autopar profile` measurements override every family.
- selective recompute: Megatron --recompute-granularity selective drops the tensors of the listed
  modules (Korthikanti et al. 2022 §5); torchtitan's selective AC "op" policy
  (torchtitan/models/llama3/parallelize: _save_list of mm and SDPA, every second mm recomputed)
  keeps the SDPA outputs, the block input and every second matmul output and recomputes the rest;
  DeepSpeed's activation checkpointing (Megatron-DeepSpeed) follows Megatron's.
- loss: Megatron's vocab-parallel cross-entropy works in place on the fp32 logits (as does
  Megatron-DeepSpeed's GPT, which reuses it); torchtitan calls torch.nn.functional.cross_entropy on
  the fp32-cast logits, which keeps its log-softmax output and allocates an fp32 gradient of the
  logits at the start of backward; so does the Hugging Face model the DeepSpeed export runs
  (transformers loss_utils.ForCausalLMLoss: logits.float(), then cross_entropy), whose output
  also keeps the bf16 logits.
- gradients: Megatron keeps an fp32 main-grad buffer (--accumulate-allreduce-grads-in-fp32);
  DeepSpeed keeps fp16/bf16 gradient partitions; FSDP2 frees sharded gradients at zero_grad
  (set_to_none), so no gradient is resident at the forward/backward peak of the first microbatch.
- fp8: Transformer Engine saves the fp8 casts (1 byte) of GEMM inputs for the weight gradient;
  torchao's float8 linears save the bf16 inputs and re-cast them (torchao float8 README; the
  tensorwise linears of Dec 2024 kept fp8 casts, not credited in memory here). In both,
  fp8 covers the transformer layers' linears, each casting its operands (autopar.cost.layer
  fp8_cast_bytes); the output layer and the router run in bf16. How they cast (fp8_casts): TE casts
  input and output gradient with fused cast-transpose kernels and caches the weights' casts over
  the step's microbatches ("te"); torchao scales dynamically, an amax pass and a cast per tensor on
  every call, the weights included, with the bytes torchao's own roofline model gives them:
  tensorwise in torchtitan of Dec 2024 (torchao eab345c: each operand cast once into both layouts
  and saved in fp8), rowwise in torchtitan 0.3 (its only recipe: each operand cast again in
  backward along the axis its GEMM needs).
- parameter gathers: DeepSpeed ZeRO-3 gathers per module (each nn.Linear / LayerNorm's
  parameters when its forward pre-hook fires; Rajbhandari et al. 2020 §5), so a full-recompute
  backward runs the module hooks again (forward, recompute, backward: three gathers); FSDP2
  gathers one transformer block at a time (fully_shard per block) with one block of prefetch, and
  the recompute of an AC-wrapped block runs inside the block's unsharded backward (two gathers).
  DeepSpeed prefetches at most stage3_prefetch_bucket_size parameters ahead (default 5e7, DeepSpeed
  config docs, ZeRO section), so a module larger than that is gathered only when it is needed.
  Gathered memory: FSDP2 and Megatron-FSDP hold the computing block and the prefetched one in bf16
  (4 bytes per block parameter); DeepSpeed frees each module's gathered weights after it runs
  (release_sub_module; a module is kept only when reused within stage3_max_reuse_distance = 1e9
  elements, shorter than a large model's layer) and does not prefetch a module above the prefetch
  bucket, so it holds the computing module's 16-bit weights and its 16-bit gradient until the
  gradient is reduce-scattered (4 bytes per module parameter); DeepSpeed 0.3 adds the flat copy the
  list-form collective allocates (ProcessGroupNCCL newLikeFlat): 6 bytes.
  DeepSpeed keeps parameters smaller than stage3_param_persistence_threshold (default 1e5 elements,
  deepspeed/runtime/zero/constants.py since v0.3.13) unpartitioned: norms and biases are never gathered.
- TP backward under sequence parallelism: Megatron's column-parallel linear
  (megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication, since
  the sequence-parallel work of 2022; Transformer Engine's Linear does the same) saves its
  sp-split input, re-gathers it with an async all-gather behind the dgrad GEMM and launches the
  input gradient's reduce-scatter async behind the wgrad GEMM. torchtitan's DTensor TP (no async
  TP by default) and Megatron-DeepSpeed's tp all-reduce are charged as the forward.
- releases: where an older release of a framework behaved differently and measured runs used it, a
  release profile describes it (FRAMEWORK_RELEASES; a plan names it in `framework_release`).
  torchtitan of December 2024 (commit 9dec370 with torchao eab345c, the torchtitan-2412 runs):
  float8 linears with dynamic tensorwise scaling, the default then (--float8.scaling_type_* dynamic);
  torchtitan 0.3's Float8LinearConverter offers rowwise recipes only.
  Megatron-LM before Megatron-Core's pipeline (commit 27fc468 of January 2021 to 3c92fa9 of March
  2023; the SC'21 and 2022 runs): without sequence parallelism a stage-boundary send is split over
  the tp ranks and all-gathered on receipt (p2p_communication.py, scatter_gather_tensors_in_pipeline;
  Narayanan et al. SC'21 §4.1); Megatron-Core sends the whole tensor.
  Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, vTrain's runs): DeepSpeed running Megatron's own
  GPT, with its fused kernels and vocab-parallel cross-entropy instead of a Hugging Face model, and
  Megatron-LM's pipeline scatter/gather.
  DeepSpeed 0.3.13-0.5.5 (March-October 2021, the SC'21 ZeRO-3 runs, also Megatron-DeepSpeed) on PyTorch <= 1.8:
  partition_parameters._allgather_param calls torch.cuda.synchronize() before every parameter
  all-gather and fetch_sub_module waits for it, so gathers never overlap compute ("the async version
  is not async at all", DeepSpeed PR #1188, Oct 2021); and it passes torch.distributed.all_gather /
  reduce_scatter a list of one tensor per rank, which ProcessGroupNCCL (torch/lib/c10d/
  ProcessGroupNCCL.cpp, allgather/reduce_scatter) serves through a flat buffer and one copy_ per
  rank (same PR: "torch.distributed.all_gather will do implicit memcpy"; fixed with
  _all_gather_base in v0.5.6).
- context parallelism: Megatron-Core hands CP to Transformer Engine's attention (--cp-comm-type
  p2p/a2a/allgather), which moves K/V with their own (grouped) heads. torchtitan (9dec370, Dec 2024)
  runs PyTorch's ring attention (torch/distributed/tensor/experimental/_attention.py at torch
  1963fc8): it replaces F.scaled_dot_product_attention, so it sees the K/V that torchtitan's Llama
  has already repeated to the query heads (models/llama/model.py repeat_kv before SDPA); its
  "allgather" rotate method (torchtitan's default, --experimental.context_parallel_rotate_method)
  gathers every rank's K/V once, behind the first SDPA step; it merges each step's output and
  log-sum-exp into an fp32 running output (_SDPAMerger, convert_to_f32=True), accumulates dq/dk/dv
  in fp32 and passes the running fp32 dK/dV to the next rank after every backward step
  (_AllToAllRotater), waiting for the last one right after the loop. torchtitan compiles each
  block (parallelize_llama.apply_compile, fullgraph), and a functional collective traced by
  torch.compile is waited on right where it is issued (torch/distributed/_functional_collectives.py
  _maybe_wrap_tensor: wait_tensor when tracing; Inductor's reorder_for_compute_comm_overlap is off
  by default), so none of these transfers overlaps an SDPA step. Under CP torchtitan restricts
  SDPA to the flash and memory-efficient backends (utils.get_train_context) and flash (FA2) is
  chosen; without CP flash is chosen too, cuDNN SDPA being opt-in since pytorch#138522.
- elementwise kernels: Megatron-Core fuses the norms (Transformer Engine / Apex), RoPE
  (--apply-rope-fusion, on by default) and the bias-activation (--bias-swiglu-fusion /
  --bias-gelu-fusion, on by default) whatever else is set, as the 2021 Megatron-DeepSpeed of the
  ZeRO-3 baselines did with its fused kernels; torchtitan writes them as plain PyTorch
  (models/norms.py RMSNorm with an fp32 upcast, complex-number RoPE, silu·mul) and fuses them only
  under torch.compile (plan field torch_compile, --compile.enable); the DeepSpeed engine runs the
  Hugging Face model autopar exports, whose LlamaRMSNorm upcasts to fp32 and whose MLP is
  act(gate)·up in eager PyTorch (it compiles only when the training script calls engine.compile()).
  Eager, each op is a kernel reading and writing HBM (autopar.model.build EAGER_*_BYTES); LayerNorm
  and GELU are one ATen kernel each, so the GPT models of the measured DeepSpeed runs move the same
  bytes either way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class FrameworkProfile:
    name: str
    version: str
    attention_kernel_by_arch: tuple[tuple[str, str], ...]  # (GPU architecture, kernel family)
    selective_policy: str  # "modules" (Megatron list) | "op_sac" (torchtitan per-op policy)
    fused_cross_entropy: bool
    persistent_gradients: bool
    fp8_one_byte_saved_inputs: bool
    gather_unit: str  # "module" | "block": granularity of ZeRO-3/FSDP parameter all-gathers
    gathers_under_full_recompute: int  # parameter all-gathers per microbatch with full recompute
    prefetch_depth: int  # chunks gathered ahead of the one computing
    prefetch_max_params: float | None = None  # a unit larger than this is not prefetched (None = any)
    persistence_threshold_params: float = 0.0  # parameters smaller than this are never partitioned
    synchronous_gathers: bool = False  # every parameter gather waits for the device: no prefetch overlap
    per_rank_copies: bool = False  # ZeRO-3 collectives copy each rank's slice with its own kernel
    gathered_bytes_per_unit_param: float = 4.0  # unsharded bytes alive per parameter of the largest gather unit
    cp_ring: str = "te"  # "te": Transformer Engine's CP attention | "torch": PyTorch's ring (fp32 merge, dK/dV ring)
    cp_repeats_kv_heads: bool = False  # CP moves K/V repeated to the query heads (GQA expanded before SDPA)
    cp_comm_overlapped: bool = True  # CP transfers run behind attention (False: waited where issued)
    tp_backward_overlap: bool = False  # sp backward: input re-gather / dgrad reduce-scatter behind dgrad / wgrad
    elementwise: str = "fused"  # norms, RoPE, activation: "fused" kernels | "eager" op by op | "compile": per plan
    fp8_casts: str = "te"  # how fp8 linears cast their operands (autopar.cost.layer.FP8_CAST_RECIPES)
    pipeline_scatter_gather: bool = False  # pp sends split over tp without sp, all-gathered on receipt

    def attention_kernel(self, arch: str) -> str:
        return dict(self.attention_kernel_by_arch).get(arch, "fa2")


FRAMEWORK_PROFILES: dict[str, FrameworkProfile] = {
    "megatron": FrameworkProfile(
        name="megatron", version="Megatron-Core 0.8-0.16 with Transformer Engine 1.x",
        attention_kernel_by_arch=(("ampere", "fa2"), ("hopper", "cudnn"), ("blackwell", "cudnn")),
        selective_policy="modules", fused_cross_entropy=True, persistent_gradients=True,
        fp8_one_byte_saved_inputs=True, gather_unit="block", gathers_under_full_recompute=2, prefetch_depth=1,
        tp_backward_overlap=True),
    "deepspeed": FrameworkProfile(
        name="deepspeed", version="DeepSpeed 0.3-0.19 (measured runs: Megatron-DeepSpeed; export: Hugging Face models)",
        attention_kernel_by_arch=(("ampere", "fa2"), ("hopper", "fa2"), ("blackwell", "fa2")),
        selective_policy="modules", fused_cross_entropy=False, persistent_gradients=True,
        fp8_one_byte_saved_inputs=False, gather_unit="module", gathers_under_full_recompute=3, prefetch_depth=1,
        prefetch_max_params=5e7, persistence_threshold_params=1e5, elementwise="eager"),
    "torchtitan": FrameworkProfile(
        name="torchtitan", version="torchtitan 0.3 with torchao 0.18 on PyTorch 2.9+",
        attention_kernel_by_arch=(("ampere", "fa2"), ("hopper", "fa2"), ("blackwell", "fa2")),
        selective_policy="op_sac", fused_cross_entropy=False, persistent_gradients=False,
        fp8_one_byte_saved_inputs=False, gather_unit="block", gathers_under_full_recompute=2, prefetch_depth=1,
        cp_ring="torch", cp_repeats_kv_heads=True, cp_comm_overlapped=False, elementwise="compile",
        fp8_casts="torchao_rowwise"),
}


# (framework, release) -> the profile of an older release that behaved differently (module docstring).
FRAMEWORK_RELEASES: dict[tuple[str, str], FrameworkProfile] = {
    ("megatron", "pre-core"): replace(
        FRAMEWORK_PROFILES["megatron"], version="Megatron-LM of 2021-22, before Megatron-Core's pipeline (March 2023)",
        pipeline_scatter_gather=True),
    ("deepspeed", "megatron-deepspeed"): replace(
        FRAMEWORK_PROFILES["deepspeed"], version="DeepSpeed 0.9+ running Megatron-DeepSpeed's GPT",
        fused_cross_entropy=True, elementwise="fused", pipeline_scatter_gather=True),
    ("deepspeed", "0.3"): replace(
        FRAMEWORK_PROFILES["deepspeed"], version="DeepSpeed 0.3.13-0.5.5 (2021) on PyTorch <= 1.8, Megatron-DeepSpeed",
        synchronous_gathers=True, per_rank_copies=True, gathered_bytes_per_unit_param=6.0, elementwise="fused",
        fused_cross_entropy=True, pipeline_scatter_gather=True),
    ("torchtitan", "2024-12"): replace(
        FRAMEWORK_PROFILES["torchtitan"],
        version="torchtitan 9dec370 (Dec 2024) with torchao eab345c on PyTorch 2.6 nightly",
        fp8_casts="torchao_tensorwise"),
}


def framework_profile(name: str, release: str | None = None) -> FrameworkProfile:
    """The profile of `name` (its current releases), or of an older `release` of it."""
    if release is None:
        return FRAMEWORK_PROFILES[name]
    return FRAMEWORK_RELEASES[(name, release)]


def gpu_arch(gpu_name: str) -> str:
    """ampere (A100), hopper (H100/H800/H200), blackwell (B200), from the profile's GPU name."""
    upper = gpu_name.upper()
    if "A100" in upper:
        return "ampere"
    if "B200" in upper or "B100" in upper or "GB200" in upper:
        return "blackwell"
    return "hopper"
