"""Exporters: a plan file -> the launch files of one training framework, and importers back.

`export(pf, fmt)` returns {file name: contents}; every exporter refuses (ExportError, one line
naming the reason and the fix) a plan its framework cannot express. See each module's docstring
for the supported subset: megatron.py, deepspeed.py, torchtitan.py; importers.py reads Megatron
arguments and DeepSpeed configs back into plans.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from autopar.errors import AutoparError, ExportError
from autopar.frameworks import REGISTRY, plan_refusals
from autopar.export.deepspeed import (TRAIN_SCRIPT, deepspeed_launch_command, export_deepspeed, launch_script,
                                      train_script)
from autopar.export.hf_model import hf_config_from_spec
from autopar.export.importers import plan_from_deepspeed_config, plan_from_megatron_args
from autopar.export.megatron import export_megatron, megatron_args
from autopar.export.megatron_rules import megatron_violations
from autopar.export.torchtitan import (CONFIG_MODULE, config_module, export_torchtitan, torchtitan_args,
                                       torchtitan_launch_command)
from autopar.schema.plan import plan_violations
from autopar.schema.plan_file import PlanFile

__all__ = ["EXPORT_FORMATS", "export", "export_megatron", "megatron_args", "megatron_violations", "export_deepspeed",
           "deepspeed_launch_command", "export_torchtitan", "torchtitan_args", "torchtitan_launch_command",
           "plan_from_megatron_args", "plan_from_deepspeed_config"]


def megatron_files(pf: PlanFile) -> dict[str, str]:
    """launch_megatron.sh (autopar.frameworks.megatron names this its exporter)."""
    return {"launch_megatron.sh": export_megatron(pf)}


def deepspeed_files(pf: PlanFile) -> dict[str, str]:
    """ds_config.json, the launcher, and the model as a Hugging Face config.json (DeepSpeed's config
    has no model section; the training script builds the model from this file)."""
    config = export_deepspeed(pf)
    try:
        model = hf_config_from_spec(pf.target.model_spec)
    except ExportError:
        model = None
    files = {"ds_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
             "launch_deepspeed.sh": launch_script(pf, config, has_model_config=model is not None),
             TRAIN_SCRIPT: train_script(pf, pf.parallel.for_framework("deepspeed"))}
    if model is not None:
        files["config.json"] = json.dumps(model, indent=2) + "\n"
    return files


def torchtitan_files(pf: PlanFile) -> dict[str, str]:
    """launch_torchtitan.sh and the config_registry module it trains."""
    script = export_torchtitan(pf)
    return {"launch_torchtitan.sh": script, f"{CONFIG_MODULE}.py": config_module(pf)}


EXPORT_FORMATS: tuple[str, ...] = tuple(REGISTRY)


def export(pf: PlanFile, fmt: str) -> dict[str, str]:
    """{output file name: contents} for `fmt` (one of EXPORT_FORMATS), written by the framework's
    registered exporter (autopar.frameworks). A plan made for another framework is re-checked under
    `fmt` first (retarget_problems): if `fmt` would run something else or the plan no longer fits,
    the export refuses, naming the command that re-plans it for `fmt`; never a silent change."""
    name = fmt.lower()
    if name not in REGISTRY:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    source = str(pf.parallel.framework)
    if source != name:
        from autopar.frameworks import model_refusals

        cannot = model_refusals(name, pf.target.model_spec)  # no layout helps: a re-plan would refuse it too
        if cannot:
            if name == "torchtitan":
                from autopar.export.torchtitan import flavour_needed, no_flavour_reason

                if no_flavour_reason(pf.target.model_spec):
                    cannot = [*cannot, flavour_needed(pf.target.model_spec)]
            raise ExportError(f"{name} cannot train {pf.target.model_spec.name} in any layout: " + "; ".join(cannot))
        problems = retarget_problems(pf, name)
        if problems:
            raise ExportError(f"this plan was made for {source} and {name} would not run it as planned: "
                              + "; ".join(problems) + f"; re-plan it for {name} with `{replan_command(pf, name)}`")
    try:
        return REGISTRY[name].export_files(pf)
    except ExportError as exc:
        if source == name:
            raise
        raise ExportError(f"{exc}. This plan was made for {source}; re-plan it for {name} "
                          f"with `{replan_command(pf, name)}`") from None


def retarget_problems(pf: PlanFile, target: str) -> list[str]:
    """What changes when `target` runs the plan made for another framework (empty = the same plan,
    and it fits): the plan rules and refusals of `target`, a recompute policy or ZeRO sharding it
    would run differently, and the peak memory priced under `target`'s profile against the plan's
    usable memory. The exporter's own refusals follow in export()."""
    from autopar.frameworks import framework_spec

    plan, source = pf.parallel, str(pf.parallel.framework)
    old, new = framework_spec(source), framework_spec(target)
    out = []
    was, will = plan.recompute.label(source), plan.recompute.label(target)
    if was != will:
        out.append(f"recompute {was} under {source} would be {will} under {target}")
    if plan.zero in new.zero_stages and old.sharded_states(plan.zero) != new.sharded_states(plan.zero):
        out.append(f"zero {plan.zero} shards {_states(old.sharded_states(plan.zero))} under {source} but "
                   f"{_states(new.sharded_states(plan.zero))} under {target}")
    try:
        moved = plan.for_framework(target)
    except ValidationError as exc:
        from autopar.schema import one_line

        return out + [one_line(exc, f"the plan under {target}")]
    spec = pf.target.model_spec
    out += [*plan_violations(moved, num_gpus=pf.target.gpus, num_layers=spec.num_layers,
                             num_heads=spec.num_attention_heads, num_kv_heads=spec.kv_heads,
                             num_experts=spec.moe.num_experts if spec.moe else 0, **spec.mixer_counts()),
            *plan_refusals(spec, pf.target.gpus, moved)]
    return out or _memory_problems(pf, moved, target)


