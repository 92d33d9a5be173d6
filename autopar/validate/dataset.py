"""Measured LLM training runs that `autopar validate` compares the cost model with.

Files (cost_models/measured/, see its README.md for provenance):

- ``published_runs.yaml``: 46 runs read from papers and vendor docs, each with its source,
  ``metric_definition``, ``verified_from``, ``derived_fields`` and ``confidence``.
- ``published_runs_2.yaml``: 21 runs in the regimes the first set lacks, same schema: the ZeRO-3
  baselines of Narayanan et al. SC'21 Table 2 (DeepSpeed in Megatron, A100), torchtitan's Dec 2024
  benchmark (FSDP2, CP to 256K, float8, with measured peak memory, on the 500 W H100 96 GB of
  Meta's Grand Teton) and the Megatron-LM baseline of MegaScale-MoE Table 3 (352B MoE, H800).
- ``vtrain_ground_truth_single.csv`` (1,440 runs, 2-8 GPUs) and
  ``vtrain_ground_truth_multi.csv`` (109 runs, 64-512 GPUs): iteration times measured by the
  vTrain project (Bang et al., MICRO'24, arXiv:2312.12391; MIT licence, VTRAIN_LICENSE).

Every run becomes one :class:`MeasuredRun` whose target is ``measured_tokens_per_s_per_gpu``.

Conversion to tokens/s/GPU (never a generic formula; always the row's own metric definition)
- narayanan21: TFLOP/s/GPU counts F = 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration (SC'21
  Eq. 3, includes the recompute forward). step = F / (TFLOP/s·N); tokens/s/GPU = B·s/step/N.
- korthikanti22: the Table 5 iteration time where given; the one row with only an MFU uses the
  paper's model FLOPs 72·B·L·s·h²·(1 + s/6h + V/12hL) (Eq. 7) and the 312 TF/s peak it states.
- megatron-readme: TFLOP/s/GPU counts Megatron-LM's num_floating_point_operations
  12·B·s·L·h²·[(1 + g/a + s/h) + (ffn/h)·gate + V/2Lh] (the row's metric_definition). The table
  omits ffn and kv heads; MHA with a 4h non-gated FFN is taken because 12·L·h² + 2·V·h
  reproduces every published parameter count (and a SwiGLU 8h/3 FFN has the same FLOPs).
- nemo-24.07, megatron-llama3-fp8, torchtitan-2412: the FLOP formula is not stated (torchtitan
  reports no MFU), so only the printed tokens/s/GPU is used.
- narayanan21-zero3: Table 2 prints TFLOP/s/GPU by the same Eq. 3 as Table 1.
- megascale-moe: Table 3's iteration time as printed; tokens/s/GPU = B·s/step/N.
- vtrain-*: tokens/s/GPU = global_batch·seq_len / iteration time / GPUs.
``measured_step_time_s`` is always filled: measured where the source gives it, otherwise the
step time the conversion implies (B·s / (tokens/s/GPU · N)); ``conversion`` says which.

Rows that cannot be converted are skipped with a reason (``load_skipped()``): the Megatron-LM
README strong-scaling points give neither a parallel layout nor a TFLOP/s figure.

Fit/holdout split (deterministic; whole groups, never single rows of one configuration)
- published: group = (cluster, num_layers, hidden_size, ffn_hidden_size). Groups are numbered
  0, 1, 2, ... in order of first appearance in published_runs.yaml (across sources, so the same
  model on the same cluster in two sources lands on one side); group g is held out iff
  g % 3 == 1. Rows appended to the file never move earlier rows.
- vTrain, each file on its own: group = model shape (hidden_size, num_layers); shapes are
  sorted ascending and shape i is held out iff i % k == 1 with k = 3, or k = 2 when a file has
  fewer than six shapes. single: 8 shapes, holds out 1024x16, 2048x12, 2048x24 (540 of 1,440
  rows); multi: 4 shapes, every third would hold out one shape (14% of rows), so every second
  is held out: 18.4B and 175B (36 of 109 rows), so the largest model is unseen in fitting.

Architecture fields (``MeasuredRun.arch``) hold what the row says; a field the row leaves
empty is filled from the model family's convention only where the family fixes it, and its
name is listed in ``arch["inferred"]``; otherwise it stays None (the source does not say).
``arch["preset"]`` names the autopar preset with the same family and layer shape (layers,
hidden, heads, kv heads, ffn); the vocabulary may differ, so use ``arch`` for numbers.

vTrain hardware and precision: vTrain's GPT runs use Megatron-DeepSpeed on A100 GPUs, 8 per
node, 800 Gb/s inter-node per node (vTrain's validation configs: inter_node_bandwidth=800,
node_size=8). A summary of the paper's validation setup gives A100-SXM 80GB; vTrain's own
profiler builds its model in fp16 (torch.set_default_dtype(torch.float16), 2-byte gradients),
so the rows are recorded as fp16 on the ``vtrain-a100`` profile. The paper's own text could not
be read here; treat precision and memory size as medium confidence.
"""

from __future__ import annotations

import csv
import functools
import logging
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from autopar.data import data_dir
from autopar.errors import InputFileError, SchemaError
from autopar.units import MS, TFLOPS

logger = logging.getLogger(__name__)

PUBLISHED_FILE = "published_runs.yaml"
PUBLISHED_FILE_2 = "published_runs_2.yaml"
PUBLISHED_FILE_3 = "published_runs_3.yaml"
VTRAIN_SINGLE_FILE = "vtrain_ground_truth_single.csv"
VTRAIN_MULTI_FILE = "vtrain_ground_truth_multi.csv"

SOURCES: tuple[str, ...] = (
    "narayanan21", "korthikanti22", "megatron-readme", "nemo-24.07", "megatron-llama3-fp8",
    "vtrain-single", "vtrain-multi", "narayanan21-zero3", "torchtitan-2412", "megascale-moe",
    "dgxc-nemo24", "dgxc-nemo25",
)
KNOWN_CLUSTERS: tuple[str, ...] = (
    "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h800", "dgx-h200", "dgx-b200", "vtrain-a100",
    "grandteton-h100-96gb", "gb200-nvl72",
)

