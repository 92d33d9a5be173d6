"""Megatron export of the models of 2026 (issue 30): what Megatron-LM (core 0.16) runs for them,
flag by flag, checked by autopar's re-implementation of Megatron's validation and, where
megatron-core is installed, by megatron-core itself (its TransformerConfig and its hybrid layer
allocation accept the exported values); what Megatron cannot build is refused with the reason."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from autopar.api import load_model
from autopar.errors import ExportError
from autopar.export import export, megatron_args
from autopar.export.megatron_rules import megatron_violations, parse_megatron_argv
from autopar.frameworks import plan_refusals
from autopar.schema.plan import ParallelPlan
from autopar.schema.plan_file import PlanFile, PlanTarget

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")


def plan_file(model, gpus: int, **plan) -> PlanFile:
    spec = load_model(model).spec if isinstance(model, str) else model
    return PlanFile(autopar_version="0.1.0", target=PlanTarget(model=spec.name, model_spec=spec, cluster="dgx-h100",
                                                               gpus=gpus), parallel=ParallelPlan(**plan))


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} appears {args.count(name)} times"
    return args[args.index(name) + 1]


def gpt_oss_without_yarn():
    """gpt-oss's layers (windows, sinks, biases) with plain RoPE: megatron-core 0.16 has YaRN only in MLA."""
    return load_model("gpt-oss-120b").spec.model_copy(update=dict(rope_scaling=None))


def llama4_without_chunks():
    """Llama 4's NoPE layers and interleaved MoE with full attention on the RoPE layers."""
    spec = load_model("llama4-maverick-17b-128e").spec
    return spec.model_copy(update=dict(layer_pattern=spec.layer_pattern.replace("C", "A"), attention_chunk_size=None))


CASES = {
    "nemotron-h tp8 pp2": lambda: plan_file("nemotron-h-56b", 64, tp=8, pp=2, global_batch=256, seq_len=8192),
    "nemotron-h tp4 cp2 uneven": lambda: plan_file("nemotron-h-56b", 64, tp=4, pp=4, cp=2, global_batch=256,
                                                   seq_len=8192, layers_per_stage=(28, 30, 30, 30)),
    "qwen3-next tp2 ep16": lambda: plan_file("qwen3-next-80b-a3b", 64, tp=2, pp=2, ep=16, etp=1, global_batch=256,
                                             seq_len=4096),
    "deepseek-v3.2 ep32": lambda: plan_file("deepseek-v3.2-exp", 1024, tp=2, pp=8, ep=32, etp=1, global_batch=2048,
                                            seq_len=4096),
    "gpt-oss layers": lambda: plan_file(gpt_oss_without_yarn(), 64, tp=8, ep=8, etp=1, global_batch=256,
                                        seq_len=8192),
    "llama4 layers": lambda: plan_file(llama4_without_chunks(), 128, tp=8, pp=2, ep=8, etp=1, global_batch=256,
                                       seq_len=8192),
}


def test_nemotron_h_export_is_megatrons_hybrid_model():
    pf = CASES["nemotron-h tp8 pp2"]()
    args = megatron_args(pf)
    assert flag(args, "--hybrid-override-pattern") == (
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-"
        "M-M-M-M-M*-M-M-M-M-M-")
    assert (flag(args, "--mamba-num-heads"), flag(args, "--mamba-head-dim"), flag(args, "--mamba-num-groups"),
            flag(args, "--mamba-state-dim")) == ("256", "64", "8", "256")
    assert flag(args, "--num-layers") == "118" and flag(args, "--position-embedding-type") == "none"
    assert "--is-hybrid-model" in args and "--squared-relu" in args and "--swiglu" not in args
    assert "--moe-layer-freq" not in args and "--rotary-base" not in args
    script = export(pf, "megatron")["launch_megatron.sh"]
    assert '"$MEGATRON_LM_DIR/pretrain_mamba.py"' in script and "pretrain_gpt.py" not in script
    assert "mamba_stack_spec" in script


def test_hybrid_uneven_split_is_first_and_last_stage_flags():
    args = megatron_args(CASES["nemotron-h tp4 cp2 uneven"]())
    assert flag(args, "--decoder-first-pipeline-num-layers") == "28"
    assert "--decoder-last-pipeline-num-layers" not in args and "--pipeline-model-parallel-layout" not in args


