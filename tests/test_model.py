"""Model graph: parameter counts equal Hugging Face's, FLOPs and activations equal closed forms."""

from pathlib import Path

import pytest

from autopar.errors import InputFileError, SchemaError, UnknownModelError, UnsupportedModelError
from autopar.model import PRESET_NAMES, build_graph, load_model, load_spec

HF = Path(__file__).parent / "fixtures" / "hf"
EXAMPLES = Path(__file__).parent.parent / "examples"


def params_without_mtp(graph):
    return graph.total_params - graph.params_by_kind().get("mtp", 0)


# Totals as Hugging Face reports them (model.num_parameters(), model cards).
HF_TOTALS = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_630_071_296,
    "qwen3-30b-a3b": 30_532_122_624,
    "deepseek-v3": 671_026_404_352,  # without the MTP module, as HF's DeepseekV3ForCausalLM builds it
}


@pytest.mark.parametrize("name,total", HF_TOTALS.items())
def test_preset_params_equal_hugging_face(name, total):
    assert params_without_mtp(load_model(name)) == total


@pytest.mark.parametrize("fixture,total", [
    ("llama3-8b.json", 8_030_261_248),
    ("mixtral-8x7b.json", 46_702_792_704),
    ("qwen3-30b-a3b.json", 30_532_122_624),
    ("deepseek-v3.json", 671_026_404_352),
    ("gpt-neox-20b.json", 20_554_567_680),  # EleutherAI model card
    ("gpt2.json", 124_439_808),
    ("mistral-7b.json", 7_241_732_096),  # Mistral-7B-v0.1 model card
    ("qwen2-7b.json", 7_615_616_512),  # Qwen2-7B model card
    ("qwen3-8b.json", 8_190_735_360),  # Qwen3-8B model card
])
def test_hf_config_params_equal_hugging_face(fixture, total):
    assert params_without_mtp(load_model(str(HF / fixture))) == total


def test_deepseek_mtp_module_hand_count():
    # One MTP module: enorm + hnorm + final norm (3h), eh_proj (2h·h), one MoE decoder layer
    # (11,507,286,016 by hand: MLA 187,107,328 + norms 14,336 + 256 experts·3·7168·2048
    # + shared 3·7168·2048 + router 256·7168; the router bias is a buffer); embedding and head are shared.
    h = 7168
    assert load_model("deepseek-v3").params_by_kind()["mtp"] == 3 * h + 2 * h * h + 11_507_286_016


def test_active_params_mixtral():
    # 2 of 8 experts active: total minus 6/8 of expert weights (32 layers · 8 · 3·4096·14336).
    expert = 32 * 8 * 3 * 4096 * 14336
    assert load_model("mixtral-8x7b").active_params == 46_702_792_704 - expert * 6 // 8


def test_gpt3_activation_bytes_match_korthikanti():
    # Korthikanti et al. 2022 Eq. 1: sbh(34 + 5as/h) bytes per layer, i.e. 34h + 5as per token.
    g = load_model("gpt3-175b")
    h, a = 12288, 96
    for s in (1024, 2048, 4096):
        assert sum(g.layers[1].activation_bytes_per_token(s).values()) == 34 * h + 5 * a * s


def test_flops_per_token_closed_form_gpt3():
    # Narayanan'21 Eq. 3 counts 72·B·s·l·h²(1 + s/6h + V/12lh) model FLOPs (no recompute,
    # non-causal attention). Per token: 72·l·h²(1 + s/(6h) + V/(12·l·h)).
    g = load_model("gpt3-175b")
    l, h, s, v = 96, 12288, 2048, 51200
    expected = 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert g.model_flops_per_token(s, causal=False) == pytest.approx(expected, rel=1e-12)


def test_causal_attention_is_half():
    layer = load_model("llama3-8b").layers[1]
    # 2 matmuls (QK^T, AV) · 2 FLOPs · s · a · d per token, non-causal; causal counts half.
    assert layer.attention_flops_per_token(8192, causal=False) == 2 * 2 * 8192 * 32 * 128
    assert layer.attention_flops_per_token(8192) == 2 * 8192 * 32 * 128


