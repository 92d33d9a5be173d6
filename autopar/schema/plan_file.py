"""The plan JSON (`autopar plan --out plan.json`): a schema-versioned record of one plan, what it
was planned for, and its estimate. Exporters and `explain`/`compare` read it; it carries the
full model spec so a plan made from a config file stays usable without that file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


from autopar.errors import SchemaError
from autopar.io import read_json_object, write_output
from autopar.limits import MAX_GPUS
from autopar.schema import one_line
from autopar.schema.model import ModelSpec
from autopar.schema.plan import PLAN_SCHEMA_VERSION, ParallelPlan
from autopar.schema.types import Count

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class PlanTarget(BaseModel):
    """What the plan is for: the model (as given and as resolved), the cluster and its size."""

    model_config = _FROZEN

    model: str = Field(..., description="The model argument as the user gave it (preset name or path).")
    model_spec: ModelSpec = Field(..., description="The resolved architecture.")
    cluster: str = Field(..., description="The cluster profile name or path.")
    gpus: Count = Field(..., ge=1, le=MAX_GPUS, description="Number of GPUs.")
    cost_model: str | None = Field(None, description="Cost model name or path; None = the cluster GPU's default.")


class PlanFile(BaseModel):
    """Top level of plan.json."""

    model_config = _FROZEN

    schema_version: Literal[1] = PLAN_SCHEMA_VERSION
    autopar_version: str = Field(..., description="autopar version that wrote the file.")
    target: PlanTarget
    parallel: ParallelPlan
    estimate: dict[str, Any] = Field(default_factory=dict, description="`estimate --json` keys at planning time.")


def plan_file_text(plan_file: PlanFile) -> str:
    """The file's text, deterministic (sorted keys, fixed float repr) so equal plans give equal bytes."""
    return json.dumps(plan_file.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def write_plan_file(path: Path, plan_file: PlanFile, force: bool = True) -> None:
    """Write atomically (autopar.io.write_output); an existing file is replaced only with `force`."""
    write_output(path, plan_file_text(plan_file), force=force, what="plan file")


def read_plan_file(path: str | Path) -> PlanFile:
    p = Path(path).expanduser()
    raw = read_json_object(p, "plan file", f"write one with `autopar plan ... --out {p.name}`")
    if raw.get("schema_version") != PLAN_SCHEMA_VERSION:
        raise SchemaError(f"plan file {p} has schema_version {raw.get('schema_version')!r}, this autopar reads "
                          f"{PLAN_SCHEMA_VERSION}; re-create it with `autopar plan --out`")
    try:
        return PlanFile(**raw)
    except ValidationError as exc:
        raise SchemaError(one_line(exc, f"plan file {p}"))