# Published run id prefix -> short source name (a new source must be added here on purpose; the
# first matching prefix wins, so a longer prefix goes before its stem).
_ID_PREFIX_TO_SOURCE = {
    "narayanan21_t2_": "narayanan21-zero3",
    "torchtitan2412_": "torchtitan-2412",
    "megascale_moe25_": "megascale-moe",
    "narayanan21_": "narayanan21",
    "korthikanti22_": "korthikanti22",
    "megatronlm_readme_": "megatron-readme",
    "nemo2407_": "nemo-24.07",
    "megatronlm_llama_example_fp8_": "megatron-llama3-fp8",
    # NVIDIA/dgxc-benchmarking: the NeMo 24.09-24.12 tables (repo tags 25.01, 25.02.01, 24.11.1) and
    # the 2025 tables of NeMo 25.04 images (tags 25.05.04, 25.05.05): two software generations with
    # two timing methods (last step of 50 vs the mean of steps 11-44), so two sources.
    "dgxc_v2501_": "dgxc-nemo24",
    "dgxc_v250201_": "dgxc-nemo24",
    "dgxc_v24111_": "dgxc-nemo24",
    "dgxc_v250504_": "dgxc-nemo25",
    "dgxc_v250505_": "dgxc-nemo25",
}
# hardware.gpu text of a published row -> autopar hardware profile.
_GPU_TEXT_TO_CLUSTER = (
    ("A100-SXM 80GB", "dgx-a100-80gb"),
    ("H100 SXM 96GB HBM2e", "grandteton-h100-96gb"),
    ("H800", "hgx-h800"),
    ("H100", "dgx-h100"),
    ("GB200", "gb200-nvl72"),
)
# Source -> the framework its runs used. narayanan21-zero3: "ZeRO-3 via DeepSpeed integrated into
# Megatron codebase" (Megatron-DeepSpeed, as vTrain's runs); megascale-moe: the Megatron-LM baseline.
_SOURCE_TO_FRAMEWORK = {
    "narayanan21-zero3": "deepspeed", "torchtitan-2412": "torchtitan", "vtrain-single": "deepspeed",
    "vtrain-multi": "deepspeed",
}
# Source -> the older framework release its runs used, where autopar has a profile for it
# (autopar.frameworks.FRAMEWORK_RELEASES). narayanan21-zero3: arXiv 2104.04473 v1 (April 2021)
# came out weeks after ZeRO-3's first release (DeepSpeed v0.3.13, March 2021): DeepSpeed 0.3.
# torchtitan-2412: the benchmark file's own versions table (torchtitan 9dec370, torchao eab345c).
# vtrain-*: Megatron-DeepSpeed's GPT (module docstring), not a Hugging Face model.
_SOURCE_TO_RELEASE = {"narayanan21-zero3": "0.3", "torchtitan-2412": "2024-12", "vtrain-single": "megatron-deepspeed",
                      "vtrain-multi": "megatron-deepspeed", "narayanan21": "pre-core", "korthikanti22": "pre-core"}
# Runs whose recipe keeps and reduces gradients in bf16 (Megatron --grad-reduce-in-bf16). Nemotron-4
# 340B: NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_340b.yaml sets
# optim.name mcore_distributed_optim with grad_sync_dtype bf16, which NeMo turns into
# DistributedDataParallelConfig(grad_reduce_in_fp32=False) (megatron_base_model.setup_mcore_distributed_parallel).
_BF16_GRAD_RUNS = frozenset({"nemo2407_h100_fp8_nemotron_340b_128gpu"})
# Sources whose every run keeps gradients in bf16. dgxc-nemo25: the 2025 recipes launch NeMo 25.04's
# scripts/performance/llm/pretrain_<model>.py, which builds pretrain_recipe(performance_mode=True); each
# recipe's pretrain_performance_optimizations sets recipe.trainer.plugins.grad_reduce_in_fp32 = False (and the
# fp8 branch again after bf16_with_fp8_mixed()), so the DDP buffers hold bf16 gradients.
_BF16_GRAD_SOURCES = frozenset({"dgxc-nemo25"})
# dgxc-nemo24 recipe files whose optimizer section sets grad_sync_dtype: bf16 (NVIDIA/dgxc-benchmarking at the
# row's commit; NeMo reduces and keeps the gradient buffers in bf16 then). nemotron4-15b-synth.yaml @ 0b71cfd
# has no grad_sync_dtype (NeMo's fp32 default) and is not listed.
_BF16_GRAD_RECIPES = frozenset({
    "recipe nemo_megatron/gpt3_175b_hydra.yaml @ 35a9aec", "recipe grok1/grok1_314b.yaml @ 143b90d",
    "recipe llama3.1/llama3.1_405b.yaml @ 143b90d", "recipe llama3.1/llama3.1_70b.yaml @ 143b90d",
    "recipe llama3.1/llama3.1_8b.yaml @ 143b90d", "recipe nemotron/nemotron4-340b-synth.yaml @ 143b90d",
})
# NeMo 1.x runs with Apex's DistributedFusedAdam (framework release "nemo-apex", autopar.frameworks.megatron):
# every NeMo-Framework-Launcher training config of tag 24.07 (8325688d) names `optim: distributed_fused_adam`
# (nemo-24.07), as do the dgxc-benchmarking recipe files below at the row's commit; Grok-1's recipe names
# mcore_distributed_optim (Megatron's distributed optimizer), and nemotron4-15b-synth.yaml @ 0b71cfd too.
_APEX_ADAM_SOURCES = frozenset({"nemo-24.07"})
_APEX_ADAM_RECIPES = frozenset({
    "recipe nemo_megatron/gpt3_175b_hydra.yaml @ 35a9aec", "recipe llama3.1/llama3.1_405b.yaml @ 143b90d",
    "recipe llama3.1/llama3.1_70b.yaml @ 143b90d", "recipe llama3.1/llama3.1_8b.yaml @ 143b90d",
    "recipe nemotron/nemotron4-340b-synth.yaml @ 143b90d",
})


# dgxc-nemo25 runs whose NeMo 2.0 performance script leaves TP communication overlap off (NeMo @ 7a8f1cc,
# the 25.04 image's tree, as the recipes' setup.sh pins it): scripts/performance/llm/pretrain_nemotronh_56b.py
# calls pretrain_recipe() without performance_mode, and only performance mode adds the
# MegatronCommOverlapCallback(tp_comm_overlap=True) (recipes/nemotronh_56b.py); pretrain_deepseek_v3.py adds
# MegatronCommOverlapCallback(tp_comm_overlap=False). The other 25.x scripts call
# pretrain_recipe(performance_mode=True) and leave the choice to the recipe, so it stays open there.
_NO_TP_OVERLAP_MODELS = ("nemotronh_56b", "deepseek_v3")


def _nemo25_model(source: str, run_id: str, models: tuple[str, ...]) -> bool:
    """A dgxc-nemo25 run of one of `models` (the model names its run ids carry)."""
    return source == "dgxc-nemo25" and any(f"_{m}_" in run_id for m in models)


def _tp_comm_overlap(source: str, run_id: str) -> bool | None:
    """The TP communication overlap a run's recipe fixes, None where the source leaves it open."""
    if _nemo25_model(source, run_id, _NO_TP_OVERLAP_MODELS):
        return False
    return None


# Selective recompute modules a recipe's launch script passes (--recompute_modules) where its README table
# does not print them: dgxc-benchmarking deepseek_v3/pretraining/launch.sh @ 1f6d9f4 sets RM='mla_up_proj' for
# H100 and RM='core_attn' for GB200.
_RECIPE_RECOMPUTE_MODULES = {("deepseek_v3", "h100"): ("mla_up_proj",), ("deepseek_v3", "gb200"): ("core_attn",)}


def _recipe_recompute(source: str, run_id: str) -> tuple[str, ...] | None:
    """The selective recompute modules the run's launch script states, None where it states none."""
    if source != "dgxc-nemo25":
        return None
    return next((mods for (model, gpu), mods in _RECIPE_RECOMPUTE_MODULES.items()
                 if f"_{model}_" in run_id and f"_{gpu}_" in run_id), None)


