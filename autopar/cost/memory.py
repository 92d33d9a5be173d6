"""Per-GPU memory terms: model states by framework and ZeRO stage, saved activations by recompute
mode, in-flight microbatches per pipeline schedule. Base units: bytes, counts.
"""

from __future__ import annotations

from autopar.model.graph import Layer
from autopar.frameworks import framework_spec
from autopar.frameworks.base import ZERO_STATES
from autopar.frameworks.megatron import TE_UNFUSED_SAVED_BYTES_PER_SCORE
from autopar.schema.plan import Framework

BF16 = 2.0

def model_state_bytes(params: float, framework: Framework, zero: int, shard: int,
                      grad_bytes: float | None = None, optimizer_bytes: float | None = None) -> dict[str, float]:
    """Weights, gradients and optimizer state of `params` parameters on one GPU, sharded over
    `shard` ranks by what ZeRO stage `zero` shards under `framework` (its FrameworkSpec: bytes per
    parameter of each state and the states each stage shards, sources in autopar.frameworks;
    e.g. Megatron 2 + 4 + 12, its distributed optimizer sharding the 12 optimizer bytes: 6 + 12/d);
    `grad_bytes` replaces the framework's gradient bytes per parameter (see main_grad_bytes), and
    `optimizer_bytes` its optimizer bytes (a release's FrameworkProfile.optimizer_bytes_per_param)."""
    spec = framework_spec(framework)
    w, g, o = spec.state_bytes_per_param
    g = g if grad_bytes is None else grad_bytes
    o = o if optimizer_bytes is None else optimizer_bytes
    sharded = spec.sharded_states(zero) if zero in spec.zero_stages else ZERO_STATES[:zero]
    return {
        "weights": params * w / (shard if "weights" in sharded else 1),
        "gradients": params * g / (shard if "gradients" in sharded else 1),
        "optimizer": params * o / (shard if "optimizer" in sharded else 1),
    }


def fsdp_transient_bytes(stage_params: float, unit_params: float, framework: Framework, zero: int,
                         bytes_per_unit_param: float, pp: int = 1) -> float:
    """Unsharded weights (and gradients) alive at once: ZeRO-3/FSDP holds `bytes_per_unit_param` per
    parameter of its largest gather unit (autopar.frameworks, gathered_bytes_per_unit_param);
    torchtitan's zero 2 (reshard_after_forward=False) keeps the stage's bf16 weights twice; with
    pp > 1 torchtitan keeps the whole stage unsharded (pipelined_held_bytes_per_param), at zero 2
    its gradients on top of the weights zero 2 holds anyway."""
    held = pipelined_held_bytes_per_param(framework, zero, pp)
    if zero == 2 and framework_spec(framework).zero2_keeps_weights_gathered:
        return (2.0 + held) * stage_params
    if zero >= 3 and held:
        return held * stage_params
    if zero >= 3:
        return bytes_per_unit_param * unit_params
    return 0.0


def fsdp_stage_held_bytes(stage_params: float, framework: Framework, zero: int, pp: int = 1) -> float:
    """The part of fsdp_transient_bytes that is linear in the stage's parameters (torchtitan's zero 2
    keeping its weights gathered, a pipelined stage kept unsharded): parameter-shaped tensors
    gathered once a step and held through it, which autopar counts with the model states, clear of
    fragmentation (the search's memory model adds the pipelined part per parameter and leaves the
    rest out, a lower bound); 0 where ZeRO-3 gathers one module at a time."""
    held = pipelined_held_bytes_per_param(framework, zero, pp)
    if zero == 2 and framework_spec(framework).zero2_keeps_weights_gathered:
        return (2.0 + held) * stage_params
    if zero >= 3 and held:
        return held * stage_params
    return 0.0


def pipelined_held_bytes_per_param(framework: Framework, zero: int, pp: int) -> float:
    """Bytes per stage parameter a framework whose sharded stage stays unsharded under pp > 1
    (FrameworkSpec.pp_keeps_stage_unsharded; torchtitan: sources in autopar.frameworks.torchtitan)
    holds through the step beyond what its ZeRO stage holds anyway: at ZeRO-3 the gathered 16-bit
    weights and the unsharded gradient accumulated in the reduce dtype (2 + 4 for torchtitan), at
    zero 2 (weights already gathered) the gradient alone; 0 otherwise. Linear in the parameters, so
    the search's memory model adds it per parameter (autopar.search.costs.state_bytes_per_param)."""
    if pp <= 1 or zero < 2 or not framework_spec(framework).pp_keeps_stage_unsharded:
        return 0.0
    return main_grad_bytes(framework, False) + (BF16 if zero >= 3 else 0.0)


