"""HF config.json -> export -> the framework's own parsed config: the fields equal the HF
config's values, for every model_type autopar accepts (in both transformers spellings), or the
exporter refuses with the reason.

- Megatron: the exported arguments through autopar's re-implementation of Megatron-LM's parser
  and validate_args, then megatron-core's TransformerConfig / MLATransformerConfig built from
  them as core_transformer_config_from_args does; the expected values are read off the JSON.
- torchtitan 0.3: the generated config_registry module and the arguments through torchtitan's
  ConfigManager; the model config's RoPE, norm and router configs carry the JSON's values.
- DeepSpeed 0.19: the engine's config has no model section, so the export writes the model as a
  config.json for the training script; its keys equal the input's, and DeepSpeedConfig parses the
  ds_config.json at the plan's data-parallel size.
Each framework test skips when the framework is not installed; CI installs them.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autopar.errors import ExportError
from autopar.export import export, megatron_args
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
from autopar.model import load_spec
from autopar.schema.plan import ParallelPlan
from autopar.schema.plan_file import PlanFile, PlanTarget
from test_export_frameworks import deepspeed_config, fake_world, titan_config, transformer_config  # noqa: F401
from test_model_hf_config import FIXTURES, transformers5

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")

HF = Path(__file__).parent / "fixtures" / "hf"
CONFIGS = sorted(set(FIXTURES.values()) | {"llama3.1-8b.json"})


def load_config(name: str, spelling: str) -> dict:
    cfg = json.loads((HF / name).read_text())
    return transformers5(cfg) if spelling == "v5" else cfg


def plan_file_for_config(cfg: dict, tmp_path: Path, framework: str) -> PlanFile:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_spec(str(path))
    seq = min(4096, spec.max_position_embeddings or spec.seq_length)
    plan = ParallelPlan(global_batch=8, seq_len=seq, framework=framework, zero=2 if framework == "torchtitan" else 1)
    return PlanFile(autopar_version="test", target=PlanTarget(model=str(path), model_spec=spec, cluster="dgx-h100",
                                                              gpus=8), parallel=plan)


def rope_theta(cfg: dict) -> float:
    return float(cfg.get("rope_theta") or cfg.get("rotary_emb_base")
                 or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0)


def rope_scaling(cfg: dict) -> dict:
    return cfg.get("rope_scaling") or {k: v for k, v in (cfg.get("rope_parameters") or {}).items()
                                       if k != "rope_theta"}


def eps(cfg: dict) -> float:
    return cfg.get("rms_norm_eps") or cfg.get("layer_norm_eps") or cfg["layer_norm_epsilon"]


# ---- Megatron ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["v4", "v5"])
@pytest.mark.parametrize("name", CONFIGS)
def test_megatron_parsed_config_equals_the_hf_config(name, spelling, tmp_path):
    pytest.importorskip("megatron.core")
    cfg = load_config(name, spelling)
    pf = plan_file_for_config(cfg, tmp_path, "megatron")
    args = megatron_args(pf)
    a = parse_megatron_argv(args)
    assert megatron_violations(a, 8) == []
    config = transformer_config(a)

    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (
        cfg.get("num_hidden_layers", cfg.get("n_layer")), cfg.get("hidden_size", cfg.get("n_embd")),
        cfg.get("num_attention_heads", cfg.get("n_head")))
    assert config.layernorm_epsilon == eps(cfg)
    assert a["untie_embeddings_and_output_weights"] == (not cfg.get("tie_word_embeddings", cfg["model_type"] == "gpt2"))
    if cfg["model_type"] == "gpt2":
        assert a["position_embedding_type"] == "learned_absolute"
    else:
        assert a["position_embedding_type"] == "rope" and a["rotary_base"] == rope_theta(cfg)
    if cfg["model_type"] == "gpt_neox":
        assert a["rotary_percent"] == cfg.get("rotary_pct", cfg.get("partial_rotary_factor"))
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    assert config.window_size == ((window - 1, 0) if window else None)  # HF counts the query's own token
    if "num_key_value_heads" in cfg and cfg["model_type"] != "deepseek_v3":
        assert config.num_query_groups == cfg["num_key_value_heads"]
    # Qwen3's per-head q/k norms; MLA's q_a/kv_a norms (DeepSeek-V2/V3), which megatron-core builds with qk_layernorm
    assert config.qk_layernorm == (cfg["model_type"] in ("qwen3", "qwen3_moe") or "kv_lora_rank" in cfg)

    scaling = rope_scaling(cfg)
    kind = scaling.get("rope_type") or scaling.get("type")
    assert a["use_rope_scaling"] == (kind == "llama3")
    if kind == "llama3":
        assert a["rope_scaling_factor"] == scaling["factor"]
        assert (scaling["low_freq_factor"], scaling["high_freq_factor"],
                scaling["original_max_position_embeddings"]) == (1.0, 4.0, 8192)  # Megatron's fixed values
    if cfg["model_type"] == "deepseek_v3":  # MLA with YaRN
        assert (config.rope_type, config.rotary_base) == ("yarn", rope_theta(cfg))
        assert (config.rotary_scaling_factor, config.mscale, config.mscale_all_dim) == (
            scaling["factor"], scaling["mscale"], scaling["mscale_all_dim"])
        assert (config.original_max_position_embeddings, config.beta_fast, config.beta_slow) == (
            scaling["original_max_position_embeddings"], scaling["beta_fast"], scaling["beta_slow"])
    _check_router(cfg, config)


def _check_router(cfg: dict, config) -> None:
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if not experts:
        assert config.num_moe_experts is None
        return
    assert (config.num_moe_experts, config.moe_router_topk) == (experts, cfg["num_experts_per_tok"])
    if cfg["model_type"] == "deepseek_v3":
        assert config.moe_router_score_function == cfg["scoring_func"] == "sigmoid"
        assert config.moe_router_enable_expert_bias == (cfg["topk_method"] == "noaux_tc")
        assert (config.moe_router_num_groups, config.moe_router_group_topk) == (cfg["n_group"], cfg["topk_group"])
        assert config.moe_router_topk_scaling_factor == cfg["routed_scaling_factor"]
        assert config.moe_router_dtype == "fp32"
        assert config.moe_router_load_balancing_type == ("seq_aux_loss" if cfg["seq_aux"] else "aux_loss")
        assert config.moe_aux_loss_coeff == cfg["aux_loss_alpha"]
    else:
        # softmax over the top-k logits renormalises them, as HF's norm_topk_prob (Mixtral always does)
        assert config.moe_router_score_function == "softmax"
        assert config.moe_router_pre_softmax == (not cfg.get("norm_topk_prob", cfg["model_type"] == "mixtral"))
        assert config.moe_router_load_balancing_type == "aux_loss"
        assert config.moe_aux_loss_coeff == cfg["router_aux_loss_coef"]


def test_megatron_flag_names_are_megatron_cores():
    """The flags Megatron-LM 0.16 derives from TransformerConfig fields (argparse_meta arg_names,
    else --field-name) include every router/norm flag autopar writes."""
    pytest.importorskip("megatron.core")
    import dataclasses

    from megatron.core.transformer import TransformerConfig

    names = set()
    for f in dataclasses.fields(TransformerConfig):
        meta = f.metadata.get("argparse_meta", {})
        names |= set(meta.get("arg_names", ["--" + f.name.replace("_", "-")]))
    args = megatron_args(_preset_plan("deepseek-v3", gpus=256, ep=8))
    written = {a for a in args if a.startswith("--moe-router") or a == "--norm-epsilon"}
    assert written >= {"--moe-router-score-function", "--moe-router-enable-expert-bias", "--moe-router-num-groups",
                       "--moe-router-group-topk", "--moe-router-topk-scaling-factor", "--moe-router-dtype",
                       "--norm-epsilon"}
    assert written - {"--moe-router-load-balancing-type"} <= names  # that one is arguments.py's own (nargs +)


def _preset_plan(model: str, gpus: int, **plan) -> PlanFile:
    spec = load_spec(model)
    return PlanFile(autopar_version="test", target=PlanTarget(model=model, model_spec=spec, cluster="dgx-h100",
                                                              gpus=gpus),
                    parallel=ParallelPlan(global_batch=gpus, seq_len=4096, **plan))


@pytest.mark.parametrize("change,match", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}},
     "YaRN RoPE scaling outside multi-latent attention"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, "Megatron applies it with 1/4 and 8192 only"),
    ({"rope_theta": 500000.5}, "--rotary-base takes an integer"),
])
def test_megatron_refuses_what_it_cannot_express(change, match, tmp_path):
    cfg = {**json.loads((HF / "llama3-8b.json").read_text()), **change}
    with pytest.raises(ExportError, match=match):
        export(plan_file_for_config(cfg, tmp_path, "megatron"), "megatron")


# ---- torchtitan --------------------------------------------------------------------------------

TITAN_REFUSALS = {"mistral-7b.json": "no torchtitan 0.3 model_registry", "qwen2-7b.json": "no torchtitan 0.3 model_registry",
                  "qwen3-8b.json": "no torchtitan 0.3 model_registry", "mixtral-8x7b.json": "no torchtitan",
                  "deepseek-v3.json": "MTP", "gpt2.json": "no torchtitan", "gpt-neox-20b.json": "no torchtitan"}


@pytest.mark.parametrize("spelling", ["v4", "v5"])
@pytest.mark.parametrize("name", CONFIGS)
def test_torchtitan_model_config_equals_the_hf_config(name, spelling, tmp_path, titan_config):  # noqa: F811
    from torchtitan.models.common import RMSNorm, RoPE
    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    cfg = load_config(name, spelling)
    pf = plan_file_for_config(cfg, tmp_path, "torchtitan")
    if name in TITAN_REFUSALS:
        with pytest.raises(ExportError, match=TITAN_REFUSALS[name]):
            export(pf, "torchtitan")
        return
    model = titan_config(pf).model_spec.model
    assert len(model.layers) == cfg["num_hidden_layers"]
    ropes = [c for _, c, _, _ in model.traverse(RoPE.Config)]
    norms = [c for _, c, _, _ in model.traverse(RMSNorm.Config)]
    assert ropes and all(r.theta == rope_theta(cfg) for r in ropes)
    assert norms and all(n.eps == cfg["rms_norm_eps"] for n in norms)
    scaling = rope_scaling(cfg)
    if (scaling.get("rope_type") or scaling.get("type")) == "llama3":
        assert all((r.scaling, r.scaling_factor, r.low_freq_factor, r.high_freq_factor,
                    r.original_max_position_embeddings) == ("llama", scaling["factor"], scaling["low_freq_factor"],
                                                            scaling["high_freq_factor"],
                                                            scaling["original_max_position_embeddings"])
                   for r in ropes)
    else:
        assert all(r.scaling == "none" for r in ropes)  # the registry's Llama 3.1 scaling is taken off
    routers = [c for _, c, _, _ in model.traverse(TokenChoiceTopKRouter.Config)]
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        assert routers and all((r.num_experts, r.top_k, r.score_func, r.route_norm) ==
                               (experts, cfg["num_experts_per_tok"], "softmax", cfg["norm_topk_prob"])
                               for r in routers)
    else:
        assert not routers


def test_torchtitan_refuses_a_window_it_cannot_set(tmp_path):
    cfg = {**json.loads((HF / "llama3-8b.json").read_text()), "model_type": "mistral", "sliding_window": 4096}
    with pytest.raises(ExportError, match="sliding window 4096: torchtitan's attention configs have no window"):
        export(plan_file_for_config(cfg, tmp_path, "torchtitan"), "torchtitan")


def test_torchtitan_recognises_a_llama3_config_by_shape_and_floats_any_flavour(tmp_path, titan_config,  # noqa: F811
                                                                               monkeypatch):
    """A Llama-3 config.json (not the preset by name) is the llama3 8B flavour, and fp8 is the
    float8 converter on it (no registry entry has float8 on 8B). The converter checks for an SM89+
    GPU when it is built; the test machine stands in for an H100."""
    pytest.importorskip("torchao")
    import torchtitan.components.quantization.float8 as float8
    from torchtitan.models.common.linear import Linear

    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: (major, minor) <= (9, 0))

    cfg = json.loads((HF / "llama3-8b.json").read_text())
    pf = plan_file_for_config(cfg, tmp_path, "torchtitan")
    pf = pf.model_copy(update={"parallel": pf.parallel.model_copy(update={"precision": "fp8"})})
    model = titan_config(pf).model_spec.model
    linears = [type(c).__qualname__ for _, c, _, _ in model.traverse(Linear.Config)]
    assert any("Float8" in n for n in linears)


# ---- DeepSpeed ---------------------------------------------------------------------------------

# The keys each model_type's config.json carries that describe the model (not tokens or dtypes)
MODEL_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "vocab_size", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_scaling",
              "rotary_emb_base", "rotary_pct", "sliding_window", "tie_word_embeddings", "num_local_experts",
              "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
              "router_aux_loss_coef", "scoring_func", "topk_method", "n_group", "topk_group", "routed_scaling_factor",
              "aux_loss_alpha", "seq_aux", "first_k_dense_replace", "n_shared_experts", "kv_lora_rank", "q_lora_rank",
              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim", "n_layer", "n_embd", "n_head")


@pytest.mark.parametrize("spelling", ["v4", "v5"])
@pytest.mark.parametrize("name", CONFIGS)
def test_deepspeed_model_config_equals_the_hf_config(name, spelling, tmp_path, deepspeed_config):  # noqa: F811
    import torch.distributed as dist

    cfg = load_config(name, spelling)
    pf = plan_file_for_config(cfg, tmp_path, "deepspeed")
    files = export(pf, "deepspeed")
    model = json.loads(files["config.json"])
    original = json.loads((HF / name).read_text())  # compare in the transformers 4 spelling
    for key in MODEL_KEYS:
        if key in original and original[key] is not None:
            got, want = model.get(key), original[key]
            if key == "rope_scaling":
                want = {("rope_type" if k == "type" else k): v for k, v in want.items()}
            if key == "sliding_window" and not original.get("use_sliding_window", True):
                want = None  # Qwen's window is inert without use_sliding_window
            assert got == want, (key, got, want)
    assert "config.json beside this script" in files["launch_deepspeed.sh"]
    ds = deepspeed_config(json.loads(files["ds_config.json"]), 8, pf.parallel.dp_for(8))
    assert (ds.train_batch_size, ds.zero_optimization_stage) == (pf.parallel.global_batch, pf.parallel.zero)
    dist.destroy_process_group()


def test_deepspeed_export_of_a_model_no_hf_type_describes_says_so(tmp_path):
    cfg = json.loads((HF / "llama3-8b.json").read_text())
    pf = plan_file_for_config(cfg, tmp_path, "deepspeed")
    spec = pf.target.model_spec.model_copy(update={"activation": "gelu"})  # rmsnorm + rope + gelu: no model_type
    pf = pf.model_copy(update={"target": pf.target.model_copy(update={"model_spec": spec})})
    from autopar.export.hf_model import hf_config_from_spec

    with pytest.raises(ExportError, match="llama differs in activation"):
        hf_config_from_spec(spec)
    files = export(pf, "deepspeed")
    assert "config.json" not in files and "build it yourself" in files["launch_deepspeed.sh"]