# Runs whose recipe environment turns cuDNN fused attention off (NVTE_FUSED_ATTN=0), so Transformer Engine
# runs the flash-attn package (ParallelPlan.attention_backend "flash"): dgxc-benchmarking grok1/configure.sh and
# nemotron/configure.sh's 340b branch @ 143b90d, nemo_megatron/launch.sh @ 35a9aec (GPT-3 175B); NeMo @ 7a8f1cc
# scripts/performance/llm/pretrain_nemotronh_56b.py (custom_env_vars NVTE_FUSED_ATTN "0"); every nemo-24.07 run,
# launched by NeMo-Framework-Launcher at tag 24.07 (8325688d), whose launcher_scripts/conf/config.yaml env_vars set
# NVTE_FUSED_ATTN: 0 ("Disable cudnn FA until we've tested it more") for every training job. The other recipes
# set NVTE_FUSED_ATTN=1 (llama3.1, nemotron 15b) or leave it to NeMo's performance defaults, which enable both
# (scripts/performance/utils.py), where Transformer Engine prefers cuDNN on Hopper and Blackwell.
_FLASH_ATTENTION_RECIPES = frozenset({
    "recipe grok1/grok1_314b.yaml @ 143b90d", "recipe nemotron/nemotron4-340b-synth.yaml @ 143b90d",
    "recipe nemo_megatron/gpt3_175b_hydra.yaml @ 35a9aec",
})
_FLASH_ATTENTION_MODELS = ("nemotronh_56b",)  # dgxc-nemo25 run ids
_FLASH_ATTENTION_SOURCES = frozenset({"nemo-24.07"})
# Runs whose Transformer Engine has no fused kernel for their attention and falls back to its
# UnfusedDotProductAttention (ParallelPlan.attention_backend "unfused"): MLA (query/key head dim 192, value
# 128) on Blackwell before Transformer Engine 2.5. TE v2.1-v2.4 transformer_engine/common/fused_attn/
# fused_attn.cpp nvte_get_fused_attn_backend rejects sm100+ with head_dim_qk or head_dim_v above 128
# ("special conditions for blackwell"), and dot_product_attention/utils.py get_attention_backend disables
# FlashAttention when head_dim_qk != head_dim_v ("does not support MLA"); v2.5 (#1797, 2025-06-14) adds
# d_qk 192 / d_v 128 training on Blackwell with cuDNN 9.11. dgxc-nemo25's GB200 recipes run the NeMo
# 25.04.01 image (deepseek_v3/pretraining/launch.sh @ 1f6d9f4: FW_VERSION=25.04.01), of April 2025.
_UNFUSED_ATTENTION_SOURCES = frozenset({"dgxc-nemo25"})
_UNFUSED_ATTENTION_CLUSTERS = frozenset({"gb200-nvl72"})


def _attention_backend(source: str, recipe: str | None, run_id: str, cluster: str = "",
                       arch: dict[str, Any] | None = None) -> str:
    """The attention backend a run's recipe environment selects (ParallelPlan.attention_backend)."""
    if recipe in _FLASH_ATTENTION_RECIPES or source in _FLASH_ATTENTION_SOURCES:
        return "flash"
    if _nemo25_model(source, run_id, _FLASH_ATTENTION_MODELS):
        return "flash"
    if source in _UNFUSED_ATTENTION_SOURCES and cluster in _UNFUSED_ATTENTION_CLUSTERS and (arch or {}).get("mla"):
        return "unfused"
    return "auto"


# MoE runs whose recipe drops tokens beyond each expert's capacity and pads every expert's input to it,
# capacity factor 1.0 (autopar.cost.step.moe_load, layer.moe_count_gather_s): dgxc-nemo24's
# grok1/grok1_314b.yaml @ 143b90d sets moe_expert_capacity_factor 1.0 and moe_pad_expert_input_to_capacity
# true; every dgxc-nemo25 MoE script adds NeMo's MegatronTokenDropCallback, whose defaults are capacity
# factor 1.0 with padding (NeMo @ 7a8f1cc nemo/lightning/pytorch/callbacks/moe_token_drop.py):
# scripts/performance/llm/pretrain_grok1_314b.py always, pretrain_deepseek_v3.py under USE_TOKEN_DROP = True,
# pretrain_llama4_e128.py through recipes/llama4_e128.py pretrain_performance_optimizations.
_TOKEN_DROP_SOURCES = frozenset({"dgxc-nemo25"})
_TOKEN_DROP_RECIPES = frozenset({"recipe grok1/grok1_314b.yaml @ 143b90d"})
_TOKEN_DROP_CAPACITY_FACTOR = 1.0


# MoE runs whose model config overlaps the shared experts with the token dispatch
# (moe_shared_expert_overlap = True in NeMo @ 7a8f1cc nemo/collections/llm/gpt/model/deepseek.py DeepSeekConfig
# and llama.py Llama4Config); Grok-1 has no shared expert, and Megatron's default is off.
_SHARED_EXPERT_OVERLAP_MODELS = ("deepseek_v3", "llama4_maverick")  # dgxc-nemo25 run ids


def _shared_expert_overlap(source: str, run_id: str) -> bool:
    return _nemo25_model(source, run_id, _SHARED_EXPERT_OVERLAP_MODELS)


# Megatron runs whose loss ran the fused vocab-parallel cross-entropy (Megatron --cross-entropy-loss-fusion,
# NeMo model.cross_entropy_loss_fusion; autopar.frameworks.megatron.FUSED_LOSS_BYTES). dgxc-nemo25: NeMo 2's
# GPTConfig defaults it to True (nemo/collections/llm/gpt/model/base.py, v2.0.0-v2.3.0; only LoRA finetune
# recipes turn it off). megatron-llama3-fp8: examples/llama/train_llama3_8b_h100_fp8.sh passes the flag.
# NeMo 1.x (nemo-24.07, dgxc-nemo24) takes it from the model config, else TransformerConfig's False
# (megatron_base_model.py build_transformer_config): the Llama 3/3.1 configs (NeMo-Framework-Launcher 24.07
# conf/training/llama/*, dgxc-benchmarking llama3.1/*.yaml @ 143b90d) and dgxc's Nemotron-4 recipes set it,
# the GPT-3, Grok-1 and the launcher's Nemotron-4 340B configs do not. Every other Megatron run passes no
# such flag the source names: Megatron-LM's default, unfused (the Megatron-LM README lists its performance
# flags, --overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap, and not this one).
_FUSED_LOSS_SOURCES = frozenset({"dgxc-nemo25", "megatron-llama3-fp8"})


def _cross_entropy_fusion(source: str, model_name: str) -> bool | None:
    """The run's plan field cross_entropy_fusion: None for a framework without that choice."""
    if _SOURCE_TO_FRAMEWORK.get(source, "megatron") != "megatron":
        return None
    if source in _FUSED_LOSS_SOURCES:
        return True
    name = model_name.lower()
    if source == "nemo-24.07":
        return "llama" in name
    if source == "dgxc-nemo24":
        return "llama" in name or "nemotron" in name
    return False


