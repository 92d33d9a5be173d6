"""Predict measured runs with the cost model and summarize the error (`autopar validate`).

A run's unstated settings (micro batch, recompute, sequence parallelism, virtual stages, TP
communication overlap) are free variables: the prediction is the fastest plan that fits among
the plausible settings, as a tuned production run would be (calibration README). Everything the
source states is fixed. Architecture fields a source omits are filled from the model family
(Llama 2: vocab 32000; Llama 3: 128256; Nemotron: 256000 with a 2-matrix squared-ReLU FFN;
NeMo GPT-3: 50257) and listed as assumptions. An MoE source that states its total parameters
but not its shared experts gets the shared-expert count whose total is nearest (_build_graph).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import median

from autopar.cost.params import CostParams
from autopar.cost.step import estimate
from autopar.frameworks import framework_spec
from autopar.hardware import Cluster, load_cluster
from autopar.model import ModelGraph, build_graph
from autopar.schema.model import MLASpec, ModelSpec, MoESpec
from autopar.schema.plan import ParallelPlan, Recompute, plan_violations
from autopar.units import GiB
from autopar.validate.dataset import MeasuredRun

_FAMILY_VOCAB = (("llama2", 32000), ("llama3", 128256), ("nemotron", 256000), ("gpt3", 50257))


@dataclass(frozen=True, slots=True)
class Prediction:
    run: MeasuredRun
    predicted_tokens_per_s_per_gpu: float
    plan: ParallelPlan
    fits: bool
    peak_memory_bytes: float = 0.0

    @property
    def memory_error(self) -> float | None:
        """Signed relative error of the predicted peak memory, where the run measured it."""
        if self.run.measured_memory_gib is None:
            return None
        return self.peak_memory_bytes / (self.run.measured_memory_gib * GiB) - 1.0

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted − measured) / measured."""
        return self.predicted_tokens_per_s_per_gpu / self.run.measured_tokens_per_s_per_gpu - 1.0


def _vocab(run: MeasuredRun) -> int:
    if run.arch.get("vocab_size"):
        return run.arch["vocab_size"]
    key = run.run_id.replace("_", "").lower()
    return next((v for fam, v in _FAMILY_VOCAB if fam in key), 51200)


_GRAPHS: dict[str, ModelGraph] = {}


def _graph_for(run: MeasuredRun) -> ModelGraph:
    key = "model:" + run.arch["model"] if "model" in run.arch else run.run_id  # user runs share ids across files
    if key not in _GRAPHS:
        _GRAPHS[key] = _build_graph(run)
    return _GRAPHS[key]


def _build_graph(run: MeasuredRun) -> ModelGraph:
    a = run.arch
    if "model" in a:  # a user's run names its model directly
        from autopar.model import load_model

        return load_model(a["model"])
    moe = a.get("moe")
    if moe and moe.get("shared_experts") is None and a.get("params_b"):
        return min((build_graph(_spec_for(run, shared)) for shared in _SHARED_EXPERT_OPTIONS),
                   key=lambda g: abs(g.total_params - a["params_b"] * 1e9))
    return build_graph(_spec_for(run, (moe or {}).get("shared_experts") or 0))


# A source that states an MoE model's total parameters but not its shared experts: the count (of
# the routed experts' width) whose total is nearest the stated one. MegaScale-MoE's Internal-352B:
# 0 -> 341.3B, 1 -> 351.9B of the stated 352B (Table 2); tests/test_fidelity.py checks it
# against the same paper's MFU statement.
_SHARED_EXPERT_OPTIONS = (0, 1, 2)


def _spec_for(run: MeasuredRun, shared_experts: int) -> ModelSpec:
    a = run.arch
    heads = a["num_attention_heads"]
    moe = a.get("moe")
    moe_spec = None
    if moe:
        moe_spec = MoESpec(num_experts=moe["num_experts"], top_k=moe["top_k"],
                           expert_ffn_hidden_size=moe["moe_ffn_hidden"],
                           num_shared_experts=shared_experts,
                           shared_expert_ffn_hidden_size=moe["moe_ffn_hidden"] if shared_experts else 0,
                           first_k_dense=moe.get("dense_layers") or 0, layer_freq=_moe_layer_freq(run))
    mla = MLASpec(**a["mla"]) if a.get("mla") else None
    return ModelSpec(
        name=run.run_id, source=run.source_detail, num_layers=a["num_layers"], hidden_size=a["hidden_size"],
        num_attention_heads=heads, num_kv_heads=a.get("num_kv_heads") or heads,
        ffn_hidden_size=a.get("ffn_hidden_size") or (moe["moe_ffn_hidden"] if moe else 4 * a["hidden_size"]),
        vocab_size=_vocab(run), moe=moe_spec, mla=mla,
        seq_length=run.seq_len, activation=a.get("activation") or "gelu",
        normalization=a.get("normalization") or "layernorm", position_embedding=a.get("position_embedding") or "rope",
        tie_embeddings=bool(a.get("tie_embeddings")), dropout=_megatron_gpt(run),
        qkv_bias=_megatron_gpt(run), attn_out_bias=_megatron_gpt(run), mlp_bias=_megatron_gpt(run),
    )