def test_qwen3_next_export():
    args = megatron_args(CASES["qwen3-next tp2 ep16"]())
    assert flag(args, "--experimental-attention-variant") == "gated_delta_net"
    assert flag(args, "--linear-attention-freq") == "([1,1,1,0]*12)"  # three DeltaNet layers, then attention
    assert (flag(args, "--linear-num-key-heads"), flag(args, "--linear-num-value-heads")) == ("16", "32")
    assert "--attention-output-gate" in args and "--qk-layernorm" in args and "--moe-shared-expert-gate" in args
    assert flag(args, "--rotary-percent") == "0.25" and flag(args, "--mtp-num-layers") == "1"
    assert flag(args, "--num-experts") == "512" and flag(args, "--moe-layer-freq") == "1"


def test_dsa_windows_sinks_nope_and_moe_frequency():
    args = megatron_args(CASES["deepseek-v3.2 ep32"]())
    assert flag(args, "--experimental-attention-variant") == "dsa" and "--no-rope-fusion" in args
    assert (flag(args, "--dsa-indexer-n-heads"), flag(args, "--dsa-indexer-head-dim"),
            flag(args, "--dsa-indexer-topk")) == ("64", "128", "2048")
    oss = megatron_args(CASES["gpt-oss layers"]())
    assert flag(oss, "--window-size") == "(127,0)" and flag(oss, "--window-attn-skip-freq") == "([1,0]*18)"
    assert flag(oss, "--softmax-type") == "learnable" and "--disable-bias-linear" not in oss  # every linear biased
    llama4 = megatron_args(CASES["llama4 layers"]())
    assert flag(llama4, "--no-rope-freq") == "([0,0,0,1]*12)" and flag(llama4, "--moe-layer-freq") == "([0,1]*24)"
    assert flag(llama4, "--ffn-hidden-size") == "16384" and flag(llama4, "--moe-ffn-hidden-size") == "8192"


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_rules_accept_every_case(name):
    pf = CASES[name]()
    assert megatron_violations(megatron_args(pf), pf.target.gpus) == []


@pytest.mark.parametrize("model,words", [
    ("kimi-linear-48b-a3b", "Kimi Delta Attention"), ("llama4-maverick-17b-128e", "chunked attention"),
    ("gpt-oss-120b", "YaRN"), ("kimi-k2", "betas 1.0/1.0")])
def test_models_megatron_cannot_build_are_refused_with_the_reason(model, words):
    pf = plan_file(model, 64, tp=8, ep=8, etp=1, global_batch=256, seq_len=8192)
    with pytest.raises(ExportError, match=words):
        megatron_args(pf)


def test_hybrid_refusals_in_search_and_export():
    """Interleaving and uneven middle stages are refused for the Mamba stack by the framework (the
    search skips them) and by Megatron's rules."""
    spec = load_model("nemotron-h-56b").spec
    plan = ParallelPlan(tp=8, pp=2, vpp=2, global_batch=256, seq_len=8192)
    assert any("interleaved" in r for r in plan_refusals(spec, 64, plan))
    uneven = ParallelPlan(tp=8, pp=4, global_batch=256, seq_len=8192, layers_per_stage=(30, 28, 30, 30))
    assert any("middle stages" in r for r in plan_refusals(spec, 128, uneven))
    assert not plan_refusals(load_model("llama3-8b").spec, 64, plan)
    with pytest.raises(ExportError, match="interleaved"):
        megatron_args(plan_file("nemotron-h-56b", 64, tp=8, pp=2, vpp=2, global_batch=256, seq_len=8192))
    base = megatron_args(CASES["nemotron-h tp8 pp2"]())
    bad_tp = [("16" if a == "8" and base[i - 1] == "--tensor-model-parallel-size" else a) for i, a in enumerate(base)]
    assert any("MambaMixer" in v for v in megatron_violations(bad_tp, 64))
    short = [("M-M" if base[i - 1] == "--hybrid-override-pattern" else a) for i, a in enumerate(base)]
    assert any("wrong length: got 3, expected 118" in v for v in megatron_violations(short, 64))