def _token_drop_capacity(source: str, recipe: str | None, moe: bool) -> float | None:
    """The capacity factor an MoE run's recipe pads its experts to, None where it runs dropless."""
    if moe and (source in _TOKEN_DROP_SOURCES or recipe in _TOKEN_DROP_RECIPES):
        return _TOKEN_DROP_CAPACITY_FACTOR
    return None


def _release(source: str, recipe: str | None) -> str | None:
    """The framework release whose profile the row ran (autopar.frameworks), None for the current one."""
    if source in _APEX_ADAM_SOURCES or recipe in _APEX_ADAM_RECIPES:
        return "nemo-apex"
    return _SOURCE_TO_RELEASE.get(source)


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One measured training run, normalised for comparison with the cost model.

    Degrees are 1 when the axis is absent or not applicable, None only where the source does
    not say and the value matters (e.g. vpp of an interleaved pipeline). ``arch`` is a plain
    dict shared by the loader's cache: treat it as read-only.
    """

    run_id: str
    source: str
    source_detail: str
    arch: dict[str, Any]
    cluster: str
    num_gpus: int
    seq_len: int
    global_batch: int
    micro_batch: int | None
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    etp: int
    vpp: int | None
    sequence_parallel: bool | None
    recompute: str | None
    zero_stage: int | None
    precision: str
    measured_tokens_per_s_per_gpu: float
    measured_step_time_s: float | None
    conversion: str
    confidence: str
    split: str
    notes: str = ""
    framework: str = "megatron"  # megatron | deepspeed | torchtitan, as in ParallelPlan.framework
    framework_release: str | None = None  # an older release with its own profile, as in ParallelPlan
    grad_reduce_in_bf16: bool = False  # the recipe keeps gradients in bf16, as in ParallelPlan
    measured_memory_gib: float | None = None  # peak memory the source measured (max reserved), GiB
    compiled: bool | None = None  # torch.compile on (torchtitan rows), None where not applicable
    tp_comm_overlap: bool | None = None  # the recipe's TP communication overlap, None where left open
    recompute_modules: tuple[str, ...] | None = None  # selective recompute's modules where the recipe names them
    moe_capacity_factor: float | None = None  # the recipe pads each expert's input to this capacity factor
    attention_backend: str = "auto"  # the attention kernel the recipe's environment selects (ParallelPlan's)
    moe_shared_expert_overlap: bool = False  # the recipe's model config overlaps shared experts with the dispatch
    cross_entropy_fusion: bool | None = None  # Megatron's fused cross-entropy (_cross_entropy_fusion); None elsewhere
    plan: Any = None  # a user's run (autopar.validate.user_runs): the exact ParallelPlan it ran, nothing free
    # (GPUs, global batch) of the smallest run of the same recipe table (same model, layout and settings at
    # other GPU counts), where it is not this run: its free settings ran there too, so they must fit there.
    series_tightest: tuple[int, int] | None = None


class _Unusable(Exception):
    """A row that cannot be turned into tokens/s/GPU; str(exc) is the reason."""


# ---------------------------------------------------------------------------------------------
# FLOP formulas, each exactly as its source defines it.


def narayanan21_flops_per_iteration(batch: int, seq_len: int, num_layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. SC'21 Eq. 3: F = 96·B·s·l·h²·(1 + s/6h + V/16lh).

    GEMM FLOPs incl. the activation-recompute forward pass; attention counted non-causally;
    ignores softmax, norms and element-wise ops.
    """
    b, s, l, h, v = batch, seq_len, num_layers, hidden, vocab
    return 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))


def korthikanti22_model_flops_per_iteration(
    batch: int, seq_len: int, num_layers: int, hidden: int, vocab: int,
) -> float:
    """Korthikanti et al. 2022 Eq. 7 (model FLOPs): 72·B·L·s·h²·(1 + s/6h + V/12hL).

    Three passes (no recompute), GEMMs only, non-causal attention.
    """
    b, s, l, h, v = batch, seq_len, num_layers, hidden, vocab
    return 72 * b * l * s * h**2 * (1 + s / (6 * h) + v / (12 * h * l))


def megatron_flops_per_iteration(
    batch: int, seq_len: int, num_layers: int, hidden: int, heads: int, kv_heads: int,
    ffn_hidden: int, vocab: int, gated: bool,
) -> float:
    """Megatron-LM num_floating_point_operations (2024, dense, q projection = h):
    12·B·s·L·h²·[(1 + g/a + s/h) + (ffn/h)·(1.5 if gated else 1) + V/(2Lh)].

    Three passes, no recompute, non-causal attention; ignores norms and element-wise ops.
    """
    b, s, l, h = batch, seq_len, num_layers, hidden
    gate = 1.5 if gated else 1.0
    per_layer = (1 + kv_heads / heads + s / h) + (ffn_hidden / h) * gate + vocab / (2 * l * h)
    return 12 * b * s * l * h**2 * per_layer


def tokens_per_s_per_gpu(global_batch: int, seq_len: int, step_time_s: float, num_gpus: int) -> float:
    """Tokens processed per second per GPU: B·s / step time / N."""
    return global_batch * seq_len / step_time_s / num_gpus


def step_time_from_flops_s(flops_per_iteration: float, flops_per_s_per_gpu: float, num_gpus: int) -> float:
    """Step time implied by a per-GPU FLOP rate: F / (rate · N)."""
    return flops_per_iteration / (flops_per_s_per_gpu * num_gpus)


# ---------------------------------------------------------------------------------------------
# Boundary schema of published_runs.yaml (an unknown key is an error).

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class _RowSource(BaseModel):
    model_config = _FROZEN
    title: str
    locator: str
    url: str
    version_date: str


class _RowModel(BaseModel):
    model_config = _FROZEN
    name: str
    params_b: float | None
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int | None
    num_attention_heads: int
    num_kv_heads: int | None
    vocab_size: int | None
    seq_length: int
    activation: str | None
    moe: dict[str, Any] | None
    mla: dict[str, Any] | None
    arch_source: str | None
    arch_notes: str | None


class _RowHardware(BaseModel):
    model_config = _FROZEN
    gpu: str
    gpu_memory_gb: int | None
    num_gpus: int
    gpus_per_node: int | None
    interconnect: str | None
    peak_tflops_used_by_source: float | None


class _RowParallel(BaseModel):
    model_config = _FROZEN
    tp: int | None
    pp: int | None
    dp: int | None
    cp: int | None
    sequence_parallel: bool | None
    ep: int | None
    expert_tp: int | None
    vpp: int | None
    pipeline_schedule: str | None
    zero_stage: int | None
    distributed_optimizer: bool | None
    fsdp: bool | str | None
    recompute: str | None
    recompute_num_layers: int | None
    micro_batch_size: int | None
    global_batch_size: int | None
    global_batch_tokens: int | None
    grad_accum_steps: int | None
    precision: str | None
    model_parallel_size: int | None
    other: str | dict[str, Any] | None


class _RowMetrics(BaseModel):
    model_config = _FROZEN
    tflops_per_gpu: float | None
    mfu: float | None
    hfu: float | None
    pct_of_peak: float | None
    tokens_per_sec_per_gpu: float | None
    tokens_per_sec_total: float | None
    step_time_s: float | None
    aggregate_pflops: float | None
    memory_gib: float | None
    other: str | dict[str, Any] | None


