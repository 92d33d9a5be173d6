"""A user's measured runs for `autopar calibrate runs.yaml`.

    runs:
      - model: llama3-8b            # preset, config.json or YAML layer graph
        cluster: dgx-h100           # profile name or YAML
        gpus: 8
        seq_len: 8192
        global_batch: 128
        parallel: {tp: 1, pp: 1, cp: 2, mbs: 1, recompute: none, zero: 1}
        step_time_s: 9.49           # measured, averaged over steady-state iterations
        source: our cluster, Megatron-Core 0.12, 2026-11-20
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autopar.schema.types import Count, Real

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class UserRun(BaseModel):
    model_config = _FROZEN

    model: str = Field(..., description="Preset name or model file.")
    cluster: str = Field(..., description="Cluster profile name or YAML.")
    gpus: Count = Field(..., ge=1)
    seq_len: Count = Field(..., ge=1)
    global_batch: Count = Field(..., ge=1)
    parallel: dict[str, Any] = Field(default_factory=dict, description="Plan axes (tp, pp, cp, ep, vpp, mbs, zero, sp, recompute, precision, framework).")
    step_time_s: Real = Field(..., gt=0, description="Measured step time in seconds.")
    source: str = Field("", description="Where and how it was measured.")


class RunsFile(BaseModel):
    model_config = _FROZEN

    runs: list[UserRun] = Field(..., min_length=1)
