"""Load a cost-model file (cost_models/*.json) into the flat parameters the cost terms read."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from autopar.data import data_dir
from autopar.errors import InputFileError, SchemaError
from autopar.io import read_json_object
from autopar.limits import check_name, clip, clip_repr
from autopar.schema import one_line
from autopar.schema.cost_model import CostModelFile
from autopar.schema.plain import build
from autopar.units import GiB, US


@dataclass(frozen=True, slots=True)
class CostParams:
    """Base-unit view of a CostModelFile, read in the hot path."""

    name: str
    gemm_max: float
    gemm_half_dim: float
    attention_max: float
    attention_half_seq: float
    unfused_attention_max: float
    attention_backward_ratio: float
    hbm_efficiency: float
    kernel_overhead_s: float
    layer_launch_floor_s: float
    fp8_speedup: float
    intra_node_efficiency: float
    inter_node_efficiency: float
    half_message_bytes: float
    collective_overhead_s: float
    tp_overlap: float
    cp_overlap: float
    cuda_context_bytes: float
    fragmentation: float
    comm_buffer_bytes: float
    gemm_table: tuple[tuple[int, int, int, float], ...] = ()
    gemm_shape: tuple[float, float, float] | None = None  # (scale, half_mn, half_k), CostModelFile.gemm_shape
    gemm_shape_fp8: tuple[float, float, float] | None = None  # the same for fp8 GEMMs
    attention_rates: tuple[tuple[str, float, float], ...] = ()  # (kernel family, fwd, bwd) fractions of peak
    framework_overrides: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    framework: str = "megatron"
    fp4_speedup: float = 0.0  # achieved fp4 over bf16 GEMM speed-up; 0 = derived (autopar.cost.compute.gemm_peak_flops)

    def kernel_rate(self, kernel: str) -> tuple[float, float] | None:
        """(forward, backward) fraction of the bf16 peak of a kernel family the file's table names
        (attention_kernels), None where it has no entry."""
        return next(((f, b) for k, f, b in self.attention_rates if k == kernel), None)

    def attention_rate(self, kernel: str) -> tuple[float, float]:
        """(forward, backward) fraction of the bf16 peak of a flash kernel family; a profiled entry
        overrides every family; without a table, attention_max for both passes."""
        table = {k: (f, b) for k, f, b in self.attention_rates}
        return table.get("profiled") or table.get(kernel) or (self.attention_max, self.attention_max)


# CostParams field -> cost-model file (section, field, scale to base units) for framework overrides.
_OVERRIDE_FIELDS = {
    "gemm_max": ("compute", "gemm_max", 1.0), "hbm_efficiency": ("compute", "hbm_efficiency", 1.0),
    "kernel_overhead_us": ("compute", "kernel_overhead_s", US), "fp8_speedup": ("compute", "fp8_speedup", 1.0),
    "fp4_speedup": ("compute", "fp4_speedup", 1.0),
    "layer_launch_floor_us": ("compute", "layer_launch_floor_s", US),
    "intra_node": ("network", "intra_node_efficiency", 1.0), "inter_node": ("network", "inter_node_efficiency", 1.0),
    "collective_overhead_us": ("network", "collective_overhead_s", US),
    "tp_overlap": ("network", "tp_overlap", 1.0), "cp_overlap": ("network", "cp_overlap", 1.0),
}


@lru_cache(maxsize=256)
def for_framework(p: CostParams, framework: str) -> CostParams:
    """`p` with the framework's own fitted efficiencies (Megatron's are the file's own)."""
    if p.framework == framework:
        return p
    updates: dict[str, float] = {}
    for name, values in p.framework_overrides:
        if name == framework:
            for field_name, value in values:
                _, attr, scale = _OVERRIDE_FIELDS[field_name]
                updates[attr] = value * scale
    return replace(p, framework=framework, **updates)


def _shape(f: CostModelFile, dtype: str) -> tuple[float, float, float] | None:
    g = getattr(f.gemm_shape, dtype) if f.gemm_shape is not None else None
    return (g.scale, g.half_mn, g.half_k) if g is not None else None