class _Row(BaseModel):
    model_config = _FROZEN
    id: str
    kind: str
    source: _RowSource
    model: _RowModel
    hardware: _RowHardware
    parallel: _RowParallel
    metrics: _RowMetrics
    metric_definition: str
    verified_from: str
    derived_fields: list[str]
    recipe_context: str | None
    other_measurements: str | None
    confidence: Literal["high", "medium", "low"]
    notes: str | None


class _PublishedFile(BaseModel):
    model_config = _FROZEN
    schema_version: Literal[1]
    title: str
    compiled: str
    conventions: dict[str, str]
    skipped: list[dict[str, str]] = []  # source rows the compiler did not turn into runs, with the reason
    runs: list[_Row]


# ---------------------------------------------------------------------------------------------
# Published runs: row -> MeasuredRun fields.


@dataclass(frozen=True, slots=True)
class _Throughput:
    tokens_per_s_per_gpu: float
    step_time_s: float
    conversion: str


def _source_of(run_id: str) -> str:
    for prefix, source in _ID_PREFIX_TO_SOURCE.items():
        if run_id.startswith(prefix):
            return source
    raise SchemaError(f"published run {run_id!r} has no known source prefix; add it to _ID_PREFIX_TO_SOURCE")


def _cluster_of(row: _Row) -> str:
    from autopar.hardware import list_clusters

    for text, cluster in _GPU_TEXT_TO_CLUSTER:
        if text in row.hardware.gpu:
            if cluster not in list_clusters():
                raise _Unusable(f"GPU {row.hardware.gpu!r}: no {cluster} hardware profile to price it on")
            return cluster
    raise SchemaError(f"published run {row.id!r}: GPU {row.hardware.gpu!r} maps to no hardware profile")


def _family(model_name: str) -> str:
    """Model family from its name: llama3, llama2, nemotron, else gpt."""
    name = re.sub(r"[\s_-]", "", model_name.lower())
    for family in ("llama3", "llama2", "nemotron"):
        if family in name:
            return family
    return "gpt"


def _parsed_activation(text: str | None) -> str | None:
    if text is None:
        return None
    lowered = text.lower()
    if "swiglu" in lowered or "geglu" in lowered:  # gated: three matrices (GeGLU costs as SwiGLU)
        return "swiglu"
    if "gelu" in lowered or "squared relu" in lowered:  # non-gated: two matrices (Nemotron-4's relu²)
        return "gelu"
    raise SchemaError(f"activation {text!r} is neither GeLU nor SwiGLU; extend _parsed_activation")


def _family_defaults(source: str, family: str, model: _RowModel) -> dict[str, Any]:
    """Architecture fields a family fixes, used only where the row leaves them empty."""
    h, heads = model.hidden_size, model.num_attention_heads
    if source in ("narayanan21", "korthikanti22", "narayanan21-zero3"):  # Megatron-LM GPT of the SC'21/'22 scripts
        return {"activation": "gelu", "normalization": "layernorm", "position_embedding": "learned",
                "tie_embeddings": True}
    if source == "megatron-readme":  # 12·L·h² + 2·V·h matches every published parameter count
        return {"num_kv_heads": heads, "ffn_hidden_size": 4 * h, "activation": "gelu", "tie_embeddings": False}
    if source == "megascale-moe":  # Table 2: m = 4 query heads per KV group; SwiGLU experts (see notes)
        return {"num_kv_heads": heads // 4, "activation": "swiglu", "normalization": "rmsnorm",
                "position_embedding": "rope", "tie_embeddings": False}
    if source.startswith("dgxc"):
        return _dgxc_defaults(family, model)
    if family in ("llama2", "llama3"):
        return {"activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rope",
                "tie_embeddings": False}
    if family == "gpt" and model.ffn_hidden_size == 4 * h:
        # NeMo GPT3: MHA, non-gated 4h FFN; its launcher configs (conf/training/gpt3/*.yaml) leave
        # share_embeddings_and_output_weights and position_embedding_type unset, and MegatronGPTModel
        # defaults them to True and "learned_absolute" (NeMo megatron_gpt_model.py, cfg.get(..., True)).
        return {"num_kv_heads": heads, "activation": "gelu", "position_embedding": "learned",
                "tie_embeddings": True}
    return {}


def _dgxc_defaults(family: str, model: _RowModel) -> dict[str, Any]:
    """dgxc-benchmarking recipes (Megatron-core GPT models in NeMo): RMSNorm, RoPE, untied
    embeddings for every family; the vocabulary of the tokenizer the recipe ran (arch_notes): the
    24.09 Llama 3.1 405B recipe runs GPT2BPETokenizer (GPT-2 BPE, 50,257), the 24.x Grok-1 recipe
    the Meta-Llama-3-70B tokenizer (128,256)."""
    out: dict[str, Any] = {"normalization": "rmsnorm", "position_embedding": "rope", "tie_embeddings": False}
    name = model.name.lower()
    if "grok" in name:
        out.update(vocab_size=128256, activation="swiglu")
    elif "405b" in name:
        out["vocab_size"] = 50257
    elif family == "nemotron" or "gpt-3" in name:
        out["activation"] = "gelu"  # Nemotron-4's squared ReLU and GPT-3's GeLU: two matrices
    if "gpt-3" in name:
        out.update(normalization="layernorm", position_embedding="learned", tie_embeddings=True)
    return out


# Hybrid rows give no layer pattern; the preset of the published config.json they name does, and is
# used when its shape is the row's (layers, hidden, heads, kv heads, ffn, vocab).
_HYBRID_PRESETS = {"nemotron-h 56b": "nemotron-h-56b"}


def _hybrid_preset(row: _Row) -> str:
    from autopar.model.presets import PRESET_NAMES, preset

    name = next((p for key, p in _HYBRID_PRESETS.items() if key in row.model.name.lower()), None)
    if name is None or name not in PRESET_NAMES:
        raise _Unusable("hybrid Mamba-2/attention layers: no preset with the row's layer pattern")
    spec, m = preset(name), row.model
    shape = (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.kv_heads, spec.ffn_hidden_size,
             spec.vocab_size)
    if shape != (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size, m.vocab_size):
        raise _Unusable(f"hybrid layers: the row's shape is not preset {name}'s {shape}")
    return name


def _published_arch(row: _Row, source: str) -> dict[str, Any]:
    model = row.model
    arch: dict[str, Any] = {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads, "num_kv_heads": model.num_kv_heads,
        "ffn_hidden_size": model.ffn_hidden_size, "vocab_size": model.vocab_size,
        "activation": _parsed_activation(model.activation), "normalization": None,
        "position_embedding": None, "tie_embeddings": None, "moe": model.moe, "mla": model.mla,
        "params_b": model.params_b,
    }
    family = _family(model.name)
    inferred = []
    for key, value in _family_defaults(source, family, model).items():
        if arch[key] is None:
            arch[key] = value
            inferred.append(key)
    if source.startswith("dgxc") and "grok" in model.name.lower() and model.moe and model.moe.get("shared_experts") is None:
        # Grok-1: "Every layer is MoE (no shared expert)" (the rows' arch_notes; xai-org/grok-1 model.py has
        # 8 experts, top-2, no shared path). The proxy rows run 2-32 of 64 layers, so their stated 314B total
        # cannot pick a shared-expert count (autopar.validate.runner._build_graph).
        arch["moe"] = {**model.moe, "shared_experts": 0}
        inferred.append("moe.shared_experts")
    arch["inferred"] = tuple(inferred)
    arch["preset"] = _preset_for(family, arch)
    return arch


