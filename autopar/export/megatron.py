"""Megatron-LM export: the `pretrain_gpt.py` arguments of a plan and a torchrun launch script.

Flag names and semantics follow Megatron-LM's megatron/training/arguments.py and megatron-core
0.16 (pipeline_parallel_layer_layout.py for the layout grammar). Mapping decisions:
- zero 0/1 = without/with --use-distributed-optimizer; zero_shard_size k = dp/k optimizer
  instances (--num-distributed-optimizer-instances; HSDP under Megatron-FSDP).
- Stages: an even split is --num-virtual-stages-per-pipeline-rank (vpp > 1) or nothing; any other
  split (the plan's layers_per_stage, or autopar's default that takes a remainder off the first
  and last stages) is a --pipeline-model-parallel-layout with E first, L (and MTP) last.
- Recompute: selective = --recompute-granularity selective --recompute-modules ...; full with K
  layers per virtual stage = block method, K; full of every layer = uniform method, 1 layer per
  chunk (each layer's input kept; the same memory as block with K = all, and it round-trips).
- fp8 = --bf16 --fp8-format hybrid with delayed scaling (amax history 1024, max).
- zero 2/3 = Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads /
  optim_grads_params, with the flags its user guide requires: --use-distributed-optimizer,
  --no-gradient-accumulation-fusion, --ckpt-format fsdp_dtensor, CUDA_DEVICE_MAX_CONNECTIONS unset).
- The model as the HF config describes it: --rotary-base, --rotary-percent, llama3 scaling
  (--use-rope-scaling --rope-scaling-factor; Megatron fixes low/high frequency factors 1/4 and
  original context 8192), YaRN only in MLA (--rope-type yarn --rotary-scaling-factor --mscale
  --mscale-all-dim; original context 4096 and betas 32/1 are MLATransformerConfig's fixed
  defaults), --norm-epsilon, --window-size "(w-1,0)" (HF's sliding_window counts the query's own
  token; Transformer Engine's left window does not), and the router: score function, expert
  bias, group-limited top-k, top-k scaling factor, fp32 router, balance loss type and coefficient.
  Whatever Megatron cannot express is refused with the reason.
The arguments are checked with megatron_rules before a script is written.
"""

from __future__ import annotations

from autopar.errors import ExportError
from autopar.export.common import (TORCHRUN, bash_array, checkpoint_schedule, cluster_block, comment_safe, header,
                                   layer_counts, plan_layout, refuse, require_exportable)
from autopar.export.fabric import fabric_block, fabric_refusals
from autopar.export.megatron_rules import format_layout, megatron_notes, megatron_violations
from autopar.frameworks import plan_refusals
from autopar.model.mixers import hybrid_pattern
from autopar.schema.model import ModelSpec, MoESpec
from autopar.schema.plan import ParallelPlan, Precision, RecomputeMode
from autopar.schema.plan_file import PlanFile

# autopar cp_comm_type -> the value Transformer Engine's attention takes (Megatron passes it through)
CP_COMM_TYPES = {"p2p": "p2p", "a2a": "a2a", "allgather": "all_gather"}
FP8_ARGS = ("--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max")
# Block-scaled recipes (megatron/training/arguments.py, core_r0.14+: --fp8-recipe {tensorwise, delayed,
# mxfp8, blockwise}, --fp4-format e2m1 with --fp4-recipe nvfp4): MXFP8 quantizes every GEMM operand
# in E4M3 with a per-32 E8M0 scale (Transformer Engine MXFP8BlockScaling); NVFP4 is E2M1 with a
# per-16 E4M3 scale (NVFP4BlockScaling: random Hadamard transforms on the wgrad inputs, 2D weight blocks).
PRECISION_ARGS = {"fp8": FP8_ARGS, "mxfp8": ("--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"),
                  "nvfp4": ("--fp4-format", "e2m1", "--fp4-recipe", "nvfp4")}