def activation_divisor(split: str, tp: int, sp: bool) -> int:
    """How many ranks share a tensor of this split kind (see autopar.model.graph)."""
    if split == "tp":
        return tp
    if split == "sp":
        return tp if sp else 1
    return 1


# Inputs of the GEMMs that Transformer Engine runs in fp8: it saves their fp8 casts (1 byte per
# element, half the bf16 bytes) for the weight gradient (TE fp8 recipe; the output layer stays bf16).
FP8_SAVED_GEMM_INPUTS = frozenset({"attn_norm_output", "attn_context", "mlp_norm_output", "mlp_act_output",
                                   "expert_act_output", "shared_act_output"})


# The routed-expert tensor saved at the ETP-gathered size: the experts' first GEMM input. Megatron's
# alltoall dispatcher all-gathers the received tokens over the ETP group before the experts
# (token_dispatcher.py gather_from_sequence_parallel_region, MCore 0.9+, e.g. commit f1f03922) and
# the linear keeps that full-width input for its weight gradient; the experts' intermediate tensors
# are etp-split in width, so only this one grows by etp.
ETP_GATHERED_ACTIVATIONS = frozenset({"expert_input"})


def saved_activation_bytes(layer: Layer, tokens: float, seq_len: int, tp: int, sp: bool, recompute: str,
                           modules: tuple[str, ...] = (), fp8: bool = False, policy: str = "modules",
                           etp: int = 1, unfused_attention: bool = False) -> float:
    """Bytes `layer` saves for backward for `tokens` tokens on one GPU (tokens already divided by cp).

    recompute "full": only the layer input ("layer_input" tensors) is kept; "selective": tensors of
    the listed modules are dropped (policy "modules", Megatron), or under torchtitan's per-op policy
    ("op_sac") see op_sac_saved_bytes; "none": everything is kept. Source: Korthikanti et al. 2022
    §4 (34·sbh/t with selective, 2·sbh/t with full, under tp + sp). `fp8`: Transformer Engine's
    1-byte saved GEMM inputs (pass False for torchao float8, which saves bf16 inputs). `etp`: the
    expert tensor-parallel degree; the experts' input is saved gathered over it
    (ETP_GATHERED_ACTIVATIONS). `unfused_attention`: the plan's attention runs Transformer Engine's
    unfused path, which also saves its softmax output (TE_UNFUSED_SAVED_BYTES_PER_SCORE) in core_attn.
    """
    if recompute == "selective" and policy == "kept":  # nothing dropped: the HF model keeps every tensor
        recompute = "none"
    if recompute == "selective" and policy == "op_sac" and layer.kind in ("dense", "moe"):
        return op_sac_saved_bytes(layer, tokens, tp, sp)
    total = 0.0
    keys = layer.scored_keys(seq_len)
    for act in layer.activations:
        if recompute == "full" and act.module != "layer_input":
            continue
        if recompute == "selective" and act.module in modules:
            continue
        per_token = act.bytes_per_token + act.bytes_per_token_per_seq * keys
        if fp8 and act.name in FP8_SAVED_GEMM_INPUTS:
            per_token /= 2
        if act.name in ETP_GATHERED_ACTIVATIONS:
            per_token *= etp
        total += per_token * tokens / activation_divisor(act.split, tp, sp)
    dropped = recompute == "full" or (recompute == "selective" and "core_attn" in modules)
    if unfused_attention and not dropped and layer.fused_priced_attention:
        total += TE_UNFUSED_SAVED_BYTES_PER_SCORE * layer.num_heads * keys * tokens / tp
    return total


# Tensors torchtitan's per-op SAC always keeps: the block input and the SDPA outputs.
_OP_SAC_KEPT = frozenset({"attn_context", "softmax_lse"})