@functools.lru_cache(maxsize=1)
def _preset_shapes() -> dict[tuple, str]:
    """(family, layers, hidden, heads, kv heads, ffn) -> preset name, for every dense preset."""
    from autopar.model.presets import PRESET_NAMES, preset

    shapes = {}
    for name in PRESET_NAMES:
        spec = preset(name)
        if spec.moe is not None or spec.mla is not None:
            continue
        family = "gpt" if name.startswith("gpt") else _family(name)
        key = (family, spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.kv_heads,
               spec.ffn_hidden_size)
        shapes[key] = name
    return shapes


def _preset_for(family: str, arch: dict[str, Any]) -> str | None:
    if arch["moe"] is not None or arch["mla"] is not None:
        return None
    heads = arch["num_attention_heads"]
    key = (family, arch["num_layers"], arch["hidden_size"], heads, arch["num_kv_heads"] or heads,
           arch["ffn_hidden_size"])
    return _preset_shapes().get(key)


def _precision(text: str | None) -> tuple[str, str]:
    """(precision, note). 16-bit runs that do not say fp16 or bf16 are recorded as bf16."""
    lowered = (text or "").lower()
    if "fp8" in lowered or "float8" in lowered:
        return "fp8", ""
    if "fp16" in lowered and "bf16" not in lowered:
        return "fp16", ""
    if "bf16" in lowered and "fp16" not in lowered:
        return "bf16", ""
    why = "not stated" if text is None else f"{text!r}"
    return "bf16", f"precision {why}: recorded as bf16 (fp16 has the same peak and bytes)"


def _recompute(text: str | None) -> str | None:
    if text is None:
        return None
    for kind in ("none", "selective", "full"):
        if text.lower().startswith(kind):
            return kind
    raise SchemaError(f"recompute {text!r} is not none/selective/full; extend _recompute")


def _zero_stage(parallel: _RowParallel) -> tuple[int | None, str]:
    if parallel.zero_stage is not None:
        return parallel.zero_stage, ""
    if isinstance(parallel.fsdp, str) and "fsdp" in parallel.fsdp.lower() and not parallel.fsdp.lower().startswith("no"):
        return 3, ""  # FSDP2 full shard (torchtitan's default reshard_after_forward)
    if parallel.distributed_optimizer is not None:
        return int(parallel.distributed_optimizer), ""
    if parallel.other and "--overlap-param-gather" in parallel.other:
        return 1, "zero_stage=1 inferred: --overlap-param-gather needs Megatron's distributed optimizer"
    return None, ""


# Sources whose pipeline ran Megatron's non-interleaved 1F1B though the row leaves vpp empty.
# megascale-moe: Sec. 6.1 puts the strong-scaling decline (PP 15, global batch 720 from 240 to 1,440
# GPUs) on pipeline bubbles ("the number of micro-batches for each pipeline decreases with more GPUs,
# leading to more bubbles"); its MFU endpoints 32.48 -> 27.89 % (x0.859) are the 1F1B bubble,
# (m + p - 1)/m from m = 360 to 60 micro-batches at p = 15 (x0.842, tests/test_fidelity.py), not an
# interleaved one's (x0.913 at two virtual stages, x0.954 at four), and Megatron-LM's own GPU-seconds
# per step grow by the same 1/0.843 (39.94 s x 240 -> 7.90 s x 1,440).
_NON_INTERLEAVED_SOURCES = frozenset({"megascale-moe"})


def _degrees(row: _Row, source: str) -> dict[str, int | None]:
    """tp, pp, dp, cp, ep, etp, vpp with 1 for absent axes; checks tp·pp·dp·cp = GPUs."""
    par, gpus = row.parallel, row.hardware.num_gpus
    if None in (par.tp, par.pp, par.dp):
        raise _Unusable(f"parallel layout not stated (tp={par.tp}, pp={par.pp}, dp={par.dp})")
    cp = par.cp if par.cp is not None else 1
    if par.tp * par.pp * par.dp * cp != gpus:
        raise SchemaError(
            f"published run {row.id!r}: tp {par.tp} x pp {par.pp} x dp {par.dp} x cp {cp} != {gpus} GPUs"
        )
    vpp = 1 if par.pp == 1 or (par.vpp is None and source in _NON_INTERLEAVED_SOURCES) else par.vpp
    return {"tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": cp, "ep": par.ep or 1,
            "etp": par.expert_tp or 1, "vpp": vpp}


def _from_step_time(row: _Row, step_time_s: float, how: str) -> _Throughput:
    b, s, n = row.parallel.global_batch_size, row.model.seq_length, row.hardware.num_gpus
    tps = tokens_per_s_per_gpu(b, s, step_time_s, n)
    return _Throughput(tps, step_time_s, f"{how}; tokens/s/GPU = B·s/step/N (B={b}, s={s}, N={n})")


def _from_printed_tokens(row: _Row, label: str) -> _Throughput:
    tps = row.metrics.tokens_per_sec_per_gpu
    if tps is None:
        raise _Unusable(f"{label}: FLOP formula not stated and no tokens/s/GPU or step time printed")
    b, s, n = row.parallel.global_batch_size, row.model.seq_length, row.hardware.num_gpus
    step = b * s / (tps * n)
    return _Throughput(float(tps), step, f"tokens/s/GPU {tps:g} as printed ({label}); step = B·s/(tokens/s/GPU·N)")


def _convert_narayanan21(row: _Row, arch: dict[str, Any]) -> _Throughput:
    tflops, vocab = row.metrics.tflops_per_gpu, arch["vocab_size"]
    if tflops is None or vocab is None:
        raise _Unusable("Narayanan'21 row without TFLOP/s/GPU or vocabulary size")
    b, s, l, h = row.parallel.global_batch_size, row.model.seq_length, arch["num_layers"], arch["hidden_size"]
    flops = narayanan21_flops_per_iteration(b, s, l, h, vocab)
    step = step_time_from_flops_s(flops, tflops * TFLOPS, row.hardware.num_gpus)
    how = (f"TFLOP/s/GPU {tflops:g} -> step = 96·B·s·l·h²(1+s/6h+V/16lh)/(TFLOP/s·N) per Narayanan'21 Eq. 3 "
           f"(l={l}, h={h}, V={vocab})")
    return _from_step_time(row, step, how)


