"""torchtitan export: command-line overrides for torchtitan 0.3 (`python -m torchtitan.train
--module M --config C --section.key value ... activation-checkpoint:MODE`).

torchtitan 0.3 builds the model from a config_registry function, parsed by tyro; flags are the
dataclass fields of torchtitan/config/configs.py with dashes, and the activation-checkpoint policy
is a subcommand that must come last. The model is not settable by flags (Trainer.Config.model_spec
is suppressed from the CLI), so the export writes a config_registry module, autopar_torchtitan.py
(--module autopar_torchtitan --config autopar_plan): the registry config of the flavour whose
shape the model has (a Llama-3 config.json is the llama3 8B/70B/405B flavour whatever its name),
with RoPE base and scaling, norm epsilon, router and weight tying set as the model's config says,
and float8 as a Float8LinearConverter on any flavour. Mapping of the plan:
- dp: zero 0 = every dp rank a replica (data_parallel_replicate_degree dp, shard 1); zero 2/3 =
  FSDP2 over dp (reshard after forward never/always); zero_shard_size k = HSDP, shard k,
  replicate dp/k. torchtitan shards parameters over dp_shard·cp whenever cp > 1, so zero 0 with cp
  is refused.
- pp: one model part per virtual stage, listed exactly (--parallelism.module-fqns-per-model-part),
  any split, uneven included (without one, the Layout's default is torchtitan's own rule,
  cost.layout.torchtitan_layer_counts, so the estimate and the export split alike);
  schedule by torch.distributed.pipelining's names, 1F1B (vpp 1) or Interleaved1F1B; local batch =
  global / dp, pipeline micro-batch = mbs.
  Without pp: local batch = mbs and gradient accumulation fills the global batch.
- ep: experts are sharded by ep alone (etp 1) when ep > 1, by tp when ep = 1; ep must divide
  dp_shard·cp·tp. cp all-gathers K/V (torch's default rotate method), so cp_comm_type must be
  allgather. tp_comm_overlap = async TP (compile on).
- recompute: none / selective (torchtitan's per-op SAC: the closest policy, not the same set of
  tensors as Megatron's modules) / full (every block). Full of K < all layers is refused.
- precision: fp8 = the float8 converter (rowwise, lm_head kept in bf16) on any flavour.
- torch_compile: --compile.enable with components model and loss unless it is false (autopar
  prices a compiled block's norms, RoPE and activation as fused kernels; false = eager, each op its
  own kernel). fp8 and async TP need it (schema.plan refuses them eager).
- MoE: torchtitan balances experts with a score bias only; a config's aux-loss coefficient is
  noted as not applied.
Overlap flags are not settable: FSDP2 always prefetches and overlaps.
"""

from __future__ import annotations

from autopar.cost.layout import Layout, torchtitan_layer_counts  # noqa: F401 (torchtitan's split, re-exported)
from autopar.export.common import (TORCHRUN, bash_array, checkpoint_schedule, cluster_block, comment_safe, header,
                                   layer_counts, model_params, peak_lr, plan_layout, refuse, require_exportable,
                                   shell_word)
from autopar.frameworks import plan_refusals
from autopar.frameworks.torchtitan import FLAVOURS, Flavour, flavour_for, no_flavour_reason  # noqa: F401 (re-exported)
from autopar.schema.model import ModelSpec
from autopar.export.fabric import fabric_block
from autopar.schema.plan import ParallelPlan
from autopar.schema.plan_file import PlanFile

def _config_for(pf: PlanFile, plan: ParallelPlan) -> Flavour:
    reason = no_flavour_reason(pf.target.model_spec)
    if reason:
        refuse("torchtitan", [f"{reason}; {flavour_needed(pf.target.model_spec)}"])
    return flavour_for(pf.target.model_spec)


def flavour_needed(spec: ModelSpec) -> str:
    """What torchtitan 0.3 would need to train `spec`: a model_registry flavour of its shape (the
    registry's field names) and a config_registry function returning it; re-planning cannot help."""
    family = "deepseek_v3" if spec.mla else "qwen3" if spec.qk_norm else "llama3"
    shape = (f"n_layers {spec.num_layers}, dim {spec.hidden_size}, n_heads {spec.num_attention_heads}, "
             f"n_kv_heads {spec.kv_heads}, head_dim {spec.head_size}, hidden_dim {spec.ffn_hidden_size}, "
             f"vocab_size {spec.vocab_size}")
    extra = [what for what, has in (("qkv bias", spec.qkv_bias), ("attention output bias", spec.attn_out_bias),
                                    ("MLP bias", spec.mlp_bias), ("LayerNorm", spec.normalization == "layernorm"),
                                    ("learned positions", spec.position_embedding == "learned"),
                                    ("GeLU MLP", spec.activation == "gelu")) if has]
    return (f"torchtitan would need a model_registry flavour with {shape} in torchtitan/models/{family}, and a "
            f"config_registry function returning it" + (f" (and a model family with {', '.join(extra)}, which "
            f"{family} has not)" if extra else "") + "; re-planning for torchtitan cannot supply it")