def _model_args(spec: ModelSpec, plan: ParallelPlan) -> list[str]:
    args = ["--num-layers", str(spec.num_layers), "--hidden-size", str(spec.hidden_size),
            "--ffn-hidden-size", str(spec.ffn_hidden_size), "--num-attention-heads", str(spec.num_attention_heads)]
    if spec.head_dim is not None:
        args += ["--kv-channels", str(spec.head_dim)]
    if spec.kv_heads != spec.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads)]
    if spec.activation == "swiglu":
        args.append("--swiglu")
    elif spec.activation == "relu2":
        args.append("--squared-relu")
    args += ["--normalization", "RMSNorm" if spec.normalization == "rmsnorm" else "LayerNorm",
             "--norm-epsilon", repr(spec.norm_epsilon)]
    if spec.position_embedding == "rope" and not _all_nope(spec):
        args += ["--position-embedding-type", "rope"] + rope_args(spec)
    else:
        args += ["--position-embedding-type", "learned_absolute" if spec.position_embedding == "learned" else "none"]
    if spec.sliding_window is not None:
        args += ["--window-size", f"({spec.sliding_window - 1},0)"]
    if not spec.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args += _bias_args(spec)
    if spec.qk_norm or spec.mla:  # MLA: the q_a / kv_a norms of DeepSeek-V2/V3 (megatron-core builds them with
        args.append("--qk-layernorm")  # qk_layernorm only, gpt_layer_specs.py; autopar's count includes them)
    dropout = "0.1" if spec.dropout else "0.0"
    args += ["--attention-dropout", dropout, "--hidden-dropout", dropout]
    args += ["--vocab-size", str(spec.vocab_size), "--seq-length", str(plan.seq_len),
             "--max-position-embeddings", str(_max_positions(spec, plan))]
    if spec.mtp_layers:
        args += ["--mtp-num-layers", str(spec.mtp_layers)]
    return args


def _all_nope(spec: ModelSpec) -> bool:
    """Every attention layer without RoPE (Nemotron-H's, Kimi-Linear's MLA): no positional embedding."""
    pattern = spec.layer_pattern or ""
    attention = [c for c in pattern if c in "ANWC"]
    return bool(attention) and all(c == "N" for c in attention)


