"""DeepSpeed export: a ds_config.json and a `deepspeed` launcher line.

Supported subset (the DeepSpeed engine itself, not Megatron-DeepSpeed):
- the model as a Hugging Face config.json beside ds_config.json (export/hf_model.py): DeepSpeed's
  config has no model section, the training script builds the model from that file;
- data parallelism with ZeRO 0-3 (zero_optimization.stage), bf16;
- pipeline parallelism through PipelineModule (config "pipeline": {"stages": pp}), only with
  ZeRO 0/1, vpp 1 and an even split of the decoder layers (PipelineModule partitions evenly);
- recompute: none; selective of core attention only (no flag: flash/SDPA attention stores no
  attention scores, which is what Megatron's core_attn recompute saves); full of every layer
  (pipeline.activation_checkpoint_interval 1, activation_checkpointing section); full of K layers
  per stage without a pipeline (number_checkpoints K; the model wraps its first K blocks in
  deepspeed.checkpointing.checkpoint).
Refused with the reason: tp, cp, ep > 1 (no tensor/context/expert parallelism in the engine),
vpp > 1, fp8, zero_shard_size (MiCS hybrid sharding was removed in DeepSpeed 0.19), uneven or
interleaved pipelines, MoE capacity settings, other selective modules, and full K with a pipeline.

Bucket sizes for ZeRO-3 follow the values Hugging Face's DeepSpeed integration fills for "auto"
(reduce bucket h², prefetch 0.9·h², persistence threshold 10·h; transformers docs, "ZeRO-3 config").
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autopar.export.common import (checkpoint_schedule, cluster_block, header, model_params, node_shape, peak_lr,
                                   plan_layout, refuse, require_exportable)
from autopar.frameworks import plan_refusals
from autopar.schema.plan import ParallelPlan, RecomputeMode
from autopar.schema.plan_file import PlanFile

BUCKET_BYTES = 500_000_000  # DeepSpeed's default reduce/allgather bucket (elements), zero/config.py


def deepspeed_refusals(pf: PlanFile, plan: ParallelPlan) -> list[str]:
    """Every reason the DeepSpeed engine cannot run `plan` (empty = exportable): the framework's own
    refusals (autopar.frameworks.deepspeed), which the search filters by (a pipeline of a model the
    training script cannot cut into PipelineModule layers among them)."""
    return plan_refusals(pf.target.model_spec, pf.target.gpus, plan)


def _zero_section(pf: PlanFile, plan: ParallelPlan) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": plan.zero, "overlap_comm": plan.overlap_grad_reduce,
                            "contiguous_gradients": True, "reduce_scatter": True,
                            "reduce_bucket_size": BUCKET_BYTES, "allgather_bucket_size": BUCKET_BYTES}
    if plan.zero == 3:
        h = pf.target.model_spec.hidden_size
        zero |= {"reduce_bucket_size": h * h,
                 "stage3_prefetch_bucket_size": int(0.9 * h * h) if plan.overlap_param_gather else 0,
                 "stage3_param_persistence_threshold": 10 * h,
                 "stage3_gather_16bit_weights_on_model_save": True}
    return zero


def export_deepspeed(pf: PlanFile) -> dict[str, Any]:
    """The ds_config dict; ExportError names what DeepSpeed cannot express."""
    plan = require_exportable(pf, "deepspeed")
    refuse("deepspeed", deepspeed_refusals(pf, plan))
    layout = plan_layout(pf, plan)
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": layout.num_microbatches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "bf16": {"enabled": True},
        "zero_optimization": _zero_section(pf, plan),
        "wall_clock_breakdown": False,
    }
    config |= optimizer_sections(model_params(pf), train_steps(pf)[0])
    if plan.recompute.mode == RecomputeMode.FULL:
        config["activation_checkpointing"] = {
            "partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
            "number_checkpoints": plan.recompute.num_layers, "synchronize_checkpoint_boundary": False,
            "profile": False}
    if plan.pp > 1:
        config["pipeline"] = {"stages": plan.pp,
                              "activation_checkpoint_interval": 1 if plan.recompute.mode == RecomputeMode.FULL else 0}
    return config


TRAIN_SCRIPT = "train_deepspeed.py"  # shipped as autopar/export/templates/train_deepspeed.py


def deepspeed_launch_command(pf: PlanFile, config_path: str = "ds_config.json") -> str:
    """One `deepspeed` launcher line running the exported training script with the files beside
    it ("$HERE", the script's folder); hostfile, node shape and port come from the environment."""
    per_node, nodes = node_shape(pf)
    return (f'deepspeed --hostfile "${{HOSTFILE:-hostfile}}" --num_nodes "${{NNODES:-{nodes}}}" '
            f'--num_gpus "${{GPUS_PER_NODE:-{per_node}}}" '
            f'--master_addr "${{MASTER_ADDR:-localhost}}" --master_port "${{MASTER_PORT:-29500}}" '
            f'"$HERE/{TRAIN_SCRIPT}" --deepspeed --deepspeed_config "$HERE/{shlex.quote(config_path)}" '
            '--dataset-path "$DATASET_PATH" --save-dir "$SAVE_DIR" --steps "$TRAIN_STEPS" --lr "$LR"')


def launch_script(pf: PlanFile, config: dict[str, Any], config_path: str = "ds_config.json",
                  has_model_config: bool = False) -> str:
    plan = pf.parallel
    optimizer, scheduler = config["optimizer"]["params"], config["scheduler"]["params"]
    model = ("the config.json beside this script (RoPE, norm epsilon, window and router as the model's config has "
             "them)" if has_model_config else
             "build_model() in it: no Hugging Face model_type describes this model, so build it yourself there")
    notes = [f"# {TRAIN_SCRIPT} (beside this script) builds the model from {model},",
             f"# reads {config_path} beside it and trains sequences of {plan.seq_len} tokens "
             f"({plan.recompute.label('deepspeed')} recompute{f', pipeline of {plan.pp} stages' if plan.pp > 1 else ''}).",
             f"# Optimizer and schedule in {config_path}: AdamW (betas {optimizer['betas'][0]}/{optimizer['betas'][1]}, "
             f"weight decay {optimizer['weight_decay']}), {scheduler['warmup_num_steps']} warmup steps, cosine to "
             f"{scheduler['cos_min_ratio']:g} of the peak (Llama 2's recipe; LR and steps below override it)."]
    steps = scheduler["total_num_steps"]
    settings = "\n".join([
        "# ---- Set these: data, outputs, hosts, learning rate and length ----",
        'HERE="$(cd "$(dirname "$0")" && pwd)"',
        'DATASET_PATH="${DATASET_PATH:-/path/to/tokens.bin}"      # <-- SET: flat file of token ids (see train_deepspeed.py)',
        'SAVE_DIR="${SAVE_DIR:-$HERE/checkpoints}"                 # <-- SET: checkpoints',
        'HOSTFILE="${HOSTFILE:-hostfile}"                          # <-- SET: one line per node, "host slots=N"',
        f'LR="${{LR:-{optimizer["lr"]:g}}}"' + " " * max(1, 50 - len(f'LR="${{LR:-{optimizer["lr"]:g}}}"'))
        + "# <-- SET: peak learning rate",
        f'TRAIN_STEPS="${{TRAIN_STEPS:-{steps}}}"' + " " * max(1, 50 - len(f'TRAIN_STEPS="${{TRAIN_STEPS:-{steps}}}"'))
        + "# <-- SET: training length (the schedule decays over it)",
    ])
    body = [header(pf, "deepspeed", "DeepSpeed launch"), "\n".join(notes), settings,
            cluster_block(pf, 29500, per_node=False),
            deepspeed_launch_command(pf, config_path),
            f"# {config_path} as written beside this script:\n# "
            + json.dumps(config, sort_keys=True).replace("\n", " ")]
    return "\n\n".join(body) + "\n"


# AdamW and the LR schedule of Llama 2 (Touvron et al. 2023, arXiv 2307.09288, sec. 2.2): betas 0.9/0.95,
# eps 1e-5, weight decay 0.1, clipping 1.0, 2000 warmup steps, cosine decay to 10% of the peak; the peak
# is common.peak_lr. The user sets the peak and the length (<-- SET).
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-5
WEIGHT_DECAY = 0.1
WARMUP_STEPS = 2000
MIN_LR_RATIO = 0.1


def optimizer_sections(params: int, steps: int) -> dict[str, Any]:
    """DeepSpeed's "optimizer" (AdamW) and "scheduler" (WarmupCosineLR, linear warmup) sections;
    the warmup is at most a tenth of the run."""
    warmup = max(1, min(WARMUP_STEPS, steps // 10))
    return {"optimizer": {"type": "AdamW", "params": {"lr": peak_lr(params), "betas": list(ADAM_BETAS),
                                                       "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY}},
            "scheduler": {"type": "WarmupCosineLR", "params": {
                "total_num_steps": steps, "warmup_num_steps": warmup, "warmup_type": "linear",
                "warmup_min_ratio": 0.0, "cos_min_ratio": MIN_LR_RATIO}}}


DEFAULT_TRAIN_STEPS = 10000  # a plan without a whole-run block: the launch file's default length (<-- SET)


def train_steps(pf: PlanFile) -> tuple[int, int]:
    """(training steps: the planned run's or DEFAULT_TRAIN_STEPS, checkpoint interval in steps)."""
    interval, _, steps = checkpoint_schedule(pf)
    return steps or DEFAULT_TRAIN_STEPS, interval


def train_script(pf: PlanFile, plan: ParallelPlan) -> str:
    """train_deepspeed.py: the shipped template with its PLAN block set to this plan."""
    from importlib.resources import files

    template = files("autopar.export").joinpath("templates", TRAIN_SCRIPT).read_text(encoding="utf-8")
    steps, interval = train_steps(pf)
    rc = plan.recompute
    settings = {"seq_len": plan.seq_len, "recompute": str(rc.mode.value if hasattr(rc.mode, "value") else rc.mode),
                "recompute_layers": rc.num_layers, "pp": plan.pp, "steps": steps, "checkpoint_interval": interval,
                "vocab_size": pf.target.model_spec.vocab_size}
    start = template.index("PLAN = {")
    end = template.index("}", start) + 1
    return template[:start] + f"PLAN = {settings!r}" + template[end:]