def torchtitan_refusals(pf: PlanFile, plan: ParallelPlan) -> list[str]:
    """Every reason torchtitan 0.3 cannot run `plan` (empty = exportable): the framework's own
    refusals (autopar.frameworks.torchtitan), which the search filters by, and for a model of no
    flavour's shape what torchtitan would need instead."""
    out = plan_refusals(pf.target.model_spec, pf.target.gpus, plan)
    if no_flavour_reason(pf.target.model_spec):
        out.append(flavour_needed(pf.target.model_spec))
    return out


def _dp_args(plan: ParallelPlan, layout: Layout) -> list[str]:
    if plan.zero == 0:
        replicate, shard, reshard = layout.dp, 1, "default"
    else:
        shard, replicate = layout.dp_shard, layout.dp_replicate
        reshard = "always" if plan.zero == 3 else "never"
    return ["--parallelism.data-parallel-replicate-degree", str(replicate),
            "--parallelism.data-parallel-shard-degree", str(shard),
            "--parallelism.fsdp-reshard-after-forward", reshard]


def model_parts(counts: tuple[int, ...]) -> list[str]:
    """Module names of each virtual stage, comma-joined: embedding first, norm and head last."""
    parts, start = [], 0
    for c in counts:
        parts.append([f"layers.{i}" for i in range(start, start + c)])
        start += c
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return [",".join(p) for p in parts]


PP_SCHEDULES = {1: "1F1B", "interleaved": "Interleaved1F1B"}  # torch.distributed.pipelining class names