def params_from_file(f: CostModelFile) -> CostParams:
    c, n, m = f.compute, f.network, f.memory
    return CostParams(
        name=f.name, gemm_max=c.gemm_max, gemm_half_dim=c.gemm_half_dim, attention_max=c.attention_max,
        attention_half_seq=c.attention_half_seq, unfused_attention_max=c.unfused_attention_max, attention_backward_ratio=c.attention_backward_ratio,
        hbm_efficiency=c.hbm_efficiency, kernel_overhead_s=c.kernel_overhead_us * US,
        layer_launch_floor_s=c.layer_launch_floor_us * US, fp8_speedup=c.fp8_speedup,
        fp4_speedup=c.fp4_speedup or 0.0,
        intra_node_efficiency=n.intra_node, inter_node_efficiency=n.inter_node,
        half_message_bytes=n.half_message_bytes, collective_overhead_s=n.collective_overhead_us * US, tp_overlap=n.tp_overlap, cp_overlap=n.cp_overlap,
        cuda_context_bytes=m.cuda_context_gib * GiB, fragmentation=m.fragmentation,
        comm_buffer_bytes=m.comm_buffer_gib * GiB,
        gemm_table=tuple((p.m, p.n, p.k, p.efficiency) for p in f.gemm_table),
        gemm_shape=_shape(f, "bf16"), gemm_shape_fp8=_shape(f, "fp8"),
        attention_rates=tuple((k, r.fwd, r.bwd) for k, r in sorted(f.attention_kernels.items())),
        framework_overrides=tuple(
            (name, tuple(sorted({**fe.compute, **fe.network}.items()))) for name, fe in sorted(f.frameworks.items())),
    )


def list_cost_models() -> list[str]:
    return sorted(p.stem for p in data_dir("cost_models").glob("*.json"))


def read_cost_model_file(path: Path) -> CostModelFile:
    """Read and validate a cost-model file (a shipped one without building Pydantic's validator
    where its data allows, autopar.schema.plain: the same object)."""
    raw = read_json_object(path, "cost model file", "check the path")
    try:
        if path.parent == data_dir("cost_models"):
            return build(CostModelFile, raw)
        return CostModelFile(**raw)
    except ValidationError as exc:
        raise SchemaError(one_line(exc, f"cost model {clip(path)}"))


@lru_cache(maxsize=32)
def load_cost_model(name_or_path: str) -> tuple[CostModelFile, CostParams]:
    """A shipped cost model by name (e.g. "h100") or a path to a cost-model JSON file."""
    check_name(name_or_path, "cost model")
    path = Path(name_or_path).expanduser()
    if not path.suffix and "/" not in name_or_path:  # a name; anything with a folder is a path
        path = data_dir("cost_models") / f"{name_or_path}.json"
        if not path.is_file():
            raise InputFileError(f"unknown cost model {clip_repr(name_or_path)}; shipped: {', '.join(list_cost_models())}, "
                                 "or pass a path to a JSON file made by `autopar profile` or `autopar calibrate`")
    f = read_cost_model_file(path)
    return f, params_from_file(f)


def _may_cover(name: str, gpu_name: str) -> bool:
    """Whether shipped cost model `name` may cover `gpu_name`: its `gpus` list names it, or the file
    does not read as JSON with such a list (then loading it reports the problem). Reading a file's
    JSON costs a fraction of validating it, so only the one that covers the GPU is validated."""
    try:
        gpus = json.loads((data_dir("cost_models") / f"{name}.json").read_text(encoding="utf-8")).get("gpus")
    except (OSError, ValueError, AttributeError, RecursionError):
        return True
    return not isinstance(gpus, list) or gpu_name in gpus


def cost_model_for_gpu(gpu_name: str) -> tuple[CostModelFile, CostParams]:
    """The shipped cost model whose `gpus` list names this GPU."""
    for name in list_cost_models():
        if not _may_cover(name, gpu_name):
            continue
        f, p = load_cost_model(name)
        if gpu_name in f.gpus:
            return f, p
    raise InputFileError(f"no shipped cost model covers GPU {gpu_name!r}; pass --cost-model PATH "
                         "(made by `autopar profile` or `autopar calibrate`)")