def op_sac_saved_bytes(layer: Layer, tokens: float, tp: int, sp: bool) -> float:
    """torchtitan selective AC, "op" policy (torchtitan/models/llama3 parallelize, _save_list):
    keeps the block input, the SDPA output and log-sum-exp, and the output of every second matmul
    (the policy alternates save/recompute over the block's mm calls, so half the mm output bytes);
    everything else (norms, activation function, rope) is recomputed. Ignores which half."""
    kept = sum(a.bytes_per_token / activation_divisor(a.split, tp, sp) for a in layer.activations
               if a.module == "layer_input" or a.name in _OP_SAC_KEPT)
    mm = 0.0
    for g in layer.gemms:
        if g.split in ("col", "vocab", "expert_col"):
            divisor = tp
        elif g.split in ("row", "expert_row"):
            divisor = tp if sp else 1
        else:
            divisor = tp if sp else 1
        mm += BF16 * g.n * g.tokens_per_token / divisor
    return (kept + mm / 2.0) * tokens


def loss_transient_bytes(tokens: float, vocab: int, tp: int, fused: bool) -> float:
    """Cross-entropy memory beyond the saved fp32 logits (4 B per logit, counted with the head's
    activations). Unfused torch cross_entropy (torchtitan): the bf16 logits (2 B) and the fp32
    log-softmax output (4 B) in forward, the fp32 gradient of the log-softmax and of the logits
    (4 + 4 B) with the bf16 cast (2 B) at the start of backward: at most 10 B more per logit.
    Megatron's fused vocab-parallel cross-entropy computes softmax and gradient in place: 0."""
    return 0.0 if fused else 10.0 * tokens * vocab / tp


def resident_state_bytes(states: dict[str, float], persistent_gradients: bool, num_microbatches: int) -> float:
    """Model-state bytes alive at the forward/backward peak: gradients only where the framework
    keeps them between steps (Megatron's main-grad buffer, DeepSpeed's partitions) or where
    several microbatches accumulate into them (FSDP2 with gradient accumulation)."""
    grads = states["gradients"] if persistent_gradients or num_microbatches > 1 else 0.0
    return states["weights"] + grads + states["optimizer"]


def inflight_microbatches_1f1b(pp: int, rank: int, num_microbatches: int) -> int:
    """Microbatches whose activations pipeline rank `rank` holds at its peak under 1F1B: pp − rank
    (Narayanan et al. SC'21 §2.2; the first stage holds pp), never more than there are."""
    return min(pp - rank, num_microbatches)


def inflight_chunks_interleaved(pp: int, vpp: int, rank: int, num_microbatches: int) -> int:
    """Model-chunk forwards in flight on `rank` under interleaved 1F1B: Megatron's warm-up count
    (pp − rank − 1)·2 + (vpp − 1)·pp, plus the one in steady state; capped by m·vpp."""
    return min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, num_microbatches * vpp)


def with_overheads(allocated_bytes: float, cuda_context_bytes: float, comm_buffer_bytes: float,
                   fragmentation: float) -> float:
    """Reserved memory of allocations made and freed within each step, plus allocator
    fragmentation, NCCL/bucket buffers and the CUDA context (constants stated in the cost-model file)."""
    return allocated_bytes * (1.0 + fragmentation) + comm_buffer_bytes + cuda_context_bytes


def peak_reserved_bytes(state_bytes: float, cycled_bytes: float, cuda_context_bytes: float,
                        comm_buffer_bytes: float, fragmentation: float) -> float:
    """Peak reserved memory of a rank: its model states, allocated once before the first step and
    held for the run, reserve exactly their bytes; only what each step allocates and frees
    (activations, working buffers, per-module ZeRO-3 gathers) fragments the caching allocator's
    pool. PyTorch's caching allocator splits cached blocks to serve smaller requests and returns a
    block to the pool only when its tensor is freed (PyTorch docs, "CUDA semantics: memory
    management"; c10/cuda/CUDACachingAllocator.cpp): a tensor that is never freed leaves no hole.
    Megatron-Core keeps weights and gradients in contiguous buffers (distributed/param_and_grad_buffer.py),
    Apex's DistributedFusedAdam its states in a few bucket buffers, DeepSpeed its partitions in flat
    tensors, FSDP2 one sharded tensor per parameter: all allocated at setup."""
    return state_bytes + with_overheads(cycled_bytes, cuda_context_bytes, comm_buffer_bytes, fragmentation)


def main_grad_bytes(framework: Framework, grad_reduce_in_bf16: bool) -> float:
    """Bytes per gradient element kept and reduced: the framework's (state_bytes_per_param), or 2 under
    Megatron's --grad-reduce-in-bf16."""
    return 2.0 if grad_reduce_in_bf16 else framework_spec(framework).state_bytes_per_param[1]
