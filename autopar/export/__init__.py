"""Exporters: a plan file -> the launch files of one training framework, and importers back.

`export(pf, fmt)` returns {file name: contents}; every exporter refuses (ExportError, one line
naming the reason and the fix) a plan its framework cannot express. See each module's docstring
for the supported subset: megatron.py, deepspeed.py, torchtitan.py; importers.py reads Megatron
arguments and DeepSpeed configs back into plans.
"""

from __future__ import annotations

import json
from typing import Callable

from autopar.errors import ExportError
from autopar.export.deepspeed import deepspeed_launch_command, export_deepspeed, launch_script
from autopar.export.hf_model import hf_config_from_spec
from autopar.export.importers import plan_from_deepspeed_config, plan_from_megatron_args
from autopar.export.megatron import export_megatron, megatron_args
from autopar.export.megatron_rules import megatron_violations
from autopar.export.torchtitan import (CONFIG_MODULE, config_module, export_torchtitan, torchtitan_args,
                                       torchtitan_launch_command)
from autopar.schema.plan import Framework
from autopar.schema.plan_file import PlanFile

__all__ = ["EXPORT_FORMATS", "export", "export_megatron", "megatron_args", "megatron_violations", "export_deepspeed",
           "deepspeed_launch_command", "export_torchtitan", "torchtitan_args", "torchtitan_launch_command",
           "plan_from_megatron_args", "plan_from_deepspeed_config"]


def _megatron(pf: PlanFile) -> dict[str, str]:
    return {"launch_megatron.sh": export_megatron(pf)}


def _deepspeed(pf: PlanFile) -> dict[str, str]:
    """ds_config.json, the launcher, and the model as a Hugging Face config.json (DeepSpeed's config
    has no model section; the training script builds the model from this file)."""
    config = export_deepspeed(pf)
    try:
        model = hf_config_from_spec(pf.target.model_spec)
    except ExportError:
        model = None
    files = {"ds_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
             "launch_deepspeed.sh": launch_script(pf, config, has_model_config=model is not None)}
    if model is not None:
        files["config.json"] = json.dumps(model, indent=2) + "\n"
    return files


def _torchtitan(pf: PlanFile) -> dict[str, str]:
    script = export_torchtitan(pf)
    return {"launch_torchtitan.sh": script, f"{CONFIG_MODULE}.py": config_module(pf)}


_EXPORTERS: dict[Framework, Callable[[PlanFile], dict[str, str]]] = {
    Framework.MEGATRON: _megatron, Framework.DEEPSPEED: _deepspeed, Framework.TORCHTITAN: _torchtitan}

EXPORT_FORMATS: tuple[str, ...] = tuple(_EXPORTERS)


def export(pf: PlanFile, fmt: str) -> dict[str, str]:
    """{output file name: contents} for `fmt` (one of EXPORT_FORMATS). A plan made for another
    framework that `fmt` refuses names the command that re-plans it for `fmt`."""
    exporter = _EXPORTERS.get(fmt.lower())
    if exporter is None:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    try:
        return exporter(pf)
    except ExportError as exc:
        if pf.parallel.framework == fmt.lower():
            raise
        raise ExportError(f"{exc}. This plan was made for {pf.parallel.framework}; re-plan it for {fmt.lower()} "
                          f"with `{replan_command(pf, fmt.lower())}`") from None


def replan_command(pf: PlanFile, framework: str) -> str:
    """The `autopar plan` command that searches the plan's model, cluster, GPUs, sequence length and
    global batch again with `framework`'s limits."""
    import shlex

    t, p = pf.target, pf.parallel
    return (f"autopar plan {shlex.quote(t.model)} --cluster {shlex.quote(t.cluster)} --gpus {t.gpus} "
            f"--seq-len {p.seq_len} --global-batch {p.global_batch} --framework {framework}")


def framework_refusals(spec, gpus: int, plan) -> list[str]:
    """Why `plan.framework` cannot express `plan` for model `spec` on `gpus` GPUs (empty = it can):
    the one refusal function that the DeepSpeed and torchtitan exporters refuse with and the search
    filters by (search.space.plan_problems), so `plan --framework X` never emits a plan `export`
    refuses. Megatron's rules are the plan validator's (tested by exporting sampled search spaces)."""
    from autopar.export.deepspeed import deepspeed_refusals
    from autopar.export.torchtitan import torchtitan_refusals
    from autopar.schema.plan_file import PlanTarget

    if plan.framework == Framework.MEGATRON:
        return []
    pf = PlanFile(autopar_version="", target=PlanTarget(model=spec.name, model_spec=spec, cluster="-", gpus=gpus),
                  parallel=plan)
    if plan.framework == Framework.DEEPSPEED:
        return deepspeed_refusals(pf, plan)
    return torchtitan_refusals(pf, plan)