def _pp_args(pf: PlanFile, plan: ParallelPlan, dp: int) -> list[str]:
    args = ["--parallelism.pipeline-parallel-degree", str(plan.pp)]
    if plan.pp == 1:
        return args + ["--training.local-batch-size", str(plan.mbs)]
    schedule = PP_SCHEDULES["interleaved" if plan.vpp > 1 else 1]
    return args + ["--parallelism.pipeline-parallel-schedule", schedule,
                   "--parallelism.pipeline-parallel-layers-per-stage", "None",
                   "--parallelism.module-fqns-per-model-part", *model_parts(layer_counts(pf)),
                   "--parallelism.pipeline-parallel-microbatch-size", str(plan.mbs),
                   "--training.local-batch-size", str(plan.global_batch // dp)]


def _ac_subcommand(plan: ParallelPlan) -> str:
    return "activation-checkpoint:" + {"none": "none", "selective": "selective", "full": "full"}[plan.recompute.mode]


CONFIG_MODULE = "autopar_torchtitan"  # the generated config_registry module (file autopar_torchtitan.py)
CONFIG_FN = "autopar_plan"


def torchtitan_args(pf: PlanFile, run_args: tuple[str, ...] = ()) -> list[str]:
    """Arguments after `-m torchtitan.train` (with the generated autopar_torchtitan.py on the
    Python path); `run_args` (paths, steps) go before the activation-checkpoint subcommand, which
    tyro needs last."""
    plan = require_exportable(pf, "torchtitan")
    refuse("torchtitan", torchtitan_refusals(pf, plan))  # what framework_refusals, the search's filter, returns
    layout = plan_layout(pf, plan)
    dp = layout.dp
    args = ["--module", CONFIG_MODULE, "--config", CONFIG_FN, *_dp_args(plan, layout),
            "--parallelism.tensor-parallel-degree", str(plan.tp)]
    if plan.tp > 1:
        args.append("--parallelism.enable-sequence-parallel" if plan.sequence_parallel
                    else "--parallelism.no-enable-sequence-parallel")
    args += _pp_args(pf, plan, dp)
    args += ["--parallelism.context-parallel-degree", str(plan.cp),
             "--parallelism.expert-parallel-degree", str(plan.ep),
             "--training.global-batch-size", str(plan.global_batch), "--training.seq-len", str(plan.seq_len),
             "--training.mixed-precision-param", "bfloat16"]
    if plan.pp > 1 or plan.ep > 1:
        args.append("--training.disable-cuda-graphs")  # torchtitan: CUDA graphs support neither pp nor most EP
    if plan.torch_compile is not False:
        args += ["--compile.enable", "--compile.components", "model,loss"]
    args.append("--compile.enable-async-tensor-parallel" if plan.tp_comm_overlap
                else "--compile.no-enable-async-tensor-parallel")
    return args + list(run_args) + [_ac_subcommand(plan)]


def _rope_fields(spec: ModelSpec) -> dict:
    """RoPE.Config fields (torchtitan/models/common/rope.py) for the spec's RoPE."""
    out: dict = {"theta": spec.rope_theta, "scaling": "none"}
    sc = spec.rope_scaling
    if sc is not None and sc.type == "llama3":
        out |= {"scaling": "llama", "scaling_factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
                "high_freq_factor": sc.high_freq_factor,
                "original_max_position_embeddings": sc.original_max_position_embeddings}
    elif sc is not None:
        out |= {"scaling": "yarn", "rope_factor": sc.factor, "beta_fast": sc.beta_fast, "beta_slow": sc.beta_slow,
                "original_seq_len": sc.original_max_position_embeddings}
    return out


def _router_fields(spec: ModelSpec) -> dict | None:
    """TokenChoiceTopKRouter.Config fields (torchtitan/models/common/moe.py) for the spec's router."""
    moe = spec.moe
    if moe is None:
        return None
    return {"score_func": moe.score_function, "route_norm": moe.norm_topk_prob,
            "route_scale": moe.routed_scaling_factor, "num_expert_groups": moe.num_groups,
            "num_limited_groups": moe.group_topk}


def balance_note(spec: ModelSpec) -> str | None:
    """torchtitan 0.3's MoE balances experts with a score bias only (MoE.Config.load_balance_coeff,
    the bias update rate); it has no auxiliary balance loss."""
    if spec.moe is None or not spec.moe.aux_loss_coeff:
        return None
    return (f"torchtitan has no auxiliary balance loss: the config's coefficient {spec.moe.aux_loss_coeff} is not "
            "applied; experts are balanced by torchtitan's score bias (load_balance_coeff 1e-3) instead")


def _doc_safe(text: object) -> str:
    """`text` inside the generated module's docstring: one line (comment_safe), its backslashes and
    quotes escaped, so no value ends the docstring."""
    return comment_safe(text).replace("\\", "\\\\").replace('"', '\\"')


def config_module(pf: PlanFile) -> str:
    """autopar_torchtitan.py: a config_registry module whose `autopar_plan()` is the registry config of
    the model's flavour with the model set as its config says (RoPE, norm epsilon, router, weight
    tying) and float8 as a converter when the plan is fp8."""
    spec, plan = pf.target.model_spec, pf.parallel
    flavour = _config_for(pf, plan)
    fp8 = plan.precision == "fp8"
    note = balance_note(spec)
    lines = [
        f'"""torchtitan 0.3 config_registry module written by autopar {_doc_safe(pf.autopar_version)} for '
        f'{_doc_safe(spec.name)}: the',
        f"{flavour.module} {flavour.flavor} flavour (same shape) with the model's own settings"
        f"{' and the float8 converter' if fp8 else ''}.",
        f"The launch passes --module {CONFIG_MODULE} --config {CONFIG_FN}; flags override the rest.",
        *([f"Note: {_doc_safe(note)}."] if note else []),
        '"""', "",
        "from torchtitan.models.common import RMSNorm, RoPE",
        *(["from torchtitan.models.common.moe import TokenChoiceTopKRouter"] if spec.moe else []),
        *(["from torchtitan.components.quantization import Float8LinearConverter"] if fp8 else []),
        f"from torchtitan.models.{flavour.module} import model_registry",
        f"from torchtitan.models.{flavour.module}.config_registry import {flavour.recipe(fp8)}", "",
        f"ROPE = {_rope_fields(spec)!r}",
        f"NORM_EPS = {spec.norm_epsilon!r}",
        f"ROUTER = {_router_fields(spec)!r}",
        f"WEIGHT_TYING = {spec.tie_embeddings!r}",
        f"SEQ_LEN = {plan.seq_len}",
        f"LR = {peak_lr(model_params(pf))!r}  # <-- SET: peak learning rate (Llama 2's for this size; the "
        "flavour's warmup and decay stay)", "", "",
        f"def {CONFIG_FN}():",
        f"    config = {flavour.recipe(fp8)}()",
        ("    converters = [Float8LinearConverter.Config(filter_fqns=['lm_head'], model_compile_enabled=True)]"
         if fp8 else "    converters = None"),
        f"    config.model_spec = model_registry({flavour.flavor!r}, converters=converters)",
        "    model = config.model_spec.model",
        "    for _, rope, _, _ in model.traverse(RoPE.Config):",
        "        for key, value in ROPE.items():",
        "            setattr(rope, key, value)",
        "        rope.max_seq_len = max(rope.max_seq_len, SEQ_LEN)",
        "    for _, norm, _, _ in model.traverse(RMSNorm.Config):",
        "        norm.eps = NORM_EPS",
        *(["    for _, router, _, _ in model.traverse(TokenChoiceTopKRouter.Config):",
           "        for key, value in ROUTER.items():",
           "            setattr(router, key, value)"] if spec.moe else []),
        "    for group in config.optimizer.param_groups:",
        "        group.optimizer_kwargs['lr'] = LR",
        "    if hasattr(model, 'enable_weight_tying'):",
        "        model.enable_weight_tying = WEIGHT_TYING",
        "    return config", "",
    ]
    return "\n".join(lines)


_RUN_ARGS = ("--hf-assets-path", '"$HF_ASSETS_PATH"', "--dataloader.dataset", '"$DATASET"',
             "--dataloader.dataset-path", '"$DATASET_PATH"',
             "--dump-folder", '"$DUMP_FOLDER"', "--training.steps", '"$TRAIN_STEPS"', "--checkpoint.enable")
_PYTHONPATH = 'export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"  # autopar_torchtitan.py'


def torchtitan_launch_command(pf: PlanFile) -> str:
    """One torchrun line per node (cluster and path variables from the environment); the generated
    autopar_torchtitan.py must be on PYTHONPATH."""
    args = torchtitan_args(pf, (*_RUN_ARGS, *_checkpoint_args(pf)[0]))
    words = " ".join(shell_word(a) for a in args)
    return f"{TORCHRUN} \\\n    -m torchtitan.train {words}"


def _checkpoint_args(pf: PlanFile) -> tuple[list[str], int | None, int]:
    """(--checkpoint.* arguments, the planned run's steps or None, the interval) (checkpoint_schedule)."""
    interval, async_save, steps = checkpoint_schedule(pf)
    return (["--checkpoint.interval", str(interval)] + (["--checkpoint.async-mode", "async"] if async_save else []),
            steps, interval)


def export_torchtitan(pf: PlanFile) -> str:
    args = torchtitan_args(pf)
    checkpoint, steps, interval = _checkpoint_args(pf)
    settings = "\n".join([
        "# ---- Set these: tokenizer and weights folder, data, outputs ----",
        'HF_ASSETS_PATH="${HF_ASSETS_PATH:-/path/to/hf_assets}"   # <-- SET: tokenizer (and config.json) folder',
        'DATASET="${DATASET:-c4}"                                  # <-- SET: a dataset torchtitan registers '
        '(c4, c4_test) or yours',
        'DATASET_PATH="${DATASET_PATH:-/path/to/dataset}"         # <-- SET: local copy of the dataset',
        f"# Learning rate: LR in {CONFIG_MODULE}.py beside this script  <-- SET (Llama 2's peak for this size).",
        'DUMP_FOLDER="${DUMP_FOLDER:-./outputs}"                   # <-- SET: logs and checkpoints',
        'TRAIN_STEPS="${TRAIN_STEPS:-' + str(steps or 10000) + '}"' + " " * max(1, 27 - len(str(steps or 10000)))
        + "# <-- SET: training length" + (" (the planned run's)" if steps else ""),
        f"# Checkpoint every {interval} steps: the interval that maximises goodput under the run's interruptions"
        " (autopar.cost.run).",
    ])
    note = balance_note(pf.target.model_spec)
    parts = [header(pf, "torchtitan", "torchtitan launch"), *([f"# Note: {comment_safe(note)}."] if note else []),
             settings,
             cluster_block(pf, 29500), *filter(None, [fabric_block(pf, pf.parallel)]), _PYTHONPATH,
             bash_array("PLAN_ARGS", args[:-1]), bash_array("RUN_ARGS", [*_RUN_ARGS, *checkpoint]),
             f'{TORCHRUN} \\\n    -m torchtitan.train "${{PLAN_ARGS[@]}}" "${{RUN_ARGS[@]}}" {args[-1]}']
    return "\n\n".join(parts) + "\n"