def _freq(flags: list[int]) -> str:
    """A per-layer 0/1 list as Megatron's list expression (moe_freq_type / no_rope_freq_type /
    la_freq_type evaluate it), repeated units folded: [1,1,1,0]*12 -> "([1,1,1,0]*12)"."""
    n = len(flags)
    for unit in range(1, n + 1):
        if n % unit == 0 and flags == flags[:unit] * (n // unit):
            body = "[" + ",".join(map(str, flags[:unit])) + "]"
            return f"({body}*{n // unit})" if n // unit > 1 else f"({body})"
    return "(" + str(flags) + ")"


def mixer_args(spec: ModelSpec) -> list[str]:
    """The layer kinds beyond attention + MLP in megatron-core 0.16's flags (TransformerConfig
    fields, megatron/training/arguments.py builds a flag for each), or ExportError naming what
    Megatron cannot build:
    - Mamba-2 hybrids run pretrain_mamba.py: --hybrid-override-pattern (M * - E, one block a layer;
      mamba_hybrid_layer_allocation.Symbols), --is-hybrid-model, --mamba-state-dim/-head-dim/
      -num-groups/-num-heads, the stack spec mamba_stack_spec (Megatron's examples/mamba);
      MambaMixer builds a width-4 conv and SSD chunks of 128.
    - Gated DeltaNet: --experimental-attention-variant gated_delta_net, --linear-attention-freq
      (1 = a linear layer), --linear-num-key-heads ... and Qwen3-Next's --attention-output-gate.
    - DeepSeek Sparse Attention: --experimental-attention-variant dsa --dsa-indexer-n-heads/
      -head-dim/-topk.
    - Windows per layer: --window-attn-skip-freq (1 = a sliding layer); attention sinks:
      --softmax-type learnable; NoPE layers: --no-rope-freq (1 = no RoPE).
    Refused: Kimi Delta Attention and chunked attention (no such layer in megatron-core 0.16), a
    Mamba model whose layers hold both a mixer and an MLP (the hybrid stack has one block a layer)."""
    pattern = spec.layer_pattern or ""
    letters = set(pattern)
    problems = []
    if "K" in letters:
        problems.append("Kimi Delta Attention layers: megatron-core 0.16 has none (its experimental attention "
                        "variants are gated_delta_net and dsa); export to deepspeed (the Hugging Face model)")
    if "C" in letters:
        problems.append(f"chunked attention (attention_chunk_size {spec.attention_chunk_size}): megatron-core 0.16's "
                        "attention has sliding windows, not chunks; export to deepspeed (the Hugging Face model)")
    if "M" in letters and (letters & {"G", "K"} or spec.indexer is not None):
        problems.append("Mamba-2 layers beside linear or sparse attention: Megatron's hybrid stack has neither")
    args: list[str] = []
    if "M" in letters:
        symbols = hybrid_pattern(pattern, spec.ffn_pattern or "D" * spec.num_layers)
        m = spec.mamba
        if symbols is None:
            problems.append("Mamba-2 layers with a mixer and an MLP in one layer: Megatron's hybrid stack holds one "
                            "block a layer (M, *, -, E); give each block its own layer in layer_pattern/ffn_pattern")
        if (m.conv_kernel, m.chunk_size) != (4, 128):
            problems.append(f"Mamba-2 conv width {m.conv_kernel} and chunk {m.chunk_size}: megatron-core 0.16's "
                            "MambaMixer builds 4 and 128")
        if not m.conv_bias or m.proj_bias:
            problems.append("Mamba-2 biases other than a conv bias alone: MambaMixer's conv1d has a bias and its "
                            "projections follow --disable-bias-linear")
        args += ["--hybrid-override-pattern", symbols or "", "--is-hybrid-model", "--mamba-state-dim",
                 str(m.state_size), "--mamba-head-dim", str(m.head_dim), "--mamba-num-groups", str(m.num_groups),
                 "--mamba-num-heads", str(m.num_heads),
                 "--spec", "megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
    if "G" in letters:
        la = spec.linear_attention
        args += ["--experimental-attention-variant", "gated_delta_net",
                 "--linear-attention-freq", _freq([int(c == "G") for c in pattern]),
                 "--linear-num-key-heads", str(la.num_key_heads), "--linear-num-value-heads", str(la.num_value_heads),
                 "--linear-key-head-dim", str(la.key_head_dim), "--linear-value-head-dim", str(la.value_head_dim),
                 "--linear-conv-kernel-dim", str(la.conv_kernel)]
    if spec.indexer is not None:
        ix = spec.indexer
        args += ["--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", str(ix.num_heads),
                 "--dsa-indexer-head-dim", str(ix.head_dim), "--dsa-indexer-topk", str(ix.top_k),
                 "--no-rope-fusion"]  # transformer_config.py: 'RoPE fusion is not supported for DSAttention'
    if spec.attention_output_gate:
        args.append("--attention-output-gate")
    if spec.attention_sinks:
        args += ["--softmax-type", "learnable"]
    attention = [c for c in pattern if c in "ANWC"]
    if "W" in attention and set(attention) != {"W"}:
        args += ["--window-attn-skip-freq", _freq([int(c == "W") for c in pattern])]
    if "N" in attention and not _all_nope(spec) and spec.position_embedding == "rope":
        args += ["--no-rope-freq", _freq([int(c == "N") for c in pattern])]
    refuse("megatron", problems)
    return args


def rope_args(spec: ModelSpec) -> list[str]:
    """RoPE base, rotary share and long-context scaling in Megatron's flags, or ExportError."""
    if spec.position_embedding != "rope":
        return []
    if spec.rope_theta != int(spec.rope_theta):
        refuse("megatron", [f"rope_theta {spec.rope_theta}: Megatron's --rotary-base takes an integer"])
    args = ["--rotary-base", str(int(spec.rope_theta))]
    if spec.rotary_percent != 1.0:
        args += ["--rotary-percent", repr(spec.rotary_percent)]
    sc = spec.rope_scaling
    if sc is None:
        # MLA defaults to yarn; TE's fused RoPE for MLA is YaRN-only (MLATransformerConfig.__post_init__)
        return args + (["--rope-type", "rope", "--no-rope-fusion"] if spec.mla else [])
    if sc.type == "llama3":
        fixed = (sc.low_freq_factor, sc.high_freq_factor, sc.original_max_position_embeddings)
        if spec.mla or fixed != (1.0, 4.0, 8192):
            refuse("megatron", [f"llama3 RoPE scaling with low/high frequency factors {sc.low_freq_factor}/"
                                f"{sc.high_freq_factor} and original context {sc.original_max_position_embeddings}"
                                f"{' in MLA' if spec.mla else ''}: Megatron applies it with 1/4 and 8192 only"])
        return args + ["--use-rope-scaling", "--rope-scaling-factor", repr(sc.factor)]
    if not spec.mla:
        refuse("megatron", ["YaRN RoPE scaling outside multi-latent attention: megatron-core 0.16 applies YaRN "
                            "only in MLA (--rope-type yarn); drop rope_scaling or export to torchtitan"])
    if (sc.original_max_position_embeddings, sc.beta_fast, sc.beta_slow) != (4096, 32.0, 1.0):
        refuse("megatron", [f"YaRN with original context {sc.original_max_position_embeddings} and betas "
                            f"{sc.beta_fast}/{sc.beta_slow}: Megatron-LM has no flags for them (MLATransformerConfig "
                            "fixes 4096 and 32/1)"])
    return args + ["--rope-type", "yarn", "--rotary-scaling-factor", repr(sc.factor), "--mscale", repr(sc.mscale),
                   "--mscale-all-dim", repr(sc.mscale_all_dim)]


def _bias_args(spec: ModelSpec) -> list[str]:
    """Megatron has one switch for every linear bias and one for the qkv bias alone. The MLP side
    is every MLP linear the model has: its dense MLPs, and its experts and router (megatron-core's
    router and grouped experts take their bias from add_bias_linear: gpt-oss has both)."""
    mlp = _mlp_bias(spec)
    if spec.qkv_bias and spec.attn_out_bias and mlp:
        return []
    if not spec.attn_out_bias and not mlp:
        return ["--disable-bias-linear"] + (["--add-qkv-bias"] if spec.qkv_bias else [])
    raise ExportError(f"Megatron cannot express {spec.name}'s biases (qkv {spec.qkv_bias}, attention output "
                      f"{spec.attn_out_bias}, mlp {mlp}): it has --disable-bias-linear (all) and "
                      "--add-qkv-bias (qkv only); make attn_out_bias and mlp_bias equal")


def _mlp_bias(spec: ModelSpec) -> bool:
    """The MLP side's bias, or ExportError when its linears disagree (one switch sets them all)."""
    ffns = {spec.ffn_of(i) for i in range(spec.num_layers)}
    side = set()
    if "D" in ffns:
        side.add(("mlp", spec.mlp_bias))
    if "E" in ffns and spec.moe is not None:
        side |= {("experts", spec.moe.expert_mlp_bias), ("router", spec.moe.router_bias)}
    values = {v for _, v in side}
    if len(values) > 1:
        refuse("megatron", [f"biases on {', '.join(k for k, v in sorted(side) if v)} but not on "
                            f"{', '.join(k for k, v in sorted(side) if not v)}: megatron-core's --disable-bias-linear "
                            "sets every MLP, expert and router bias at once"])
    return values.pop() if values else spec.mlp_bias


def _max_positions(spec: ModelSpec, plan: ParallelPlan) -> int:
    table = spec.max_position_embeddings or spec.seq_length
    return max(table, plan.seq_len) if spec.position_embedding == "rope" else table


def moe_layer_freq(moe: MoESpec, num_layers: int) -> str:
    """--moe-layer-freq: an int when every layer_freq-th layer is MoE from layer 0, else Megatron's
    list expression, e.g. "([0]*3+[1]*58)" for DeepSeek-V3's three leading dense layers."""
    if moe.first_k_dense == 0:
        return str(moe.layer_freq)
    rest, freq = num_layers - moe.first_k_dense, moe.layer_freq
    terms = [f"[0]*{moe.first_k_dense}"]
    if freq == 1:
        terms += [f"[1]*{rest}"] if rest else []
    else:
        full, tail = divmod(rest, freq)
        terms += [f"([1]+[0]*{freq - 1})*{full}"] if full else []
        terms += (["[1]" + (f"+[0]*{tail - 1}" if tail > 1 else "")] if tail else [])
    return "(" + "+".join(terms) + ")"


def _moe_args(spec: ModelSpec, plan: ParallelPlan) -> list[str]:
    moe = spec.moe
    if moe is None:
        return []
    args = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
            "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size)]
    if moe.num_shared_experts:
        args += ["--moe-shared-expert-intermediate-size",
                 str(moe.num_shared_experts * moe.shared_expert_ffn_hidden_size)]
        if moe.shared_expert_gate:
            args.append("--moe-shared-expert-gate")
    if "M" not in (spec.layer_pattern or ""):  # the hybrid stack places its MoE layers by the pattern's E
        every = spec.ffn_pattern is None or set(spec.ffn_pattern) == {"E"}
        args += ["--moe-layer-freq", moe_layer_freq(moe, spec.num_layers) if every else
                 _freq([int(c == "E") for c in spec.ffn_pattern])]
    args += router_args(moe)
    args += (["--moe-grouped-gemm"] if plan.moe_grouped_gemm else []) + ["--moe-token-dispatcher-type",
                                                                         plan.moe_dispatcher]
    if plan.moe_dispatcher == "flex":
        args += ["--moe-flex-dispatcher-backend", "deepep"]
    if plan.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", repr(plan.moe_capacity_factor)]
    if plan.moe_pad_to_capacity:
        args.append("--moe-pad-expert-input-to-capacity")
    if plan.moe_shared_expert_overlap:
        args.append("--moe-shared-expert-overlap")
    return args


def router_args(moe: MoESpec) -> list[str]:
    """The router as the HF config has it (megatron-core moe_utils.topk_routing_with_score_function):
    softmax after top-k renormalises (HF norm_topk_prob), before it (--moe-router-pre-softmax)
    does not; sigmoid always renormalises for top-k > 1."""
    args = ["--moe-router-score-function", moe.score_function]
    if moe.score_function == "softmax" and (not moe.norm_topk_prob or moe.top_k == 1):
        args.append("--moe-router-pre-softmax")  # also Megatron's rule: softmax over one expert has no gradient
    if moe.score_function == "sigmoid" and not moe.norm_topk_prob and moe.top_k > 1:
        refuse("megatron", ["sigmoid router without top-k renormalisation: megatron-core always renormalises "
                            "sigmoid top-k scores"])
    if moe.expert_bias:
        args.append("--moe-router-enable-expert-bias")
    if moe.num_groups is not None:
        args += ["--moe-router-num-groups", str(moe.num_groups), "--moe-router-group-topk", str(moe.group_topk)]
    if moe.routed_scaling_factor != 1.0:
        args += ["--moe-router-topk-scaling-factor", repr(moe.routed_scaling_factor)]
    if moe.router_fp32:
        args += ["--moe-router-dtype", "fp32"]
    if moe.aux_loss_coeff > 0:
        args += ["--moe-router-load-balancing-type", "seq_aux_loss" if moe.aux_loss_per_sequence else "aux_loss",
                 "--moe-aux-loss-coeff", repr(moe.aux_loss_coeff)]
    else:
        args += ["--moe-router-load-balancing-type", "none"]
    return args


def _mla_args(spec: ModelSpec) -> list[str]:
    mla = spec.mla
    if mla is None:
        return []
    args = ["--multi-latent-attention"]
    if mla.q_lora_rank is not None:
        args += ["--q-lora-rank", str(mla.q_lora_rank)]
    return args + ["--kv-lora-rank", str(mla.kv_lora_rank), "--qk-head-dim", str(mla.qk_nope_head_dim),
                   "--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim), "--v-head-dim", str(mla.v_head_dim)]


def pipeline_layout(counts: tuple[int, ...], mtp_layers: int) -> str:
    """--pipeline-model-parallel-layout for decoder layers per virtual stage (execution order):
    embedding on the first stage, MTP and loss after the last stage's decoders."""
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * mtp_layers + "L"
    return format_layout(stages)


def hybrid_stage_args(counts: tuple[int, ...]) -> list[str]:
    """An uneven split of a hybrid (Mamba) stack: megatron-core 0.16's MambaStack reads only the
    first and last stages' layer counts and splits the rest evenly (mamba_block.py), so the middle
    stages must be equal (frameworks.megatron.plan_refusals refuses the rest)."""
    args = []
    if len(counts) > 1 and counts[0] != counts[1]:
        args += ["--decoder-first-pipeline-num-layers", str(counts[0])]
    if len(counts) > 2 and counts[-1] != counts[-2] or len(counts) == 2 and counts[1] != counts[0] and not args:
        args += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
    if len(set(counts[1:-1])) > 1:
        refuse("megatron", [f"layers per stage {list(counts)}: Megatron's hybrid stack splits the middle stages "
                            "evenly; even out the middle stages"])
    return args


def _parallel_args(pf: PlanFile, plan: ParallelPlan) -> list[str]:
    spec = pf.target.model_spec
    args = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp),
            "--context-parallel-size", str(plan.cp)]
    if plan.cp > 1 or plan.cp_comm_type != "p2p":
        args += ["--cp-comm-type", CP_COMM_TYPES[plan.cp_comm_type]]
    if plan.attention_backend != "auto":
        args += ["--attention-backend", plan.attention_backend]
    if spec.moe is not None:
        args += ["--expert-model-parallel-size", str(plan.ep)]
        args += ["--expert-tensor-parallel-size", str(plan.etp)] if plan.etp is not None else []
    if plan.sequence_parallel and plan.tp > 1:
        args.append("--sequence-parallel")
    counts = layer_counts(pf)
    if len(set(counts)) > 1 and "M" in (spec.layer_pattern or ""):
        args += hybrid_stage_args(counts)
    elif len(set(counts)) > 1:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(counts, spec.mtp_layers)]
    elif plan.vpp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
    args += zero_args(plan)
    layout = plan_layout(pf, plan)
    if layout.dp_replicate > 1:
        if plan.zero == 0:
            refuse("megatron", ["zero_shard_size needs the distributed optimizer or Megatron-FSDP (zero >= 1); "
                                "set zero 1 or drop it"])
        args += ["--num-distributed-optimizer-instances", str(layout.dp_replicate)]
    return args