def _convert_korthikanti22(row: _Row, arch: dict[str, Any]) -> _Throughput:
    if row.metrics.step_time_s is not None:
        return _from_step_time(row, row.metrics.step_time_s, f"iteration time {row.metrics.step_time_s:g} s as printed")
    mfu, peak, vocab = row.metrics.mfu, row.hardware.peak_tflops_used_by_source, arch["vocab_size"]
    if mfu is None or peak is None or vocab is None:
        raise _Unusable("Korthikanti'22 row without iteration time, and without MFU, peak or vocabulary")
    b, s, l, h = row.parallel.global_batch_size, row.model.seq_length, arch["num_layers"], arch["hidden_size"]
    flops = korthikanti22_model_flops_per_iteration(b, s, l, h, vocab)
    step = step_time_from_flops_s(flops, mfu * peak * TFLOPS, row.hardware.num_gpus)
    how = (f"MFU {mfu:g} -> step = 72·B·L·s·h²(1+s/6h+V/12hL)/(MFU·{peak:g} TF/s·N) per Korthikanti'22 Eq. 7 "
           f"(L={l}, h={h}, V={vocab})")
    return _from_step_time(row, step, how)


def _convert_megatron_readme(row: _Row, arch: dict[str, Any]) -> _Throughput:
    tflops = row.metrics.tflops_per_gpu
    if tflops is None:
        raise _Unusable("Megatron-LM README row without TFLOP/s/GPU (MFU only, peak not stated)")
    b, s, l, h = row.parallel.global_batch_size, row.model.seq_length, arch["num_layers"], arch["hidden_size"]
    a, g, ffn, v = arch["num_attention_heads"], arch["num_kv_heads"], arch["ffn_hidden_size"], arch["vocab_size"]
    flops = megatron_flops_per_iteration(b, s, l, h, a, g, ffn, v, gated=arch["activation"] == "swiglu")
    step = step_time_from_flops_s(flops, tflops * TFLOPS, row.hardware.num_gpus)
    how = (f"TFLOP/s/GPU {tflops:g} -> step = 12·B·s·L·h²[(1+g/a+s/h)+ffn/h+V/2Lh]/(TFLOP/s·N) per Megatron-LM "
           f"num_floating_point_operations (L={l}, h={h}, g/a={g}/{a}, ffn={ffn} inferred, V={v})")
    return _from_step_time(row, step, how)


_CONVERTERS = {
    "narayanan21": _convert_narayanan21,
    "korthikanti22": _convert_korthikanti22,
    "megatron-readme": _convert_megatron_readme,
    "nemo-24.07": lambda row, arch: _from_printed_tokens(row, "NeMo 24.07 performance summary"),
    "narayanan21-zero3": _convert_narayanan21,
    "torchtitan-2412": lambda row, arch: _from_printed_tokens(row, "torchtitan docs/performance.md TPS/GPU"),
    "megascale-moe": lambda row, arch: _from_step_time(
        row, row.metrics.step_time_s, f"iteration time {row.metrics.step_time_s:g} s as printed (MegaScale-MoE Table 3)"),
    "megatron-llama3-fp8": lambda row, arch: _from_printed_tokens(row, "Megatron-LM examples/llama FP8 table"),
    "dgxc-nemo24": lambda row, arch: _from_step_time(
        row, row.metrics.step_time_s, f"train_step_timing {row.metrics.step_time_s:g} s of the last of 50 steps as printed"),
    "dgxc-nemo25": lambda row, arch: _from_step_time(
        row, row.metrics.step_time_s, f"mean train_step_timing {row.metrics.step_time_s:g} s of steps 11-44 as printed"),
}


def _published_fields(row: _Row) -> dict[str, Any]:
    """MeasuredRun fields of one published row (all but split); _Unusable if it cannot convert."""
    source = _source_of(row.id)
    degrees = _degrees(row, source)
    arch = _published_arch(row, source)
    if "hybrid" in row.model.name.lower() or "mamba" in row.model.name.lower():
        arch["model"] = _hybrid_preset(row)
    throughput = _CONVERTERS[source](row, arch)
    precision, precision_note = _precision(row.parallel.precision)
    zero_stage, zero_note = _zero_stage(row.parallel)
    notes = "; ".join(n for n in (precision_note, zero_note, row.notes or "") if n)
    return {
        "run_id": row.id, "source": source, "source_detail": f"{row.source.title} — {row.source.locator}",
        "arch": arch, "cluster": _cluster_of(row), "num_gpus": row.hardware.num_gpus,
        "seq_len": row.model.seq_length, "global_batch": row.parallel.global_batch_size,
        "micro_batch": row.parallel.micro_batch_size, **degrees,
        "sequence_parallel": row.parallel.sequence_parallel, "recompute": _recompute(row.parallel.recompute) or ("selective" if _recipe_recompute(source, row.id) else None),
        "zero_stage": zero_stage, "precision": precision,
        "measured_tokens_per_s_per_gpu": throughput.tokens_per_s_per_gpu,
        "measured_step_time_s": throughput.step_time_s, "conversion": throughput.conversion,
        "confidence": row.confidence, "notes": notes,
        "framework": _SOURCE_TO_FRAMEWORK.get(source, "megatron"), "framework_release": _release(source, row.recipe_context),
        "grad_reduce_in_bf16": (row.id in _BF16_GRAD_RUNS or source in _BF16_GRAD_SOURCES
                                or row.recipe_context in _BF16_GRAD_RECIPES),
        "measured_memory_gib": row.metrics.memory_gib,
        "compiled": _compiled(row) if source == "torchtitan-2412" else None,
        "tp_comm_overlap": _tp_comm_overlap(source, row.id),
        "recompute_modules": _recipe_recompute(source, row.id),
        "moe_capacity_factor": _token_drop_capacity(source, row.recipe_context, bool(row.model.moe)),
        "attention_backend": _attention_backend(source, row.recipe_context, row.id, _cluster_of(row), arch),
        "moe_shared_expert_overlap": _shared_expert_overlap(source, row.id),
        "cross_entropy_fusion": _cross_entropy_fusion(source, row.model.name),
    }


def _compiled(row: _Row) -> bool:
    """torch.compile on: torchtitan's tables name it among the run's techniques."""
    return "torch.compile" in (row.recipe_context or "") or "torch.compile" in (row.other_measurements or "")


def _read_published(path: Path) -> list[_Row]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputFileError(f"cannot read {path}: {exc}; reinstall autopar") from exc
    try:
        return _PublishedFile.model_validate(raw).runs
    except ValidationError as exc:
        raise SchemaError(f"{path} breaks its schema: {exc.errors()[0]}") from exc


def _published_group(fields: dict[str, Any]) -> Hashable:
    arch = fields["arch"]
    return (fields["cluster"], arch["num_layers"], arch["hidden_size"], arch["ffn_hidden_size"])


def _load_published(*paths: Path) -> tuple[list[MeasuredRun], list[tuple[str, str]]]:
    """Rows of every file, split together (a model shape in two files lands on one side)."""
    loaded, skipped = [], []
    for row in (row for path in paths for row in _read_published(path)):
        try:
            loaded.append(_published_fields(row))
        except _Unusable as exc:
            logger.info("measured run %s skipped: %s", row.id, exc)
            skipped.append((row.id, str(exc)))
    keys = [_published_group(fields) for fields in loaded]
    splits = _holdout_every(keys, list(dict.fromkeys(keys)), stride=3)
    _mark_series(loaded)
    return [MeasuredRun(**fields, split=split) for fields, split in zip(loaded, splits)], skipped