def _states(states: tuple[str, ...]) -> str:
    return ", ".join(states) or "nothing"


def _memory_problems(pf: PlanFile, moved, target: str) -> list[str]:
    """The plan's peak under `target` against its usable memory (the margin it was planned with)."""
    from autopar.cost.step import DEFAULT_MEMORY_MARGIN, estimate
    from autopar.inputs import load_cluster, load_target_model, resolve_cost_model
    from autopar.units import GiB

    t = pf.target
    try:
        cluster = load_cluster(t.cluster, t.gpus)
        cost = resolve_cost_model(cluster, t.cost_model)
    except (AutoparError, OSError, ValueError) as exc:
        return [f"its memory cannot be re-checked under {target} without the cluster profile ({exc})"]
    margin = (pf.estimate or {}).get("memory_margin")  # a file's value: used only when it is a margin
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0.0 <= margin < 1.0:
        margin = DEFAULT_MEMORY_MARGIN
    est = estimate(load_target_model(t.model, t.model_spec), cluster, moved, cost, margin)
    if est.fits:
        return []
    return [f"under {target} it needs {est.peak_memory_bytes / GiB:.1f} GiB per GPU of the "
            f"{est.usable_memory_bytes / GiB:.1f} usable"]


def replan_command(pf: PlanFile, framework: str) -> str:
    """The `autopar plan` command that searches the plan's model, cluster, GPUs, sequence length and
    global batch again with `framework`'s limits."""
    import shlex

    t, p = pf.target, pf.parallel
    return (f"autopar plan {shlex.quote(t.model)} --cluster {shlex.quote(t.cluster)} --gpus {t.gpus} "
            f"--seq-len {p.seq_len} --global-batch {p.global_batch} --framework {framework}")


def framework_refusals(spec, gpus: int, plan) -> list[str]:
    """Why `plan.framework` cannot express `plan` for model `spec` on `gpus` GPUs (empty = it can):
    autopar.frameworks.plan_refusals, the one refusal function the exporters refuse with and the
    search filters by, so `plan --framework X` never emits a plan `export` refuses. Megatron's rules
    are the plan validator's (tested by exporting sampled search spaces)."""
    return plan_refusals(spec, gpus, plan)