# ZeRO stage -> Megatron-FSDP's --data-parallel-sharding-strategy (parallelism guide: optim_grads is
# ZeRO-2, optim_grads_params ZeRO-3)
FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def zero_args(plan: ParallelPlan) -> list[str]:
    """zero 1: the distributed optimizer; zero 2/3: Megatron-FSDP with the flags its user guide
    requires (docs/discussions/megatron-fsdp-user-guide, Megatron-LM core 0.16)."""
    if plan.zero == 1:
        return ["--use-distributed-optimizer"]
    if plan.zero >= 2:
        return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_SHARDING[plan.zero],
                "--use-distributed-optimizer", "--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor"]
    return []


def _recompute_args(plan: ParallelPlan) -> list[str]:
    rc = plan.recompute
    if rc.mode == RecomputeMode.SELECTIVE:
        return ["--recompute-granularity", "selective", "--recompute-modules", *rc.modules]
    if rc.mode == RecomputeMode.FULL and rc.num_layers is None:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if rc.mode == RecomputeMode.FULL:
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(rc.num_layers)]
    return []


def _step_args(plan: ParallelPlan) -> list[str]:
    args = ["--micro-batch-size", str(plan.mbs), "--global-batch-size", str(plan.global_batch), "--bf16"]
    args += list(PRECISION_ARGS.get(str(plan.precision), ()))
    if plan.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if plan.overlap_param_gather:
        args.append("--overlap-param-gather")
    if plan.grad_reduce_in_bf16:
        args.append("--grad-reduce-in-bf16")
    if plan.cross_entropy_fusion is not False:
        args.append("--cross-entropy-loss-fusion")
    if plan.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    return args


