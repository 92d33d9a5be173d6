"""Models of 2025-26 (issue 30): hybrid Mamba-2 / linear-attention stacks, windowed, chunked and
sparse attention, interleaved MoE and MTP, read from their published config.json files.

Every parameter count is derived here by hand from the config's shapes (the arithmetic is written
out) and equals the count of the Hugging Face implementation too: transformers 5.24's
*ForCausalLM built on the meta device from the same file gives the numbers in the comments
(sum of numel over named_parameters). The FLOP and memory terms are hand-worked from their
formulas (autopar.model.mixers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.model import load_model, load_spec
from autopar.model.graph import attended_keys_per_query
from autopar.model.mixers import (delta_rule_scan_flops_per_token, hybrid_pattern, split_hybrid_pattern,
                                  ssd_scan_flops_per_token)

HF = Path(__file__).parent / "fixtures" / "hf"
runner = CliRunner()


def graph(name: str):
    return load_model(str(HF / name))


def decoders(g, mixer: str | None = None, kind: str | None = None):
    return [x for x in g.decoder_layers if (mixer is None or x.mixer == mixer) and (kind is None or x.kind == kind)]


# ---- exact parameter counts, by hand ----------------------------------------------------------

def test_nemotron_h_56b_count():
    """118 one-block layers of hybrid_override_pattern: 54 Mamba-2 (M), 10 attention (*), 54
    squared-ReLU MLPs (-), each with its own RMSNorm (h)."""
    h, v = 8192, 131072
    pattern = json.loads((HF / "nemotron-h-56b.json").read_text())["hybrid_override_pattern"]
    n_m, n_a, n_d = pattern.count("M"), pattern.count("*"), pattern.count("-")
    assert (n_m, n_a, n_d) == (54, 10, 54)
    d_inner, groups_state, heads = 256 * 64, 8 * 256, 256
    conv_dim = d_inner + 2 * groups_state                               # x, B, C = 20480
    mamba = (h                                                          # pre-norm
             + h * (2 * d_inner + 2 * groups_state + heads)             # in_proj -> z, x, B, C, dt = 37120
             + conv_dim * 4 + conv_dim                                  # depthwise conv1d, with bias
             + 3 * heads                                                # dt_bias, A_log, D
             + d_inner                                                  # gated RMSNorm
             + d_inner * h)                                             # out_proj
    attention = h + h * 64 * 128 + 2 * h * 8 * 128 + 64 * 128 * h
    mlp = h + h * 32768 + 32768 * h                                     # relu2: up and down only
    total = v * h + n_m * mamba + n_a * attention + n_d * mlp + h + v * h
    g = graph("nemotron-h-56b.json")
    assert g.total_params == total == 56_324_350_464  # HF NemotronHForCausalLM: 56,324,350,464
    assert g.mtp_params == 0 and g.active_params == total
    assert abs(total / 56e9 - 1) < 0.01  # model card: 56B


def test_qwen3_next_80b_count_and_its_mtp_module():
    """36 Gated DeltaNet + 12 gated-attention layers (every 4th), all 512-expert MoE with a gated
    shared expert; the checkpoint's MTP layer (full attention + MoE, fc 2h -> h, three norms)."""
    h, v = 2048, 151936
    kd, vd, hv = 16 * 128, 32 * 128, 32
    gdn = (h + h * (2 * kd + 2 * vd) + h * 2 * hv                       # in_proj_qkvz, in_proj_ba
           + (2 * kd + vd) * 4 + 2 * hv + 128 + vd * h)                 # conv1d, dt_bias + A_log, norm, out_proj
    attention = h + h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256  # q doubled for the gate; q/k norm
    moe = h + 512 * h + 512 * 3 * h * 512 + 3 * h * 512 + h            # router, experts, shared, shared gate
    main = v * h + 36 * (gdn + moe) + 12 * (attention + moe) + h + v * h
    mtp = attention + moe + 2 * h * h + 3 * h
    g = graph("qwen3-next-80b-a3b.json")
    assert g.total_params - g.mtp_params == main == 79_674_391_296  # HF Qwen3NextForCausalLM (no MTP): 79,674,391,296
    assert g.mtp_params == mtp and g.total_params == main + mtp
    assert abs(main / 80e9 - 1) < 0.01  # model card: 80B total
    info = _inspect("qwen3-next-80b-a3b.json")
    assert info["mtp_params_included"] is True and info["mtp_params"] == mtp and "mtp" in info["mtp_source"]