def test_llama_flash_activations_by_tensor():
    # Per token at bf16, no dropout: norm inputs/outputs 4·2h, q 2·a·d, k and v 2·kv·d each,
    # context 2·a·d, fp32 LSE 4·a, SwiGLU fc1 output 2·2f, activation output 2f.
    h, a, kv, d, f = 4096, 32, 8, 128, 14336
    acts = load_model("llama3-8b").layers[1].activation_bytes_per_token(8192)
    assert acts["q"] == 2 * a * d and acts["k"] == 2 * kv * d and acts["softmax_lse"] == 4 * a
    assert sum(acts.values()) == 8 * h + 2 * a * d + 4 * kv * d + 2 * a * d + 4 * a + 4 * f + 2 * f


def test_tp_split_classification_llama():
    layer = load_model("llama3-8b").layers[1]
    assert layer.params_replicated == 2 * 4096  # two RMSNorms
    assert layer.params_tp == layer.params - 2 * 4096


def test_deepseek_layer_kinds():
    g = load_model("deepseek-v3")
    kinds = [layer.kind for layer in g.layers]
    assert kinds[0] == "embedding" and kinds[-1] == "head" and kinds[-2] == "mtp"
    assert kinds[1:4] == ["dense"] * 3 and kinds[4:62] == ["moe"] * 58


def test_every_preset_builds():
    for name in PRESET_NAMES:
        g = load_model(name)
        assert g.total_params > 0 and len(g.decoder_layers) == g.spec.num_layers


def test_yaml_example_builds_and_counts():
    g = load_model(str(EXAMPLES / "custom-decoder.yaml"))
    h, v = 2048, 65536
    attn = h * (16 + 2 * 4) * 128 + 16 * 128 * h
    dense = attn + 3 * h * 5632 + 2 * h
    moe = attn + 32 * 3 * h * 1024 + 3 * h * 2048 + 32 * h + 2 * h
    assert g.total_params == 2 * v * h + 2 * dense + 22 * moe + h


def test_unknown_preset_suggests_closest():
    with pytest.raises(UnknownModelError, match="llama3-8b"):
        load_spec("llama3-8")


def test_unsupported_model_type_lists_supported():
    with pytest.raises(UnsupportedModelError, match="supported: llama"):
        load_spec(str(HF / "bert.json"))


def test_missing_file():
    with pytest.raises(InputFileError, match="does not exist"):
        load_spec("/nonexistent/model.yaml")


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_layers: [1, 2\n")
    with pytest.raises(InputFileError, match="malformed YAML"):
        load_spec(str(bad))


def test_malformed_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputFileError, match="malformed JSON"):
        load_spec(str(bad))


def _write_yaml(tmp_path, **overrides):
    import yaml
    data = dict(name="m", num_layers=2, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512, vocab_size=1000)
    data.update(overrides)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_unknown_key_in_yaml(tmp_path):
    with pytest.raises(SchemaError, match="unknown key 'hiden_size'"):
        load_spec(_write_yaml(tmp_path, hiden_size=3))


def test_non_positive_size(tmp_path):
    with pytest.raises(SchemaError, match="num_layers"):
        load_spec(_write_yaml(tmp_path, num_layers=0))


def test_heads_must_divide_hidden(tmp_path):
    with pytest.raises(SchemaError, match="not divisible by num_attention_heads"):
        load_spec(_write_yaml(tmp_path, num_attention_heads=3))


def test_kv_heads_must_divide_heads(tmp_path):
    with pytest.raises(SchemaError, match="not divisible by num_kv_heads"):
        load_spec(_write_yaml(tmp_path, num_kv_heads=3))


def test_graph_is_deterministic():
    assert build_graph(load_spec("qwen3-30b-a3b")) == build_graph(load_spec("qwen3-30b-a3b"))