def _megatron_gpt(run: MeasuredRun) -> bool:
    """The run trained Megatron-LM's GPT of 2021-22 (SC'21 and Korthikanti's scripts, the SC'21 ZeRO-3
    comparison's "ZeRO-3 via DeepSpeed integrated into the Megatron codebase", Megatron-DeepSpeed's
    copy in vTrain): attention and hidden dropout 0.1 (megatron/arguments.py defaults), hence the
    fused scale-mask-softmax attention rather than a flash kernel, and a bias on every linear
    (ColumnParallelLinear / RowParallelLinear bias=True, megatron/model/transformer.py)."""
    return run.source in ("narayanan21", "korthikanti22", "narayanan21-zero3") or run.source.startswith("vtrain")


def _moe_layer_freq(run: MeasuredRun) -> int:
    """Every k-th layer is MoE: 2 for Llama 4 Maverick, whose layers alternate dense and MoE
    (config.json interleave_moe_layer_step 2; the dgxc row's arch_notes), else 1."""
    return 2 if "maverick" in run.run_id else 1


@lru_cache(maxsize=64)
def _cluster_for(name: str, gpus: int) -> Cluster:
    return load_cluster(name, gpus)


def candidate_plans(run: MeasuredRun, graph: ModelGraph) -> list[ParallelPlan]:
    """Every plausible plan for the run: stated settings fixed, unstated ones enumerated."""
    if run.plan is not None:  # a user's run states its whole plan (autopar.validate.user_runs)
        return [run.plan]
    dp = run.num_gpus // (run.tp * run.pp * run.cp)
    per_dp = run.global_batch // dp
    mbs_options = [run.micro_batch] if run.micro_batch else [m for m in (1, 2, 4, 8) if per_dp % m == 0]
    recompute_options = [run.recompute] if run.recompute else ["none", "selective", "full"]
    sp_options = [run.sequence_parallel] if run.sequence_parallel is not None else [run.tp > 1]
    if run.vpp:
        vpp_options = [run.vpp]
    else:
        # Every interleaving degree that splits the layers evenly (Megatron's --num-layers-per-virtual-
        # pipeline-stage takes any divisor of the layers per pipeline rank), not a hand-picked few.
        vpp_options = [1] + [v for v in range(2, graph.spec.num_layers // run.pp + 1)
                             if run.pp > 1 and graph.spec.num_layers % (run.pp * v) == 0]
    overlap_options = [False, True] if run.tp > 1 and run.source.startswith(("nemo", "megatron", "dgxc")) else [False]
    if run.tp_comm_overlap is not None:  # the recipe fixes it
        overlap_options = [run.tp_comm_overlap and run.tp > 1]
    zero = run.zero_stage if run.zero_stage is not None else framework_spec(run.framework).default_zero
    ep_options = _ep_options(run, graph, dp)
    cp_comm = framework_spec(run.framework).default_cp_comm_type  # torchtitan all-gathers K/V
    plans = []
    for mbs, rec, sp, vpp, overlap, ep in itertools.product(mbs_options, recompute_options, sp_options, vpp_options,
                                                            overlap_options, ep_options):
        if overlap and not sp:
            continue
        plan = ParallelPlan(tp=run.tp, pp=run.pp, cp=run.cp, ep=ep, etp=_etp(run), vpp=vpp, mbs=mbs,
                            global_batch=run.global_batch, seq_len=run.seq_len, zero=zero,
                            sp=sp if run.tp > 1 else None, recompute=_recompute(rec, run),
                            precision="fp8" if run.precision == "fp8" else "bf16",
                            tp_comm_overlap=overlap, overlap_grad_reduce=not _local_ddp(run),
                            overlap_param_gather=not _local_ddp(run), framework=run.framework,
                            framework_release=run.framework_release, grad_reduce_in_bf16=run.grad_reduce_in_bf16,
                            cp_comm_type=cp_comm, torch_compile=run.compiled,
                            moe_capacity_factor=run.moe_capacity_factor,
                            moe_pad_to_capacity=run.moe_capacity_factor is not None,
                            attention_backend=run.attention_backend,
                            moe_shared_expert_overlap=run.moe_shared_expert_overlap,
                            cross_entropy_fusion=run.cross_entropy_fusion)
        if not _violations(plan, run, graph):
            plans.append(plan)
    return plans


def _recompute(mode: str, run: MeasuredRun) -> Recompute:
    """The recompute of a candidate: selective with the modules the run's recipe names, where it does."""
    if mode == "selective" and run.recompute_modules:
        return Recompute(mode=mode, modules=run.recompute_modules)
    return Recompute(mode=mode)


def _ep_options(run: MeasuredRun, graph: ModelGraph, dp: int) -> list[int]:
    """The stated EP degree, or for an MoE run that does not state it every degree that divides
    the experts and the data-parallel size (Megatron: ep·etp·edp·pp = GPUs with etp = tp)."""
    experts = graph.spec.moe.num_experts if graph.spec.moe else 0
    if run.ep > 1 or not experts:
        return [run.ep]
    options = [e for e in range(1, experts + 1) if experts % e == 0 and dp % e == 0]
    if run.source == "megascale-moe" and len(options) > 1:
        # Sec. 6.1: "a TP size of 8 forces EP to operate across nodes": EP is in use (ep > 1).
        options = options[1:]
    return options


def _etp(run: MeasuredRun) -> int | None:
    """The expert TP degree the run states (dgxc's 2025 tables print ETP), else Megatron's default
    (None = tp: Megatron-core before 0.10 had no separate expert TP)."""
    if not run.arch.get("moe"):
        return None
    return run.etp if run.etp > 1 or run.source == "dgxc-nemo25" else None


def _local_ddp(run: MeasuredRun) -> bool:
    """Megatron-LM of 2021-22 (SC'21, Korthikanti'22) and vTrain's Megatron-DeepSpeed reduce
    gradients after backward ("local" DDP); overlap came with Megatron-Core's DDP in 2023."""
    return run.source in ("narayanan21", "korthikanti22") or run.source.startswith("vtrain")


def _violations(plan: ParallelPlan, run: MeasuredRun, graph: ModelGraph) -> list[str]:
    s = graph.spec
    return plan_violations(plan, num_gpus=run.num_gpus, num_layers=s.num_layers, num_heads=s.num_attention_heads,
                           num_kv_heads=s.kv_heads, num_experts=s.moe.num_experts if s.moe else 0, **s.mixer_counts())


# A measured run did run: its memory is judged against the whole HBM. The planning margin
# (autopar.cost.step.DEFAULT_MEMORY_MARGIN) reserves room for what no model sees in a plan not yet run.
MEASURED_RUN_MARGIN = 0.0


def predict(run: MeasuredRun, p: CostParams) -> Prediction | None:
    """The fastest fitting candidate's tokens/s/GPU (or the fastest overall if none fits). A run of a
    recipe table (MeasuredRun.series_tightest) prefers free settings that fit on the table's smallest
    run too: one recipe ran at every GPU count of the table."""
    graph = _graph_for(run)
    cluster = _cluster_for(run.cluster, run.num_gpus)
    tight = _cluster_for(run.cluster, run.series_tightest[0]) if run.series_tightest else None
    best = None
    for plan in candidate_plans(run, graph):
        e = estimate(graph, cluster, plan, p, MEASURED_RUN_MARGIN)
        # Prefer settings that also fit on the table's smallest run; where none does, the run's own fit decides.
        table_fits = e.fits and (tight is None or _fits_at(graph, tight, plan, run.series_tightest[1], p))
        key = (table_fits, e.fits, e.tokens_per_s_per_gpu)
        if best is None or key > best[0]:
            best = (key, plan, e.peak_memory_bytes)
    if best is None:
        return None
    (_, fits, tps), plan, peak = best
    return Prediction(run=run, predicted_tokens_per_s_per_gpu=tps, plan=plan, fits=fits, peak_memory_bytes=peak)


def _fits_at(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan, global_batch: int, p: CostParams) -> bool:
    """Whether `plan`'s settings fit on the smallest run of its recipe table (MeasuredRun.series_tightest):
    same layout, that run's GPUs and global batch."""
    return estimate(graph, cluster, plan.changed(global_batch=global_batch), p, MEASURED_RUN_MARGIN).fits


def summarize(preds: list[Prediction]) -> dict[str, float]:
    """MAPE, median, P90 and worst absolute percentage error, and the count."""
    errs = sorted(abs(x.error) for x in preds)
    if not errs:
        return {"count": 0, "mape": math.nan, "median": math.nan, "p90": math.nan, "worst": math.nan}
    p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    return {"count": len(errs), "mape": sum(errs) / len(errs), "median": median(errs), "p90": p90,
            "worst": errs[-1], "fits": sum(x.fits for x in preds)}