def test_kimi_linear_48b_count():
    """20 KDA + 7 MLA layers (linear_attn_config, 1-based), first layer dense, 26 MoE layers."""
    h, v, hd, d = 2304, 163840, 32 * 128, 128
    kda = (h + 3 * h * hd                                               # q, k, v
           + 2 * (h * d + d * hd)                                       # forget gate f_a/f_b, output gate g_a/g_b
           + h * 32 + 3 * hd * 4                                        # b_proj, three short convs
           + 32 + hd + d + hd * h)                                      # A_log, dt_bias, o_norm, o_proj
    mla = h + h * 32 * 192 + h * (512 + 64) + 512 + 512 * 32 * (128 + 128) + 32 * 128 * h
    dense = h + 3 * h * 9216
    moe = h + 256 * h + 256 * 3 * h * 1024 + 3 * h * 1024
    total = v * h + 20 * kda + 7 * mla + dense + 26 * moe + h + v * h
    g = graph("kimi-linear-48b-a3b.json")
    assert g.total_params == total == 49_122_675_072  # HF KimiLinearForCausalLM: 49,122,675,072
    assert abs(total / 48e9 - 1) < 0.03  # model card: 48B total
    assert abs(g.active_params / 3e9 - 1) < 0.2  # model card: 3B active


def test_gpt_oss_120b_count():
    """36 layers alternating sliding (128) and full attention with biases and sinks; 128 experts
    with biased projections and a biased router."""
    h, v, e, w = 2880, 201088, 128, 2880
    attention = h + (h * 4096 + 4096) + 2 * (h * 512 + 512) + (4096 * h + h) + 64
    moe = h + (e * h + e) + e * (h * 2 * w + 2 * w + w * h + h)
    total = v * h + 36 * (attention + moe) + h + v * h
    g = graph("gpt-oss-120b.json")
    assert g.total_params == total == 116_829_156_672  # HF GptOssForCausalLM: 116,829,156,672
    assert round(total / 1e9, 1) == 116.8  # model card: 116.8B total
    # model card: 5.1B active; the card leaves out the input embedding
    assert round((g.active_params - v * h) / 1e9, 1) == 5.1


def test_llama4_maverick_count():
    """48 layers, MoE on every second (1, 3, ...) with one shared expert; dense layers 16384 wide."""
    h, v = 5120, 202048
    attention = h + h * 40 * 128 + 2 * h * 8 * 128 + 40 * 128 * h
    dense = h + 3 * h * 16384
    moe = h + 128 * h + 128 * 3 * h * 8192 + 3 * h * 8192
    total = v * h + 48 * attention + 24 * dense + 24 * moe + h + v * h
    g = graph("llama4-maverick.json")
    assert g.total_params == total == 400_711_848_960  # HF Llama4ForCausalLM (text): 400,711,848,960
    assert [x.kind for x in g.decoder_layers[:4]] == ["dense", "moe", "dense", "moe"]
    assert round(total / 1e9) == 401 and round(g.active_params / 1e9) == 17  # card: 400B total, 17B active
    assert graph("llama4-maverick-text.json").total_params == total


