"""A user's measured runs, for `autopar validate --runs runs.yaml` and `autopar calibrate runs.yaml`.

    runs:
      - model: llama3-8b            # preset, config.json or YAML layer graph
        cluster: dgx-h100           # profile name or YAML
        gpus: 8
        seq_len: 8192
        global_batch: 128
        parallel: {tp: 1, pp: 1, cp: 2, mbs: 1, recompute: none, zero: 1}
        step_time_s: 9.49           # measured, averaged over steady-state iterations
        peak_memory_gib: 71.2       # optional: measured peak (torch.cuda.max_memory_reserved)
        source: our cluster, Megatron-Core 0.12, 2026-11-20
        name: llama3-8b-cp2         # optional label; default user_000, user_001, ...

`parallel` holds plan fields as a plan JSON's `parallel` does (tp, pp, cp, ep, etp, vpp, mbs, zero,
sp, recompute, precision, framework, tp_comm_overlap, torch_compile, ...; recompute may be just the
mode); each one left out takes `autopar estimate`'s default. Give the measured speed as
`step_time_s` or as `tokens_per_s_per_gpu`, one of the two.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.schema.types import Count, Real

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class UserRun(BaseModel):
    model_config = _FROZEN

    model: str = Field(..., description="Preset name or model file.")
    cluster: str = Field(..., description="Cluster profile name or YAML.")
    gpus: Count = Field(..., ge=1)
    seq_len: Count = Field(..., ge=1)
    global_batch: Count = Field(..., ge=1)
    parallel: dict[str, Any] = Field(default_factory=dict, description="Plan fields (tp, pp, cp, ep, vpp, mbs, zero, sp, recompute, precision, framework, ...); the rest take estimate's defaults.")
    step_time_s: Real | None = Field(None, ge=1e-6, le=1e7, description="Measured step time in seconds (1 µs to 10^7 s).")
    tokens_per_s_per_gpu: Real | None = Field(None, ge=1e-6, le=1e12, description="Measured throughput, instead of step_time_s.")
    peak_memory_gib: Real | None = Field(None, ge=1e-6, le=1e6, description="Measured peak memory per GPU (max reserved), GiB.")
    source: str = Field("", description="Where and how it was measured (runs are grouped by it).")
    name: str | None = Field(None, min_length=1, description="Label of the run in reports.")

    @model_validator(mode="after")
    def _one_speed(self) -> "UserRun":
        if (self.step_time_s is None) == (self.tokens_per_s_per_gpu is None):
            raise ValueError("give the measured speed as step_time_s or tokens_per_s_per_gpu, exactly one of them")
        return self


class RunsFile(BaseModel):
    model_config = _FROZEN

    runs: list[UserRun] = Field(..., min_length=1)