def megatron_arg_groups(pf: PlanFile) -> list[tuple[str, list[str]]]:
    """The arguments by concern (model, moe, mla, parallel, recompute, step); checked, or ExportError."""
    plan = require_exportable(pf, "megatron")
    refuse("megatron", fabric_refusals(pf, plan))
    spec = pf.target.model_spec
    refuse("megatron", plan_refusals(spec, pf.target.gpus, plan))
    groups = [("MODEL_ARGS", _model_args(spec, plan)), ("MIXER_ARGS", mixer_args(spec)),
              ("MOE_ARGS", _moe_args(spec, plan)),
              ("MLA_ARGS", _mla_args(spec)), ("PARALLEL_ARGS", _parallel_args(pf, plan)),
              ("RECOMPUTE_ARGS", _recompute_args(plan)), ("STEP_ARGS", _step_args(plan))]
    args = [a for _, group in groups for a in group]
    refuse("megatron", megatron_violations(args, pf.target.gpus))
    return [(name, group) for name, group in groups if group]


def megatron_args(pf: PlanFile) -> list[str]:
    """`pretrain_gpt.py` arguments for the model and the plan (no paths or optimizer settings)."""
    return [a for _, group in megatron_arg_groups(pf) for a in group]


_SETTINGS = '''# ---- Set these: code, data, tokenizer, checkpoints ----
MEGATRON_LM_DIR="${MEGATRON_LM_DIR:-/path/to/Megatron-LM}"           # <-- SET: a Megatron-LM checkout (core 0.16)
DATA_PATH="${DATA_PATH:-/path/to/corpus_text_document}"              # <-- SET: preprocessed .bin/.idx prefix
TOKENIZER_TYPE="${TOKENIZER_TYPE:-HuggingFaceTokenizer}"             # <-- SET: tokenizer class
TOKENIZER_MODEL="${TOKENIZER_MODEL:-/path/to/tokenizer}"             # <-- SET: tokenizer files
CHECKPOINT_PATH="${CHECKPOINT_PATH:-/path/to/checkpoints}"           # <-- SET: save and resume here
TRAIN_ITERS="${TRAIN_ITERS:-{train_iters}}"{pad}# <-- SET: training length{planned}
LR="${LR:-3.0e-4}"                                                   # <-- SET: peak learning rate'''