# Sources whose tables run one recipe at several GPU counts (dgxc-benchmarking: "weak scaling ... on
# identical layouts", the calibration README): a setting the table leaves free (recompute, sequence
# parallelism, TP overlap) is one setting for the whole table.
_RECIPE_TABLE_SOURCES = ("dgxc-nemo24", "dgxc-nemo25")


def _mark_series(loaded: list[dict[str, Any]]) -> None:
    """Set series_tightest on each run of a recipe table that is not its table's smallest run."""
    series: dict[tuple, list[dict[str, Any]]] = {}
    for f in loaded:
        if f["source"] not in _RECIPE_TABLE_SOURCES:
            continue
        key = (f["source"], f["source_detail"].split(" — ")[0], f["arch"]["num_layers"], f["arch"]["hidden_size"],
               f["cluster"], f["seq_len"], f["precision"], f["tp"], f["pp"], f["cp"], f["ep"], f["etp"], f["vpp"],
               f["micro_batch"], f["recompute"], f["sequence_parallel"], "_strong" in f["run_id"])
        series.setdefault(key, []).append(f)
    for members in series.values():
        tightest = min(members, key=lambda f: f["num_gpus"])
        for f in members:
            if f["num_gpus"] != tightest["num_gpus"]:
                f["series_tightest"] = (tightest["num_gpus"], tightest["global_batch"])


# ---------------------------------------------------------------------------------------------
# vTrain CSVs.

_VTRAIN_COLUMNS = (
    "# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
    "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism", "iteration time (ms)",
)
_VTRAIN_VOCAB = 50257  # vTrainConfig default vocab_size (GPT-2 BPE)
_VTRAIN_DETAIL = "vTrain (Bang et al., MICRO'24, arXiv:2312.12391) measured iteration times"
_VTRAIN_INFERRED = ("num_kv_heads", "ffn_hidden_size", "vocab_size", "activation", "normalization",
                    "position_embedding", "tie_embeddings")
_VTRAIN_NOTES = ("fp16 per vTrain's profiler; A100-SXM 80GB per a summary of the paper; sequence_parallel=False "
                 "and zero_stage=0 as vTrain models them (all-reduce TP, plain DDP gradient all-reduce)")


def _read_vtrain(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:  # the files start with a BOM
            reader = csv.DictReader(handle)
            rows = list(reader)
            header = tuple(reader.fieldnames or ())
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc}; reinstall autopar") from exc
    missing = [column for column in _VTRAIN_COLUMNS if column not in header]
    extra = [column for column in header if column not in _VTRAIN_COLUMNS and column != "Parameters (billion)"]
    if missing or extra:
        raise SchemaError(f"{path}: columns missing {missing}, unexpected {extra}")
    return rows


def _vtrain_arch(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    arch = {
        "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": heads,
        "ffn_hidden_size": 4 * hidden, "vocab_size": _VTRAIN_VOCAB, "activation": "gelu",
        "normalization": "layernorm", "position_embedding": "learned", "tie_embeddings": True,
        "moe": None, "mla": None, "inferred": _VTRAIN_INFERRED,
    }
    arch["preset"] = _preset_for("gpt", arch)
    return arch


def _vtrain_fields(row: dict[str, str], run_id: str, source: str, detail: str) -> dict[str, Any]:
    n, b, mb = int(row["# GPUs"]), int(row["global batch"]), int(row["micro batch"])
    s, ms = int(row["sequence length"]), float(row["iteration time (ms)"])
    tp, dp, pp = int(row["tensor parallelism"]), int(row["data parallelism"]), int(row["pipeline parallelism"])
    if tp * dp * pp != n:
        raise SchemaError(f"vTrain {run_id}: tp {tp} x dp {dp} x pp {pp} != {n} GPUs")
    step = ms * MS
    arch = _vtrain_arch(int(row["# layers"]), int(row["hidden size"]), int(row["attention heads"]))
    return {
        "run_id": run_id, "source": source, "source_detail": detail, "arch": arch, "cluster": "vtrain-a100",
        "num_gpus": n, "seq_len": s, "global_batch": b, "micro_batch": mb, "tp": tp, "pp": pp, "dp": dp,
        "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "sequence_parallel": False, "recompute": "full", "zero_stage": 0,
        "precision": "fp16", "measured_tokens_per_s_per_gpu": tokens_per_s_per_gpu(b, s, step, n),
        "measured_step_time_s": step, "conversion": f"B·s / iteration time {ms:g} ms / N (B={b}, s={s}, N={n})",
        "confidence": "high", "notes": _VTRAIN_NOTES, "framework": "deepspeed",
        "framework_release": _SOURCE_TO_RELEASE[source],
    }


def _load_vtrain(path: Path, source: str) -> list[MeasuredRun]:
    prefix = source.replace("-", "_")
    detail = f"{_VTRAIN_DETAIL}, {path.name}"
    fields = [
        _vtrain_fields(row, f"{prefix}_{i:04d}", source, f"{detail} data row {i}")
        for i, row in enumerate(_read_vtrain(path), start=1)
    ]
    keys = [(f["arch"]["hidden_size"], f["arch"]["num_layers"]) for f in fields]
    shapes = sorted(set(keys))
    splits = _holdout_every(keys, shapes, stride=3 if len(shapes) >= 6 else 2)
    return [MeasuredRun(**f, split=split) for f, split in zip(fields, splits)]


# ---------------------------------------------------------------------------------------------
# Split and public API.


def _holdout_every(keys: Sequence[Hashable], order: Sequence[Hashable], stride: int) -> list[str]:
    """Split per row: the group at position g of `order` is held out iff g % stride == 1."""
    position = {key: g for g, key in enumerate(order)}
    return ["holdout" if position[key] % stride == 1 else "fit" for key in keys]


def measured_dir() -> Path:
    """The shipped folder of measured runs (cost_models/measured)."""
    return data_dir("cost_models") / "measured"


@functools.lru_cache(maxsize=1)
def _load_all() -> tuple[tuple[MeasuredRun, ...], tuple[tuple[str, str], ...]]:
    folder = measured_dir()
    published, skipped = _load_published(folder / PUBLISHED_FILE, folder / PUBLISHED_FILE_2, folder / PUBLISHED_FILE_3)
    single = _load_vtrain(folder / VTRAIN_SINGLE_FILE, "vtrain-single")
    multi = _load_vtrain(folder / VTRAIN_MULTI_FILE, "vtrain-multi")
    return tuple(published + single + multi), tuple(skipped)


def load_runs(sources: set[str] | None = None) -> list[MeasuredRun]:
    """Every usable measured run, or those of `sources` (names in SOURCES), in file order."""
    unknown = sorted(set(sources or ()) - set(SOURCES))
    if unknown:
        raise SchemaError(f"unknown measured-run source(s) {', '.join(unknown)}; choose from {', '.join(SOURCES)}")
    runs, _ = _load_all()
    return [run for run in runs if sources is None or run.source in sources]


def load_skipped() -> list[tuple[str, str]]:
    """(run_id, reason) for each published row that could not be converted to tokens/s/GPU."""
    return list(_load_all()[1])