def test_kimi_k2_and_deepseek_v32_counts():
    """Kimi K2: DeepSeek-V3's architecture with 384 experts, 64 heads, one dense layer. DeepSeek-V3.2:
    V3 plus the lightning indexer on each of the 61 layers and the MTP module's."""
    h = 7168
    mla = h + h * 1536 + 1536 + 1536 * 64 * 192 + h * 576 + 512 + 512 * 64 * 256 + 64 * 128 * h
    dense = h + 3 * h * 18432
    moe = h + 384 * h + 384 * 3 * h * 2048 + 3 * h * 2048
    k2 = 163840 * h + 61 * mla + dense + 60 * moe + h + 163840 * h
    assert graph("kimi-k2-instruct-0905.json").total_params == k2 == 1_026_408_209_408  # HF DeepseekV3ForCausalLM
    assert round(graph("kimi-k2-instruct-0905.json").active_params / 1e9) == 33  # card: 32B activated
    indexer = 1536 * 64 * 128 + h * 128 + 2 * 128 + h * 64              # wq_b, wk, k_norm (w + b), weights_proj
    v3, v32 = graph("deepseek-v3.json"), graph("deepseek-v3.2-exp.json")
    assert v32.total_params - v3.total_params == 62 * indexer
    assert v32.total_params - v32.mtp_params == 671_877_929_216  # HF DeepseekV32ForCausalLM (no MTP)


@pytest.mark.parametrize("preset,fixture", [
    ("nemotron-h-56b", "nemotron-h-56b.json"), ("qwen3-next-80b-a3b", "qwen3-next-80b-a3b.json"),
    ("kimi-linear-48b-a3b", "kimi-linear-48b-a3b.json"), ("gpt-oss-120b", "gpt-oss-120b.json"),
    ("llama4-maverick-17b-128e", "llama4-maverick.json"), ("kimi-k2", "kimi-k2-instruct-0905.json"),
    ("deepseek-v3.2-exp", "deepseek-v3.2-exp.json")])
def test_presets_are_their_published_configs(preset, fixture):
    a, b = load_spec(preset), load_spec(str(HF / fixture))
    assert a.source and a.model_copy(update=dict(name=b.name, source=b.source)) == b
    assert load_model(preset).total_params == load_model(str(HF / fixture)).total_params


def test_every_shared_config_loads():
    """The published files in ../shared/models (Nemotron-H's has the JSON literal Infinity)."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "models"
    files = sorted(shared.glob("*.config.json")) if shared.is_dir() else []
    if not files:
        pytest.skip("../shared/models is not beside this checkout")
    assert len(files) == 5
    assert all(load_model(str(f)).total_params > 1e10 for f in files)


# ---- layer kinds: FLOPs and memory, hand-worked ----------------------------------------------

def test_mamba2_scan_flops_and_saved_bytes():
    """Nemotron-H: Q 128, N 256, G 8, P 64, H 256."""
    scan = ssd_scan_flops_per_token(256, 64, 256, 8, 128)
    assert scan == 2 * 128 * 256 * 8 + 2 * 128 * 64 * 256 + 4 * 256 * 64 * 256 + 2 * 256 * 64 * 256 / 128 == 21_561_344
    g = graph("nemotron-h-56b.json")
    m = decoders(g, "mamba2")[0]
    assert m.scan_flops_per_token == scan + 2 * 20480 * 4  # + the depthwise conv over x, B, C
    assert m.attention_flops_per_token(8192) == 0 and m.num_heads == 0
    assert m.matmul_flops_per_token == 2 * 8192 * 37120 + 2 * 16384 * 8192
    # saved per token: norm in/out 2h + 2h, zxBCdt 2·37120, conv 2·20480, dt + decay fp32 8·256, y and norm 2·2·16384
    assert sum(m.activation_bytes_per_token(8192).values()) == 4 * 8192 + 2 * 37120 + 2 * 20480 + 8 * 256 + 4 * 16384
    assert m.tp_blocks == 1 and decoders(g, "none")[0].tp_blocks == 1


def test_delta_rule_scan_flops():
    """Qwen3-Next's Gated DeltaNet: 32 value heads, dk = dv = 128, chunk 64."""
    per_head = 6 * 64 * 128 + 4 * 64 * 128 + 6 * 128 * 128 + 2 * 64 * 64 / 3
    assert delta_rule_scan_flops_per_token(32, 128, 128, 64) == pytest.approx(32 * per_head)
    g = graph("qwen3-next-80b-a3b.json")
    gdn = decoders(g, "gated_deltanet")[0]
    assert gdn.scan_flops_per_token == pytest.approx(32 * per_head + 2 * 8192 * 4)
    assert gdn.attention_flops_per_token(8192) == 0
    full = decoders(g, "attention")[0]
    assert full.attention_flops_per_token(8192) == 2 * 16 * (256 + 256) * 4096  # causal: s/2 keys
    assert gdn.cost_key != full.cost_key  # priced apart by the cost model


