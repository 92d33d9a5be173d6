"""torchtitan export: command-line overrides for torchtitan 0.3 (`python -m torchtitan.train
--module M --config C --section.key value ... activation-checkpoint:MODE`).

torchtitan 0.3 builds the model from a config_registry function (--module llama3 --config
llama3_70b), parsed by tyro; flags are the dataclass fields of torchtitan/config/configs.py with
dashes, and the activation-checkpoint policy is a subcommand that must come last. Mapping:
- dp: zero 0 = every dp rank a replica (data_parallel_replicate_degree dp, shard 1); zero 2/3 =
  FSDP2 over dp (reshard after forward never/always); zero_shard_size k = HSDP, shard k,
  replicate dp/k. torchtitan shards parameters over dp_shard·cp whenever cp > 1, so zero 0 with cp
  is refused.
- pp: one model part per virtual stage, listed exactly (--parallelism.module-fqns-per-model-part),
  schedule 1F1B (vpp 1) or Interleaved1F1B; local batch = global / dp, pipeline micro-batch = mbs.
  Without pp: local batch = mbs and gradient accumulation fills the global batch.
- ep: experts are sharded by ep alone (etp 1) when ep > 1, by tp when ep = 1; ep must divide
  dp_shard·cp·tp. cp all-gathers K/V (torch's default rotate method), so cp_comm_type must be
  allgather. tp_comm_overlap = async TP (compile on).
- recompute: none / selective (torchtitan's per-op SAC: the closest policy, not the same set of
  tensors as Megatron's modules) / full (every block). Full of K < all layers is refused.
- precision: fp8 only where a registry config carries the float8 converter (table below).
Overlap flags are not settable: FSDP2 always prefetches and overlaps.
"""

from __future__ import annotations

import shlex

from autopar.cost.layout import Layout
from autopar.export.common import (DEFAULT_GPUS_PER_NODE, TORCHRUN, bash_array, cluster_block, header, layer_counts,
                                   plan_layout, refuse, require_exportable)
from autopar.schema.plan import ParallelPlan, RecomputeMode
from autopar.schema.plan_file import PlanFile

# (autopar preset, precision) -> (torchtitan --module, --config), torchtitan 0.3.0 config_registry
TORCHTITAN_CONFIGS: dict[tuple[str, str], tuple[str, str]] = {
    ("llama3-8b", "bf16"): ("llama3", "llama3_8b"),
    ("llama3-8b", "fp8"): ("llama3", "llama3_8b_mxfp8"),
    ("llama3-70b", "bf16"): ("llama3", "llama3_70b"),
    ("llama3.1-405b", "fp8"): ("llama3", "llama3_405b"),  # the registry's 405B trains with Float8Linear
    ("qwen3-30b-a3b", "bf16"): ("qwen3", "qwen3_30b_a3b"),
    ("deepseek-v3", "bf16"): ("deepseek_v3", "deepseek_v3_671b"),
    ("deepseek-v3", "fp8"): ("deepseek_v3", "deepseek_v3_671b_float8"),
}


def _config_for(pf: PlanFile, plan: ParallelPlan) -> tuple[str, str]:
    key = (pf.target.model_spec.name, plan.precision)
    if key not in TORCHTITAN_CONFIGS:
        known = ", ".join(f"{m} {p}" for m, p in TORCHTITAN_CONFIGS)
        refuse("torchtitan", [f"no torchtitan 0.3 config_registry entry trains {key[0]} in {key[1]} (it builds "
                              f"models from Python configs, not flags); supported: {known}"])
    return TORCHTITAN_CONFIGS[key]


def torchtitan_refusals(pf: PlanFile, plan: ParallelPlan) -> list[str]:
    """Every reason torchtitan 0.3 cannot run `plan` (empty = exportable)."""
    out = []
    # The search calls this per candidate: the shard degrees read here do not depend on the node size.
    spec, layout = pf.target.model_spec, plan_layout(pf, plan, DEFAULT_GPUS_PER_NODE)
    if spec.mtp_layers:
        out.append(f"{spec.mtp_layers} MTP layer(s): torchtitan's {spec.name} config builds no MTP module and no "
                   "flag adds one; export to megatron")
    if plan.zero == 0 and plan.cp > 1:
        out.append("zero 0 with cp > 1: torchtitan always shards parameters over dp_shard·cp (FSDP over the cp "
                   "ranks); use zero 2 or 3")
    if plan.zero == 0 and plan.zero_shard_size is not None:
        out.append("zero_shard_size with zero 0: nothing is sharded; drop it or use zero 2/3")
    shard = 1 if plan.zero == 0 else layout.dp_shard
    if plan.ep > 1 and (shard * plan.cp * plan.tp) % plan.ep:
        out.append(f"ep {plan.ep} must divide dp_shard·cp·tp = {shard}·{plan.cp}·{plan.tp} (torchtitan borrows "
                   "expert ranks from FSDP and TP); change ep or the sharding")
    if spec.moe is not None and plan.expert_tp != (1 if plan.ep > 1 else plan.tp):
        out.append(f"etp {plan.expert_tp}: torchtitan shards experts by ep alone when ep > 1 (etp 1) and by tp when "
                   "ep = 1 (etp = tp); set etp accordingly")
    if spec.moe is not None and plan.ep > 1 and plan.moe_dispatcher != "alltoall":
        out.append("moe dispatcher allgather: torchtitan dispatches tokens to experts with all-to-all")
    if plan.moe_capacity_factor is not None:
        out.append("moe capacity factor: torchtitan's MoE is dropless; drop the capacity factor")
    if plan.cp > 1 and plan.cp_comm_type != "allgather":
        out.append(f"cp_comm_type {plan.cp_comm_type}: torchtitan's context parallelism all-gathers K/V (torch's "
                   "default rotate method); plan cp_comm_type allgather")
    if plan.recompute.mode == RecomputeMode.FULL and plan.recompute.num_layers is not None:
        out.append(f"full recompute of {plan.recompute.num_layers} layers per stage: torchtitan checkpoints every "
                   "block or none; use full recompute of every layer")
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