# ---- megatron-core itself ---------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_megatron_core_accepts_the_mixer_settings(name):
    """megatron-core's TransformerConfig (its __post_init__ checks: GDN heads, DSA and CP, no_rope_freq,
    moe_layer_freq lists) takes the exported values, and its hybrid allocation takes the pattern."""
    pytest.importorskip("megatron.core")
    from test_export_frameworks import transformer_config  # the config megatron/training builds from args

    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    pf = CASES[name]()
    a = parse_megatron_argv(megatron_args(pf))
    base = transformer_config(a)
    mixer = dict(is_hybrid_model=a["is_hybrid_model"], mamba_state_dim=a["mamba_state_dim"],
                 mamba_head_dim=a["mamba_head_dim"], mamba_num_groups=a["mamba_num_groups"],
                 mamba_num_heads=a["mamba_num_heads"], experimental_attention_variant=a["experimental_attention_variant"],
                 linear_attention_freq=a["linear_attention_freq"], linear_num_key_heads=a["linear_num_key_heads"],
                 linear_num_value_heads=a["linear_num_value_heads"], linear_key_head_dim=a["linear_key_head_dim"],
                 linear_value_head_dim=a["linear_value_head_dim"], linear_conv_kernel_dim=a["linear_conv_kernel_dim"],
                 dsa_indexer_n_heads=a["dsa_indexer_n_heads"], dsa_indexer_head_dim=a["dsa_indexer_head_dim"],
                 dsa_indexer_topk=a["dsa_indexer_topk"], window_attn_skip_freq=a["window_attn_skip_freq"],
                 no_rope_freq=a["no_rope_freq"], softmax_type=a["softmax_type"],
                 attention_output_gate=a["attention_output_gate"],
                 apply_rope_fusion=False)  # fused RoPE needs Transformer Engine; DSA's export turns it off
    assert a["experimental_attention_variant"] != "dsa" or a["apply_rope_fusion"] is False
    cls = MLATransformerConfig if isinstance(base, MLATransformerConfig) else TransformerConfig
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(cls) if f.init}
    config = cls(**{**fields, **mixer})
    assert config.experimental_attention_variant == a["experimental_attention_variant"]
    if a["no_rope_freq"] is not None:
        assert config.no_rope_freq == [int(c == "N") for c in pf.target.model_spec.layer_pattern]
    pattern = a["hybrid_override_pattern"]
    if pattern is not None:
        layers = allocate_layers(a["num_layers"], 0.0, 0.0, pattern)
        assert "".join(layers) == pattern and len(layers) == pf.target.model_spec.num_layers


# ---- DeepSpeed: through the Hugging Face model --------------------------------------------------

PRESETS_2026 = ("nemotron-h-56b", "qwen3-next-80b-a3b", "kimi-linear-48b-a3b", "gpt-oss-120b",
                "llama4-maverick-17b-128e", "kimi-k2", "deepseek-v3.2-exp")


@pytest.mark.parametrize("preset", PRESETS_2026)
def test_deepspeed_export_is_the_hugging_face_model_with_autopars_count(preset):
    """The exported config.json is read back into the same spec, and transformers builds from it (on
    the meta device) a model with exactly autopar's parameter count (the HF models carry no MTP)."""
    import json

    pf = plan_file(preset, 8, global_batch=8, seq_len=8192, framework="deepspeed", zero=3)
    files = export(pf, "deepspeed")
    cfg = json.loads(files["config.json"])
    g = load_model(preset)
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    body = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "_name_or_path")}
    config = transformers.CONFIG_MAPPING[cfg["model_type"]](**body)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == g.total_params - g.mtp_params


def test_torchtitan_refuses_layer_kinds_its_flavours_lack():
    """A Llama 3 8B shape (torchtitan's llama3 8B flavour) with a per-layer pattern or sinks is not
    what the flavour builds: refused with the kinds named."""
    from autopar.frameworks import model_refusals

    base = load_model("llama3-8b").spec
    assert model_refusals("torchtitan", base) == []
    patterned = base.model_copy(update=dict(ffn_pattern="D" * 31 + "-"))
    sinks = base.model_copy(update=dict(attention_sinks=True))
    assert any("layer_pattern / ffn_pattern" in r for r in model_refusals("torchtitan", patterned))
    assert any("attention sinks" in r for r in model_refusals("torchtitan", sinks))


@pytest.mark.parametrize("name", ["nemotron-h tp8 pp2", "qwen3-next tp2 ep16", "deepseek-v3.2 ep32", "gpt-oss layers",
                                  "llama4 layers"])
def test_megatron_arguments_read_back_into_the_same_model(name):
    """The importer reads the mixer flags back (the inverse of the export): the same layer kinds,
    sizes and parameter count."""
    from autopar.export.importers import model_from_megatron_args
    from autopar.model import build_graph

    pf = CASES[name]()
    spec = pf.target.model_spec
    back = model_from_megatron_args(megatron_args(pf), spec.name)
    for field in ("mamba", "linear_attention", "indexer", "attention_sinks", "attention_output_gate", "activation",
                  "sliding_window", "num_layers"):
        assert getattr(back, field) == getattr(spec, field), field
    layers = range(spec.num_layers)
    assert [back.mixer_of(i) for i in layers] == [spec.mixer_of(i) for i in layers]
    assert [back.ffn_of(i) for i in layers] == [spec.ffn_of(i) for i in layers]
    assert build_graph(back).total_params == build_graph(spec).total_params
