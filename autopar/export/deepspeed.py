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

from autopar.export.common import cluster_block, header, node_shape, plan_layout, refuse, require_exportable
from autopar.frameworks import plan_refusals
from autopar.schema.plan import ParallelPlan, RecomputeMode
from autopar.schema.plan_file import PlanFile

BUCKET_BYTES = 500_000_000  # DeepSpeed's default reduce/allgather bucket (elements), zero/config.py


def deepspeed_refusals(pf: PlanFile, plan: ParallelPlan) -> list[str]:
    """Every reason the DeepSpeed engine cannot run `plan` (empty = exportable): the framework's own
    refusals (autopar.frameworks.deepspeed), which the search filters by."""
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
    if plan.recompute.mode == RecomputeMode.FULL:
        config["activation_checkpointing"] = {
            "partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
            "number_checkpoints": plan.recompute.num_layers, "synchronize_checkpoint_boundary": False,
            "profile": False}
    if plan.pp > 1:
        config["pipeline"] = {"stages": plan.pp,
                              "activation_checkpoint_interval": 1 if plan.recompute.mode == RecomputeMode.FULL else 0}
    return config


def deepspeed_launch_command(pf: PlanFile, config_path: str = "ds_config.json") -> str:
    """One `deepspeed` launcher line; the hostfile, port and training script come from the environment."""
    per_node, nodes = node_shape(pf)
    return (f'deepspeed --hostfile "${{HOSTFILE:-hostfile}}" --num_nodes "${{NNODES:-{nodes}}}" '
            f'--num_gpus "${{GPUS_PER_NODE:-{per_node}}}" '
            f'--master_addr "${{MASTER_ADDR:-localhost}}" --master_port "${{MASTER_PORT:-29500}}" '
            f'"${{TRAIN_SCRIPT:-train.py}}" --deepspeed --deepspeed_config {shlex.quote(config_path)}')


def launch_script(pf: PlanFile, config: dict[str, Any], config_path: str = "ds_config.json",
                  has_model_config: bool = False) -> str:
    plan, spec = pf.parallel, pf.target.model_spec
    where = ("from the config.json beside this script (AutoModelForCausalLM.from_config(AutoConfig.from_pretrained"
             "(MODEL_DIR)): RoPE, norm epsilon, window and router as the model's config has them)"
             if has_model_config else "(no Hugging Face model_type describes this model: build it yourself)")
    model_code = [f"# The training script builds the model {where}",
                  f"# and calls deepspeed.initialize(config={config_path!r}).",
                  f"# Sequence length {plan.seq_len} tokens (DeepSpeed's config does not carry it): SEQ_LEN below."]
    if plan.pp > 1:
        model_code.append(f"# pp {plan.pp}: wrap the {spec.num_layers} decoder layers in "
                          f"PipelineModule(num_stages={plan.pp}, partition_method='type:<DecoderLayer>') so every "
                          f"stage gets {spec.num_layers // plan.pp} layers.")
    if plan.recompute.mode == RecomputeMode.FULL and plan.recompute.num_layers is not None:
        model_code.append(f"# Recompute: wrap the first {plan.recompute.num_layers} decoder layers of the model in "
                          "deepspeed.checkpointing.checkpoint.")
    body = [header(pf, "deepspeed", "DeepSpeed launch"), "\n".join(model_code),
            "# ---- Set these ----\n"
            'HOSTFILE="${HOSTFILE:-hostfile}"                 # <-- SET: one line per node, "host slots=N"\n'
            'TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"         # <-- SET: your DeepSpeed training script\n'
            f'export SEQ_LEN="${{SEQ_LEN:-{plan.seq_len}}}"',
            cluster_block(pf, 29500, per_node=False),
            deepspeed_launch_command(pf, config_path),
            "# ds_config.json as written beside this script:\n# "
            + json.dumps(config, sort_keys=True).replace("\n", " ")]
    return "\n\n".join(body) + "\n"
