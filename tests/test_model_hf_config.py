"""Hugging Face config.json -> ModelSpec: every setting a launch needs, in the transformers 4 and 5
spellings alike, named by the config (not its folder); sliding-window attention priced by hand."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from autopar.errors import SchemaError
from autopar.model import SUPPORTED_MODEL_TYPES, build_graph, load_spec
from autopar.model.graph import attended_keys_per_query, scored_keys_per_query
from autopar.model.hf_config import spec_from_hf_config

HF = Path(__file__).parent / "fixtures" / "hf"

# One real config per accepted model_type (fixtures/hf, trimmed copies of the hub's config.json)
FIXTURES = {"llama": "llama3-8b.json", "mistral": "mistral-7b.json", "qwen2": "qwen2-7b.json",
            "qwen3": "qwen3-8b.json", "mixtral": "mixtral-8x7b.json", "qwen3_moe": "qwen3-30b-a3b.json",
            "deepseek_v3": "deepseek-v3.json", "gpt2": "gpt2.json", "gpt_neox": "gpt-neox-20b.json"}
# 2025-26 architectures (tests/test_model_2026.py checks their counts, tests/test_hybrid_export.py
# their exports)
FIXTURES_2026 = {"nemotron_h": "nemotron-h-56b.json", "qwen3_next": "qwen3-next-80b-a3b.json",
                 "kimi_linear": "kimi-linear-48b-a3b.json", "gpt_oss": "gpt-oss-120b.json",
                 "llama4": "llama4-maverick.json", "llama4_text": "llama4-maverick-text.json",
                 "kimi_k2": "kimi-k2-instruct-0905.json", "deepseek_v32": "deepseek-v3.2-exp.json"}
ALL_FIXTURES = {**FIXTURES, **FIXTURES_2026}
# Configs with no RoPE, experts or windows at the top level to respell (Nemotron-H has no RoPE; a
# Llama 4 config keeps them in its text_config)
_NOTHING_TO_RESPELL = ("gpt2", "nemotron_h", "llama4")


def hf(name: str) -> dict:
    return json.loads((HF / name).read_text())


def transformers5(cfg: dict) -> dict:
    """The same config as transformers 5 saves it: RoPE in rope_parameters, experts as
    num_local_experts, the rotary share as partial_rotary_factor, windows as layer_types."""
    out = copy.deepcopy(cfg)
    scaling = out.pop("rope_scaling", None) or {}
    theta = out.pop("rope_theta", None)
    if out["model_type"] == "gpt_neox":
        theta = out.pop("rotary_emb_base", 10000)
        out["partial_rotary_factor"] = out.pop("rotary_pct")
    if theta is not None:
        rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
        scaling.pop("type", None)
        out["rope_parameters"] = {"rope_type": rope_type, "rope_theta": theta, **scaling}
    if "num_experts" in out:
        out["num_local_experts"] = out.pop("num_experts")
    if "use_sliding_window" in out:
        sliding = out.pop("use_sliding_window")
        first = out.pop("max_window_layers", out["num_hidden_layers"])
        out["layer_types"] = ["sliding_attention" if sliding and i >= first else "full_attention"
                              for i in range(out["num_hidden_layers"])]
    return out


def test_every_accepted_model_type_has_a_fixture():
    assert set(ALL_FIXTURES) == set(SUPPORTED_MODEL_TYPES)
    assert all(hf(f)["model_type"] == t for t, f in ALL_FIXTURES.items())


@pytest.mark.parametrize("model_type", list(ALL_FIXTURES))
def test_transformers_4_and_5_spellings_read_alike(model_type):
    v4 = hf(ALL_FIXTURES[model_type])
    v5 = transformers5(v4)
    if model_type not in _NOTHING_TO_RESPELL:
        assert v5 != v4
    assert spec_from_hf_config(v5, "m") == spec_from_hf_config(v4, "m")


def test_qwen3_moe_saved_by_transformers_5_loads_like_4():
    v5 = load_spec(str(HF / "qwen3-30b-a3b.transformers5.json"))
    v4 = load_spec(str(HF / "qwen3-30b-a3b.json"))
    assert v5.moe.num_experts == 128 and v5.rope_theta == 1e6
    assert v5.model_copy(update={"name": v4.name}) == v4


def test_rope_parameters_keyed_by_layer_type_read_the_full_attention_entry():
    cfg = transformers5(hf("llama3-8b.json"))
    cfg["rope_parameters"] = {"full_attention": cfg["rope_parameters"],
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    assert spec_from_hf_config(cfg, "m").rope_theta == 500000.0


# Values read straight off the fixtures' JSON, one row per config: (file, spec attribute path, value)
EXPECTED = [
    ("llama3-8b.json", "rope_theta", 500000.0), ("llama3-8b.json", "norm_epsilon", 1e-5),
    ("llama3-8b.json", "rope_scaling", None), ("llama3-8b.json", "tie_embeddings", False),
    ("llama3.1-8b.json", "rope_scaling.type", "llama3"), ("llama3.1-8b.json", "rope_scaling.factor", 8.0),
    ("llama3.1-8b.json", "rope_scaling.original_max_position_embeddings", 8192),
    ("llama3.1-8b.json", "rope_scaling.high_freq_factor", 4.0),
    ("mistral-7b.json", "sliding_window", 4096), ("mistral-7b.json", "rope_theta", 10000.0),
    ("mixtral-8x7b.json", "moe.aux_loss_coeff", 0.02), ("mixtral-8x7b.json", "rope_theta", 1e6),
    ("mixtral-8x7b.json", "sliding_window", None),
    ("qwen2-7b.json", "sliding_window", None), ("qwen2-7b.json", "norm_epsilon", 1e-6),
    ("qwen3-8b.json", "qk_norm", True), ("qwen3-8b.json", "rope_theta", 1e6),
    ("qwen3-30b-a3b.json", "moe.aux_loss_coeff", 0.001), ("qwen3-30b-a3b.json", "moe.norm_topk_prob", True),
    ("qwen3-30b-a3b.json", "moe.score_function", "softmax"),
    ("deepseek-v3.json", "moe.score_function", "sigmoid"), ("deepseek-v3.json", "moe.expert_bias", True),
    ("deepseek-v3.json", "moe.num_groups", 8), ("deepseek-v3.json", "moe.group_topk", 4),
    ("deepseek-v3.json", "moe.routed_scaling_factor", 2.5), ("deepseek-v3.json", "moe.aux_loss_coeff", 0.001),
    ("deepseek-v3.json", "moe.aux_loss_per_sequence", True), ("deepseek-v3.json", "moe.router_fp32", True),
    ("deepseek-v3.json", "rope_scaling.type", "yarn"), ("deepseek-v3.json", "rope_scaling.factor", 40.0),
    ("deepseek-v3.json", "rope_scaling.mscale_all_dim", 1.0), ("deepseek-v3.json", "norm_epsilon", 1e-6),
    ("gpt2.json", "norm_epsilon", 1e-5), ("gpt2.json", "tie_embeddings", True),
    ("gpt-neox-20b.json", "rotary_percent", 0.25), ("gpt-neox-20b.json", "rope_theta", 10000.0),
]


def attr(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("fixture,path,value", EXPECTED)
def test_spec_carries_the_config_value(fixture, path, value):
    assert attr(load_spec(str(HF / fixture)), path) == value


def test_presets_carry_the_hub_configs_values():
    for name, fixture in (("llama3-8b", "llama3-8b.json"), ("mixtral-8x7b", "mixtral-8x7b.json"),
                          ("qwen3-30b-a3b", "qwen3-30b-a3b.json"), ("deepseek-v3", "deepseek-v3.json")):
        a, b = load_spec(name), load_spec(str(HF / fixture))
        for field in ("rope_theta", "rope_scaling", "norm_epsilon", "sliding_window", "tie_embeddings", "moe"):
            assert getattr(a, field) == getattr(b, field), (name, field)


def test_name_comes_from_the_config_not_its_folder(tmp_path):
    snapshot = tmp_path / "snapshots" / "5f0b02c75b57c5855da9ae460ce51323ea669d8a"
    snapshot.mkdir(parents=True)
    shutil.copy(HF / "llama3-8b.json", snapshot / "config.json")
    assert load_spec(str(snapshot)).name == "LlamaForCausalLM"
    assert load_spec(str(HF / "llama3.1-8b.json")).name == "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize("change,match", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "RoPE scaling 'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn"}}, "lacks 'factor'"),
])
def test_unsupported_rope_scaling_is_refused(change, match):
    with pytest.raises(SchemaError, match=match):
        spec_from_hf_config({**hf("llama3-8b.json"), **change}, "m")


def test_sliding_window_on_some_layers_only_is_refused():
    cfg = {**hf("qwen2-7b.json"), "use_sliding_window": True, "max_window_layers": 20}
    with pytest.raises(SchemaError, match="sliding-window attention on 8 of 28 layers"):
        spec_from_hf_config(cfg, "m")
    every = spec_from_hf_config({**cfg, "max_window_layers": 0, "sliding_window": 4096}, "m")
    assert every.sliding_window == 4096


# ---- sliding-window attention in FLOPs and memory ---------------------------------------------

def test_attended_keys_hand_worked():
    # causal full attention: s/2; window w < s: w - w^2/(2s). Mistral at 8k: 4096 - 4096^2/16384 = 3072.
    assert attended_keys_per_query(8192, None) == 4096
    assert attended_keys_per_query(8192, 4096) == 3072
    assert attended_keys_per_query(4096, 4096) == 2048  # the window covers the sequence: plain causal
    assert attended_keys_per_query(8192, None, causal=False) == 8192
    assert scored_keys_per_query(8192, 4096) == 4096 and scored_keys_per_query(2048, 4096) == 2048


@pytest.mark.parametrize("s,w", [(64, 16), (100, 7), (33, 32)])
def test_attended_keys_match_brute_force_count(s, w):
    """Exact count: query i sees min(i+1, w) keys. The continuum formula omits the diagonal's +1/2
    per query (w/(2s) with a window, 1/2 without)."""
    exact = sum(min(i + 1, w) for i in range(s)) / s
    assert attended_keys_per_query(s, w) == pytest.approx(exact - w / (2 * s), rel=1e-12)


def test_mistral_attention_flops_follow_the_window():
    spec = load_spec(str(HF / "mistral-7b.json"))
    windowed, full = build_graph(spec), build_graph(spec.model_copy(update={"sliding_window": None}))
    layer, ref = windowed.decoder_layers[0], full.decoder_layers[0]
    # 2 FLOPs x 32 heads x (128 + 128) per attended key
    assert layer.attention_flops_per_token(8192) == 2 * 32 * 256 * 3072
    assert ref.attention_flops_per_token(8192) == 2 * 32 * 256 * 4096
    assert layer.attention_flops_per_token(2048) == ref.attention_flops_per_token(2048)


def test_unfused_scores_memory_follows_the_window():
    """A dropout model saves a·s score bytes per token unfused (Korthikanti); a window keeps w."""
    spec = load_spec("gpt-1.7b").model_copy(update={"position_embedding": "rope", "sliding_window": 512})
    layer = build_graph(spec).decoder_layers[0]
    full = build_graph(spec.model_copy(update={"sliding_window": None})).decoder_layers[0]
    a = spec.num_attention_heads
    got, ref = layer.activation_bytes_per_token(2048), full.activation_bytes_per_token(2048)
    assert ref["softmax_output"] - got["softmax_output"] == 2 * a * (2048 - 512)
    assert got["attn_dropout_mask"] == 1 * a * 512