def test_sliding_window_and_sinks_of_gpt_oss():
    g = graph("gpt-oss-120b.json")
    sliding, full = g.decoder_layers[0], g.decoder_layers[1]
    assert (sliding.attention_window, full.attention_window) == (128, None)
    coef = 2 * 64 * (64 + 64)
    assert sliding.attention_flops_per_token(8192) == coef * (128 - 128 * 128 / (2 * 8192)) == coef * 127
    assert full.attention_flops_per_token(8192) == coef * 4096
    assert sliding.params == full.params  # the sinks (64 a layer) are on both kinds


def test_chunked_attention_and_nope_of_llama4():
    g = graph("llama4-maverick.json")
    chunked, nope = g.decoder_layers[0], g.decoder_layers[3]
    assert (chunked.attention_chunk, nope.attention_chunk) == (8192, None)
    # at s = 20000: two whole chunks of 8192 and one of 3616; a query sees its chunk's earlier keys
    assert attended_keys_per_query(20000, None, True, 8192) == (2 * 8192 ** 2 + 3616 ** 2) / (2 * 20000)
    assert chunked.attended_keys(20000) < nope.attended_keys(20000) == 10000
    assert chunked.attended_keys(8192) == nope.attended_keys(8192) == 4096  # one chunk = the sequence
    # NoPE: no rotary read/write of q and k (40 + 8 heads · 128 · 2 · 2 bytes)
    assert chunked.elementwise_bytes_per_token_tp - nope.elementwise_bytes_per_token_tp == 2 * 2 * 48 * 128


def test_dsa_indexer_flops():
    """DeepSeek-V3.2 at s = 8192: the main attention over top-2048 keys (query i sees min(i, 2048)),
    the indexer's 64 heads of 128 scoring every earlier key."""
    layer = graph("deepseek-v3.2-exp.json").decoder_layers[5]
    main = 2 * 128 * (192 + 128) * (2048 - 2048 ** 2 / (2 * 8192))
    indexer = (2 * 64 * 128 + 2 * 64) * 4096
    assert layer.attention_flops_per_token(8192) == main + indexer
    dense = graph("deepseek-v3.json").decoder_layers[5]
    assert dense.attention_flops_per_token(8192) == 2 * 128 * (192 + 128) * 4096


def test_hybrid_patterns_round_trip():
    pattern = "M-M*-E"
    layers, ffns = split_hybrid_pattern(pattern)
    assert (layers, ffns) == ("M-MN--", "-D--DE")
    assert hybrid_pattern(layers, ffns) == pattern
    assert hybrid_pattern("AA", "DE") is None  # a layer with both blocks is no hybrid-stack symbol


# ---- inspect --json and bad input -------------------------------------------------------------

