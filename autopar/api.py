"""The library surface a notebook calls; the CLI is a thin shell over these functions.

Every function takes names or paths (a preset or config file, a cluster profile) and returns
plain dicts or dataclasses; errors are autopar.errors.AutoparError subclasses with one-line
messages.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import ValidationError

from autopar.cost.memory import model_state_bytes
from autopar.cost.params import CostParams, cost_model_for_gpu, load_cost_model
from autopar.cost.step import Estimate, estimate
from autopar.errors import InvalidPlanError
from autopar.hardware import Cluster, list_clusters, load_cluster, load_profile
from autopar.model import PRESET_NAMES, ModelGraph, load_model  # noqa: F401 (load_model re-exported)
from autopar.schema import one_line
from autopar.schema.plan import ParallelPlan, check_plan


def models() -> list[dict[str, Any]]:
    """Every preset with its size."""
    out = []
    for name in PRESET_NAMES:
        g = load_model(name)
        out.append({"name": name, "total_params": g.total_params, "active_params": g.active_params,
                    "layers": g.spec.num_layers, "hidden_size": g.spec.hidden_size,
                    "moe": g.spec.moe is not None, "source": g.spec.source})
    return out


def clusters() -> list[dict[str, Any]]:
    """Every shipped cluster profile with its headline numbers."""
    out = []
    for name in list_clusters():
        prof = load_profile(name)
        out.append({"name": name, "gpu": prof.gpu.name, "gpus_per_node": prof.node.gpus_per_node,
                    "bf16_tflops": prof.gpu.peak_tflops.bf16, "hbm_gib": prof.gpu.hbm_gib,
                    "nvlink_gb_per_s": prof.node.intra_node_gb_per_s,
                    "network": f"{prof.network.nics_per_node}x{prof.network.nic_gbit_per_s:g} Gb/s",
                    "description": prof.description})
    return out


def inspect(model: str, seq_len: int | None = None, dp: int = 1, framework: str = "megatron") -> dict[str, Any]:
    """Parameters, FLOPs per token, model-state bytes per GPU by ZeRO stage, activation bytes per token."""
    g = load_model(model)
    s = seq_len or g.spec.seq_length
    per_layer = []
    seen = set()
    for layer in g.layers:
        key = layer.kind if layer.kind in ("dense", "moe") else layer.name
        if key in seen:
            continue
        seen.add(key)
        acts = layer.activation_bytes_per_token(s)
        per_layer.append({"kind": layer.kind, "name": key, "count": sum(1 for x in g.layers if
                                                                        (x.kind if x.kind in ("dense", "moe") else x.name) == key),
                          "params": layer.params, "active_params": layer.active_params,
                          "forward_flops_per_token": {"matmul": layer.matmul_flops_per_token,
                                                      "attention": layer.attention_flops_per_token(s),
                                                      "elementwise": layer.elementwise_flops_per_token},
                          "activation_bytes_per_token": sum(acts.values()),
                          "activation_bytes_per_token_by_tensor": acts})
    zero = {}
    for stage in (0, 1, 2, 3):
        fw = "deepspeed" if framework == "megatron" and stage > 1 else framework
        zero[str(stage)] = sum(model_state_bytes(g.total_params, fw, stage, dp).values())
    return {
        "model": g.spec.name, "source": g.spec.source, "seq_len": s,
        "total_params": g.total_params, "active_params": g.active_params,
        "params_by_kind": g.params_by_kind(),
        "flops_per_token": g.model_flops_per_token(s, causal=True),
        "flops_per_token_6n": 6.0 * g.active_params,
        "attention_flops_per_token": 3.0 * sum(x.attention_flops_per_token(s) for x in g.layers),
        "flops_convention": "training FLOPs per token = 3 × forward (matmuls + causal attention); 6·N counts all active weights",
        "model_state_bytes_per_gpu_by_zero": zero, "dp": dp, "framework": framework,
        "layers": per_layer,
    }


def make_plan(**fields: Any) -> ParallelPlan:
    """A ParallelPlan from keyword fields, with one-line errors."""
    try:
        return ParallelPlan(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise InvalidPlanError(one_line(exc, "invalid plan"))


def resolve_cost_model(cluster: Cluster, cost_model: str | None) -> CostParams:
    if cost_model:
        return load_cost_model(cost_model)[1]
    return cost_model_for_gpu(cluster.gpu_name)[1]


def validate_plan_for(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan) -> None:
    """Raise InvalidPlanError naming every broken invariant."""
    check_plan(plan, num_gpus=cluster.num_gpus, num_layers=graph.spec.num_layers,
               num_heads=graph.spec.num_attention_heads, num_kv_heads=graph.spec.kv_heads,
               num_experts=graph.spec.moe.num_experts if graph.spec.moe else 0,
               gpus_per_node=cluster.gpus_per_node)


def estimate_plan(model: str, cluster: str, gpus: int, plan: ParallelPlan, cost_model: str | None = None,
                  memory_margin: float = 0.0) -> Estimate:
    """Validate and score one plan."""
    g = load_model(model)
    c = load_cluster(cluster, gpus)
    validate_plan_for(g, c, plan)
    return estimate(g, c, plan, resolve_cost_model(c, cost_model), memory_margin)


def estimate_to_dict(e: Estimate) -> dict[str, Any]:
    """The stable JSON shape of an estimate (documented in README)."""
    return {
        "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
        "model_tflops_per_gpu": e.model_tflops_per_gpu, "hardware_tflops_per_gpu": e.hardware_tflops_per_gpu,
        "mfu": e.mfu, "peak_memory_bytes": e.peak_memory_bytes, "memory_capacity_bytes": e.memory_capacity_bytes,
        "fits": e.fits, "num_microbatches": e.num_microbatches, "dp": e.dp,
        "bubble_fraction": e.bubble_fraction, "exposed_comm_fraction": e.exposed_comm_fraction,
        "time_breakdown_s": dict(e.time_breakdown_s), "memory_breakdown_bytes": dict(e.memory_breakdown_bytes),
        "stages": [asdict(s) for s in e.stages], "notes": list(e.notes),
    }


def plan_to_dict(plan: ParallelPlan, num_gpus: int) -> dict[str, Any]:
    """The plan's axes under the names the CLI uses (dp derived)."""
    d = plan.model_dump(mode="json")
    d["dp"] = plan.dp_for(num_gpus)
    d["etp"] = plan.expert_tp
    d["sp"] = plan.sequence_parallel
    d["schedule"] = plan.schedule
    return d