def _pp_args(pf: PlanFile, plan: ParallelPlan, dp: int) -> list[str]:
    args = ["--parallelism.pipeline-parallel-degree", str(plan.pp)]
    if plan.pp == 1:
        return args + ["--training.local-batch-size", str(plan.mbs)]
    return args + ["--parallelism.pipeline-parallel-schedule", "Interleaved1F1B" if plan.vpp > 1 else "1F1B",
                   "--parallelism.pipeline-parallel-layers-per-stage", "None",
                   "--parallelism.module-fqns-per-model-part", *model_parts(layer_counts(pf)),
                   "--parallelism.pipeline-parallel-microbatch-size", str(plan.mbs),
                   "--training.local-batch-size", str(plan.global_batch // dp)]


def _ac_subcommand(plan: ParallelPlan) -> str:
    return "activation-checkpoint:" + {"none": "none", "selective": "selective", "full": "full"}[plan.recompute.mode]


def torchtitan_args(pf: PlanFile, run_args: tuple[str, ...] = ()) -> list[str]:
    """Arguments after `-m torchtitan.train`; `run_args` (paths, steps) go before the
    activation-checkpoint subcommand, which tyro needs last."""
    plan = require_exportable(pf, "torchtitan")
    module, config = _config_for(pf, plan)
    refuse("torchtitan", torchtitan_refusals(pf, plan))
    layout = plan_layout(pf, plan)
    dp = layout.dp
    args = ["--module", module, "--config", config, *_dp_args(plan, layout),
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
    if plan.tp_comm_overlap:
        args += ["--compile.enable", "--compile.components", "model,loss", "--compile.enable-async-tensor-parallel"]
    else:
        args.append("--compile.no-enable-async-tensor-parallel")
    return args + list(run_args) + [_ac_subcommand(plan)]


_RUN_ARGS = ("--hf-assets-path", '"$HF_ASSETS_PATH"', "--dataloader.dataset-path", '"$DATASET_PATH"',
             "--dump-folder", '"$DUMP_FOLDER"', "--training.steps", '"$TRAIN_STEPS"', "--checkpoint.enable")


def torchtitan_launch_command(pf: PlanFile) -> str:
    """One torchrun line per node (cluster and path variables from the environment)."""
    args = torchtitan_args(pf, _RUN_ARGS)
    words = " ".join(a if a.startswith('"$') else shlex.quote(a) for a in args)
    return f"{TORCHRUN} \\\n    -m torchtitan.train {words}"


def export_torchtitan(pf: PlanFile) -> str:
    args = torchtitan_args(pf)
    settings = "\n".join([
        "# ---- Set these: tokenizer and weights folder, data, outputs ----",
        'HF_ASSETS_PATH="${HF_ASSETS_PATH:-/path/to/hf_assets}"   # <-- SET: tokenizer (and config.json) folder',
        'DATASET_PATH="${DATASET_PATH:-/path/to/dataset}"         # <-- SET: local copy of the dataset',
        'DUMP_FOLDER="${DUMP_FOLDER:-./outputs}"                   # <-- SET: logs and checkpoints',
        'TRAIN_STEPS="${TRAIN_STEPS:-10000}"                       # <-- SET: training length',
    ])
    parts = [header(pf, "torchtitan", "torchtitan launch"), settings, cluster_block(pf, 29500),
             bash_array("PLAN_ARGS", args[:-1]), bash_array("RUN_ARGS", list(_RUN_ARGS)),
             f'{TORCHRUN} \\\n    -m torchtitan.train "${{PLAN_ARGS[@]}}" "${{RUN_ARGS[@]}}" {args[-1]}']
    return "\n\n".join(parts) + "\n"
