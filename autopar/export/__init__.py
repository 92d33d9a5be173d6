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
from autopar.export.importers import plan_from_deepspeed_config, plan_from_megatron_args
from autopar.export.megatron import export_megatron, megatron_args
from autopar.export.megatron_rules import megatron_violations
from autopar.export.torchtitan import export_torchtitan, torchtitan_args, torchtitan_launch_command
from autopar.schema.plan import Framework
from autopar.schema.plan_file import PlanFile

__all__ = ["EXPORT_FORMATS", "export", "export_megatron", "megatron_args", "megatron_violations", "export_deepspeed",
           "deepspeed_launch_command", "export_torchtitan", "torchtitan_args", "torchtitan_launch_command",
           "plan_from_megatron_args", "plan_from_deepspeed_config"]


def _megatron(pf: PlanFile) -> dict[str, str]:
    return {"launch_megatron.sh": export_megatron(pf)}


def _deepspeed(pf: PlanFile) -> dict[str, str]:
    config = export_deepspeed(pf)
    return {"ds_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
            "launch_deepspeed.sh": launch_script(pf, config)}


def _torchtitan(pf: PlanFile) -> dict[str, str]:
    return {"launch_torchtitan.sh": export_torchtitan(pf)}


_EXPORTERS: dict[Framework, Callable[[PlanFile], dict[str, str]]] = {
    Framework.MEGATRON: _megatron, Framework.DEEPSPEED: _deepspeed, Framework.TORCHTITAN: _torchtitan}

EXPORT_FORMATS: tuple[str, ...] = tuple(_EXPORTERS)


def export(pf: PlanFile, fmt: str) -> dict[str, str]:
    """{output file name: contents} for `fmt` (one of EXPORT_FORMATS)."""
    exporter = _EXPORTERS.get(fmt.lower())
    if exporter is None:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    return exporter(pf)


def framework_refusals(spec, gpus: int, plan) -> list[str]:
    """Why `plan.framework` cannot express `plan` for model `spec` on `gpus` GPUs (empty = it can):
    the exporters' own refusal rules, which the search applies as a filter so that it never emits
    a plan the target framework refuses. Megatron's rules are the plan validator's (tested by
    exporting sampled search spaces)."""
    from autopar.export.deepspeed import deepspeed_refusals
    from autopar.export.torchtitan import _config_for, torchtitan_refusals
    from autopar.schema.plan_file import PlanTarget

    if plan.framework == Framework.MEGATRON:
        return []
    pf = PlanFile(autopar_version="", target=PlanTarget(model=spec.name, model_spec=spec, cluster="-", gpus=gpus),
                  parallel=plan)
    if plan.framework == Framework.DEEPSPEED:
        return deepspeed_refusals(pf, plan)
    try:
        _config_for(pf, plan)
    except ExportError as exc:
        return [str(exc)]
    return torchtitan_refusals(pf, plan)