_RUN_ARGS = ["--data-path", '"$DATA_PATH"', "--split", "99,1,0", "--tokenizer-type", '"$TOKENIZER_TYPE"',
             "--tokenizer-model", '"$TOKENIZER_MODEL"', "--save", '"$CHECKPOINT_PATH"', "--load", '"$CHECKPOINT_PATH"',
             "--save-interval", "{save_interval}", "--train-iters", '"$TRAIN_ITERS"', "--lr", '"$LR"', "--min-lr", "3.0e-5",
             "--lr-decay-style", "cosine", "--lr-warmup-iters", "2000", "--weight-decay", "0.1", "--clip-grad", "1.0",
             "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.02", "--log-interval", "10",
             "--eval-interval", "1000", "--eval-iters", "10"]


def export_megatron(pf: PlanFile) -> str:
    """A bash script that runs torchrun on each node with the plan's `pretrain_gpt.py` arguments."""
    groups = megatron_arg_groups(pf)
    plan = pf.parallel
    parts = [header(pf, "megatron", "Megatron-LM launch")]
    notes = megatron_notes([a for _, g in groups for a in g])
    parts += ["\n".join(f"# Note: {comment_safe(n)}" for n in notes)] if notes else []
    interval, async_save, steps = checkpoint_schedule(pf)
    iters = str(steps or 500000)
    settings = (_SETTINGS.replace("{train_iters}", iters).replace("{pad}", " " * max(1, 33 - len(iters)))
                .replace("{planned}", " (the planned run's)" if steps else ""))
    run_args = [a.replace("{save_interval}", str(interval)) for a in _RUN_ARGS]
    run_args += ["--async-save"] if async_save else []
    parts += [f"# Checkpoint every {interval} steps: the interval that maximises goodput under the run's interruptions"
              " (autopar.cost.run).", settings, cluster_block(pf, 6000)]
    fabric = fabric_block(pf, plan)
    parts += [fabric] if fabric else []
    if plan.zero >= 2:
        parts.append("# Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1 (it overlaps its collectives on\n"
                     "# several streams); with tp or cp > 1 Megatron only warns that TP/CP prefer 1\n"
                     "unset CUDA_DEVICE_MAX_CONNECTIONS")
    elif plan.tp > 1 or plan.cp > 1:
        parts.append("# Megatron asserts this when tp or cp > 1 (GPUs before Blackwell)\n"
                     "export CUDA_DEVICE_MAX_CONNECTIONS=1")
    parts += [bash_array(name, group) for name, group in groups]
    parts.append(bash_array("RUN_ARGS", run_args))
    refs = " ".join(f'"${{{name}[@]}}"' for name, _ in groups)
    entry = "pretrain_mamba.py" if "M" in (pf.target.model_spec.layer_pattern or "") else "pretrain_gpt.py"
    parts.append(f'{TORCHRUN} \\\n    "$MEGATRON_LM_DIR/{entry}" \\\n    {refs} "${{RUN_ARGS[@]}}"')
    return "\n\n".join(parts) + "\n"