def _inspect(name: str) -> dict:
    out = runner.invoke(app, ["inspect", str(HF / name), "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_inspect_json_reports_layers_by_mixer():
    info = _inspect("nemotron-h-56b.json")
    assert info["total_params"] == 56_324_350_464 and info["mtp_params_included"] is False
    assert info["mtp_params"] == 0 and info["layer_pattern"].count("M") == 54
    rows = {row["name"]: row for row in info["layers"]}
    assert {rows[k]["count"] for k in ("dense:M-", "dense:N-", "dense:-D")} == {54, 10}
    assert rows["dense:M-"]["mixer"] == "mamba2" and rows["dense:M-"]["forward_flops_per_token"]["scan"] > 0
    assert info["scan_flops_per_token"] == 3 * 54 * rows["dense:M-"]["forward_flops_per_token"]["scan"]


def _bad(tmp_path: Path, name: str, **changes) -> tuple[int, str]:
    cfg = json.loads((HF / name).read_text())
    cfg.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = runner.invoke(app, ["inspect", str(path)])
    return out.exit_code, out.stderr


@pytest.mark.parametrize("name,changes,words", [
    ("nemotron-h-56b.json", {"hybrid_override_pattern": "M-M*"}, ["hybrid_override_pattern", "4 letters", "118"]),
    ("nemotron-h-56b.json", {"hybrid_override_pattern": "M" * 117 + "X"}, ["'X'", "layer 117", "M * - E"]),
    ("qwen3-next-80b-a3b.json", {"full_attention_interval": 0}, ["full_attention_interval", "at least 1"]),
    ("llama4-maverick-text.json", {"interleave_moe_layer_step": 0}, ["interleave_moe_layer_step", "at least 1"]),
    ("gpt-oss-120b.json", {"sliding_window": 16384}, ["sliding_window (16384)", "seq_length (8192)", "full attention"]),
    # a hostile layer count is refused before an interval is expanded into a per-layer list
    ("qwen3-next-80b-a3b.json", {"num_hidden_layers": 10 ** 12}, ["num_hidden_layers", "from 1 to 4096"]),
    ("llama4-maverick-text.json", {"num_hidden_layers": 10 ** 12}, ["num_hidden_layers", "from 1 to 4096"]),
    ("kimi-linear-48b-a3b.json", {"num_hidden_layers": 10 ** 12}, ["num_hidden_layers", "from 1 to 4096"]),
    ("kimi-linear-48b-a3b.json", {"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 32,
                                                         "head_dim": 128}}, ["each of the 27 layers once"]),
])
def test_bad_hybrid_configs_are_one_line_exit_2(tmp_path, name, changes, words):
    code, err = _bad(tmp_path, name, **changes)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("changes,words", [
    ({"layer_pattern": "AAM"}, ["layer_pattern has 3 letters but num_layers is 2"]),
    ({"layer_pattern": "AZ"}, ["layer_pattern letter 'Z'", "layer 1"]),
    ({"layer_pattern": "AM"}, ["needs mamba"]),
    ({"ffn_pattern": "D-", "layer_pattern": "A-"}, ["layer 1 has neither a mixer nor a feed-forward"]),
    ({"layer_pattern": "WA", "sliding_window": 4096}, ["sliding_window (4096) is larger than seq_length (2048)"]),
])
def test_bad_yaml_patterns_are_one_line_exit_2(tmp_path, changes, words):
    spec = {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "ffn_hidden_size": 512,
            "vocab_size": 1000, "seq_length": 2048, **changes}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    out = runner.invoke(app, ["inspect", str(path)])
    assert out.exit_code == 2 and out.stderr.count("\n") == 1, out.stderr
    assert all(w in out.stderr for w in words), out.stderr


def test_a_plan_shorter_than_the_window_is_refused():
    """Chunks of 8192 (Llama 4) at a 4096-token sequence are full attention: the plan is refused in
    one line naming both; the same plan at 8192 is valid."""
    from autopar.schema.plan import ParallelPlan, plan_violations

    spec = load_spec("llama4-maverick-17b-128e")
    counts = spec.mixer_counts()
    assert counts["max_window"] == 8192 and load_spec("gpt-oss-120b").mixer_counts()["max_window"] == 128
    kwargs = dict(num_gpus=8, num_layers=48, num_heads=40, num_kv_heads=8, num_experts=128, **counts)
    short = plan_violations(ParallelPlan(tp=8, global_batch=8, seq_len=4096), **kwargs)
    assert [v for v in short if "4096 is shorter than the model's 8192-token" in v]
    assert not [v for v in plan_violations(ParallelPlan(tp=8, global_batch=8, seq_len=8192), **kwargs)
                if "window" in v]
    out = runner.invoke(app, ["estimate", "llama4-maverick-17b-128e", "-c", "dgx-h100", "-n", "8", "--seq-len",
                              "4096", "--global-batch", "8", "--tp", "8", "--ep", "8"])
    assert out.exit_code == 2 and "8192-token attention window" in out.stderr and out.stderr.count("\n") == 1
