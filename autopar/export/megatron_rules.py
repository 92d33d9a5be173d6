"""Megatron-LM's own argument checks, re-implemented over an argument list, so that `export`
refuses what `pretrain_gpt.py` would refuse and `import` reads what it would accept.

Sources (read, not copied): Megatron-LM megatron/training/arguments.py (`validate_args`, the
`_add_*_args` flag tables), megatron-core 0.16 transformer_config.py and model_parallel_config.py
(`__post_init__`), transformer/pipeline_parallel_layer_layout.py (the layout grammar),
transformer/transformer_block.py (`get_num_layers_to_build`), parallel_state.py
(`initialize_model_parallel`), num_microbatches_calculator.py and pipeline_parallel/schedules.py
(interleaved micro-batch groups). Each violation quotes Megatron's reason, then autopar's fix.

Only the flags that autopar writes or reads are modelled; every other flag is skipped with its
values, so a hand-written launch script still parses.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from autopar.errors import InputFileError


@dataclass(frozen=True, slots=True)
class _Flag:
    dest: str
    kind: str  # int | float | str | true | false | list | floats | tuple | freq
    default: Any = None


def _table() -> dict[str, _Flag]:
    ints = {
        "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
        "--num-attention-heads": "num_attention_heads", "--kv-channels": "kv_channels",
        "--vocab-size": "vocab_size", "--seq-length": "seq_length",
        "--max-position-embeddings": "max_position_embeddings", "--num-experts": "num_experts",
        "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
        "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
        "--q-lora-rank": "q_lora_rank", "--mtp-num-layers": "mtp_num_layers",
        "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
        "--num-virtual-stages-per-pipeline-rank": "num_virtual_stages_per_pipeline_rank",
        "--num-layers-per-virtual-pipeline-stage": "num_layers_per_virtual_pipeline_stage",
        "--decoder-first-pipeline-num-layers": "decoder_first_pipeline_num_layers",
        "--decoder-last-pipeline-num-layers": "decoder_last_pipeline_num_layers",
        "--recompute-num-layers": "recompute_num_layers", "--micro-batch-size": "micro_batch_size",
        "--global-batch-size": "global_batch_size",
    }
    out = {flag: _Flag(dest, "int") for flag, dest in ints.items()}
    out |= {
        "--num-query-groups": _Flag("num_query_groups", "int", 1),
        "--moe-router-topk": _Flag("moe_router_topk", "int", 2),
        "--kv-lora-rank": _Flag("kv_lora_rank", "int", 32),
        "--qk-head-dim": _Flag("qk_head_dim", "int", 128),
        "--qk-pos-emb-head-dim": _Flag("qk_pos_emb_head_dim", "int", 64),
        "--v-head-dim": _Flag("v_head_dim", "int", 128),
        "--tensor-model-parallel-size": _Flag("tensor_model_parallel_size", "int", 1),
        "--pipeline-model-parallel-size": _Flag("pipeline_model_parallel_size", "int", 1),
        "--context-parallel-size": _Flag("context_parallel_size", "int", 1),
        "--expert-model-parallel-size": _Flag("expert_model_parallel_size", "int", 1),
        "--num-distributed-optimizer-instances": _Flag("num_distributed_optimizer_instances", "int", 1),
        "--attention-dropout": _Flag("attention_dropout", "float", 0.1),
        "--hidden-dropout": _Flag("hidden_dropout", "float", 0.1),
        "--normalization": _Flag("normalization", "str", "LayerNorm"),
        "--position-embedding-type": _Flag("position_embedding_type", "str", "learned_absolute"),
        "--moe-router-score-function": _Flag("moe_router_score_function", "str", "softmax"),
        "--pipeline-model-parallel-layout": _Flag("pipeline_model_parallel_layout", "str"),
        "--recompute-granularity": _Flag("recompute_granularity", "str"),
        "--recompute-method": _Flag("recompute_method", "str"),
        "--fp8-format": _Flag("fp8", "str"),
        "--fp8-recipe": _Flag("fp8_recipe", "str", "delayed"),
        "--fp4-format": _Flag("fp4", "str"),
        "--fp4-recipe": _Flag("fp4_recipe", "str", "nvfp4"),
        "--moe-token-dispatcher-type": _Flag("moe_token_dispatcher_type", "str", "allgather"),
        "--moe-flex-dispatcher-backend": _Flag("moe_flex_dispatcher_backend", "str", "deepep"),
        "--attention-backend": _Flag("attention_backend", "str", "auto"),
        "--moe-expert-capacity-factor": _Flag("moe_expert_capacity_factor", "float"),
        "--norm-epsilon": _Flag("layernorm_epsilon", "float", 1e-5),
        "--rotary-base": _Flag("rotary_base", "int", 10000),
        "--rotary-percent": _Flag("rotary_percent", "float", 1.0),
        "--rope-scaling-factor": _Flag("rope_scaling_factor", "float", 8.0),
        "--rope-type": _Flag("rope_type", "str"),
        "--rotary-scaling-factor": _Flag("rotary_scaling_factor", "float", 1.0),
        "--mscale": _Flag("mscale", "float", 1.0),
        "--mscale-all-dim": _Flag("mscale_all_dim", "float", 0.0),
        "--window-size": _Flag("window_size", "tuple"),
        "--moe-router-num-groups": _Flag("moe_router_num_groups", "int"),
        "--moe-router-group-topk": _Flag("moe_router_group_topk", "int"),
        "--moe-router-topk-scaling-factor": _Flag("moe_router_topk_scaling_factor", "float"),
        "--moe-router-dtype": _Flag("moe_router_dtype", "str"),
        "--moe-router-load-balancing-type": _Flag("moe_router_load_balancing_type", "list", ["aux_loss"]),
        "--moe-aux-loss-coeff": _Flag("moe_aux_loss_coeff", "floats", [0.0]),
        "--data-parallel-sharding-strategy": _Flag("data_parallel_sharding_strategy", "str", "no_shard"),
        "--ckpt-format": _Flag("ckpt_format", "str", "torch_dist"),
        "--no-gradient-accumulation-fusion": _Flag("gradient_accumulation_fusion", "false", True),
        "--cp-comm-type": _Flag("cp_comm_type", "list", ["p2p"]),
        "--hierarchical-context-parallel-sizes": _Flag("hierarchical_context_parallel_sizes", "list"),
        "--moe-layer-freq": _Flag("moe_layer_freq", "freq", 1),
        "--recompute-modules": _Flag("recompute_modules", "list"),
        "--disable-bias-linear": _Flag("add_bias_linear", "false", True),
        # layer kinds beyond attention + MLP (TransformerConfig fields, issue 30)
        "--hybrid-override-pattern": _Flag("hybrid_override_pattern", "str"),
        "--mamba-state-dim": _Flag("mamba_state_dim", "int", 128),
        "--mamba-head-dim": _Flag("mamba_head_dim", "int", 64),
        "--mamba-num-groups": _Flag("mamba_num_groups", "int", 8),
        "--mamba-num-heads": _Flag("mamba_num_heads", "int"),
        "--experimental-attention-variant": _Flag("experimental_attention_variant", "str"),
        "--linear-attention-freq": _Flag("linear_attention_freq", "freq"),
        "--linear-num-key-heads": _Flag("linear_num_key_heads", "int", 16),
        "--linear-num-value-heads": _Flag("linear_num_value_heads", "int", 32),
        "--linear-key-head-dim": _Flag("linear_key_head_dim", "int", 128),
        "--linear-value-head-dim": _Flag("linear_value_head_dim", "int", 128),
        "--linear-conv-kernel-dim": _Flag("linear_conv_kernel_dim", "int", 4),
        "--dsa-indexer-n-heads": _Flag("dsa_indexer_n_heads", "int"),
        "--dsa-indexer-head-dim": _Flag("dsa_indexer_head_dim", "int"),
        "--dsa-indexer-topk": _Flag("dsa_indexer_topk", "int"),
        "--window-attn-skip-freq": _Flag("window_attn_skip_freq", "freq"),
        "--no-rope-freq": _Flag("no_rope_freq", "freq"),
        "--softmax-type": _Flag("softmax_type", "str", "vanilla"),
        "--no-rope-fusion": _Flag("apply_rope_fusion", "false", True),
        "--no-overlap-p2p-communication": _Flag("overlap_p2p_comm", "false", True),
    }
    for flag in ("--group-query-attention", "--swiglu", "--squared-relu", "--quick-geglu",
                 "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights", "--add-qkv-bias",
                 "--qk-layernorm", "--moe-shared-expert-gate", "--moe-grouped-gemm", "--moe-router-pre-softmax",
                 "--moe-pad-expert-input-to-capacity", "--moe-shared-expert-overlap", "--moe-enable-deepep",
                 "--multi-latent-attention", "--sequence-parallel", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--use-distributed-optimizer", "--use-torch-fsdp2",
                 "--use-megatron-fsdp", "--recompute-activations", "--distribute-saved-activations",
                 "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--bf16", "--fp16",
                 "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
                 "--use-legacy-models", "--use-rope-scaling", "--moe-router-enable-expert-bias",
                 "--is-hybrid-model", "--attention-output-gate"):
        out[flag] = _Flag(flag[2:].replace("-", "_"), "true", False)
    return out


MEGATRON_FLAGS: dict[str, _Flag] = _table()
_DEST_TO_FLAG = {f.dest: flag for flag, f in reversed(list(MEGATRON_FLAGS.items()))}


def flag_of(dest: str) -> str:
    """The command-line flag of an argument (its first spelling in the table)."""
    return _DEST_TO_FLAG.get(dest, "--" + dest.replace("_", "-"))


def parse_megatron_argv(argv: Sequence[str]) -> dict[str, Any]:
    """Megatron's namespace (dest -> value, defaults filled) for the flags autopar models.

    `--flag=value` and `--flag value` both work; unknown flags are skipped with their values and
    listed in `unknown` (in order, once each); `given` holds the dests that appeared. A malformed
    value raises InputFileError."""
    ns: dict[str, Any] = {f.dest: f.default for f in MEGATRON_FLAGS.values()}
    given: set[str] = set()
    unknown: dict[str, None] = {}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            continue
        name, eq, inline = tok.partition("=")
        values = [inline] if eq else []
        flag = MEGATRON_FLAGS.get(name)
        if flag is None or flag.kind not in ("true", "false"):
            while not eq and i < len(tokens) and not tokens[i].startswith("--"):
                values.append(tokens[i])
                i += 1
        if flag is None:
            unknown[name] = None
            continue
        ns[flag.dest] = _convert(name, flag, values)
        given.add(flag.dest)
    ns["given"] = given
    ns["unknown"] = list(unknown)
    return ns


def _convert(name: str, flag: _Flag, values: list[str]) -> Any:
    if flag.kind == "true":
        return True
    if flag.kind == "false":
        return False
    if flag.kind == "list":
        return values
    if flag.kind == "floats":
        try:
            return [float(v) for v in values]
        except ValueError as exc:
            raise InputFileError(f"Megatron flag {name} has a malformed value {values} ({exc}); fix the launch arguments")
    if len(values) != 1:
        raise InputFileError(f"Megatron flag {name} takes one value, got {values or 'none'}; fix the launch arguments")
    raw = values[0]
    try:
        if flag.kind == "int":
            return int(raw)
        if flag.kind == "float":
            return float(raw)
        if flag.kind == "freq":
            return int(raw) if "[" not in raw else parse_int_pattern(raw)
        if flag.kind == "tuple":  # arguments.py tuple_type: "(1,2)" or "1,2"
            return tuple(int(x) for x in raw.strip("()").split(","))
    except ValueError as exc:
        raise InputFileError(f"Megatron flag {name} has a malformed value {raw!r} ({exc}); fix the launch arguments")
    return raw


# ---- list patterns ("([0]*3+[1]*58)"), as Megatron's --moe-layer-freq accepts them -------------

_PATTERN_TOKEN = re.compile(r"\s*(\d+|[\[\](),+*])")


def parse_int_pattern(text: str) -> list[int]:
    """Evaluate Megatron's list-expression subset (ints, [..], +, *, parentheses) without eval."""
    tokens = [m.group(1) for m in _PATTERN_TOKEN.finditer(text)]
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ValueError(f"only digits, commas, [ ] ( ) + * are allowed in {text!r}")
    value, pos = _pattern_sum(tokens, 0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in {text!r}")
    return value


def _pattern_sum(tokens: list[str], pos: int) -> tuple[list[int], int]:
    value, pos = _pattern_product(tokens, pos)
    while pos < len(tokens) and tokens[pos] == "+":
        more, pos = _pattern_product(tokens, pos + 1)
        value = value + more
    return value, pos


def _pattern_product(tokens: list[str], pos: int) -> tuple[list[int], int]:
    value, pos = _pattern_atom(tokens, pos)
    while pos < len(tokens) and tokens[pos] == "*":
        if pos + 1 >= len(tokens) or not tokens[pos + 1].isdigit():
            raise ValueError("'*' must be followed by a count")
        if len(tokens[pos + 1]) > 7 or len(value) * int(tokens[pos + 1]) > MAX_LAYOUT_CHARS:
            raise ValueError(f"'* {tokens[pos + 1][:12]}' makes a list of more than {MAX_LAYOUT_CHARS:,} items")
        value, pos = value * int(tokens[pos + 1]), pos + 2
    return value, pos


def _pattern_atom(tokens: list[str], pos: int) -> tuple[list[int], int]:
    if pos >= len(tokens):
        raise ValueError("the expression ends early")
    if tokens[pos] == "(":
        value, pos = _pattern_sum(tokens, pos + 1)
        if pos >= len(tokens) or tokens[pos] != ")":
            raise ValueError("unbalanced '('")
        return value, pos + 1
    if tokens[pos] == "[":
        items, pos = [], pos + 1
        while pos < len(tokens) and tokens[pos] != "]":
            if tokens[pos] != ",":
                if not tokens[pos].isdigit():
                    raise ValueError(f"list items must be integers, got {tokens[pos]!r}")
                items.append(int(tokens[pos]))
            pos += 1
        if pos >= len(tokens):
            raise ValueError("unbalanced '['")
        return items, pos + 1
    raise ValueError(f"unexpected {tokens[pos]!r}")


# ---- --pipeline-model-parallel-layout: "E|(tt|)*29,m|L" -------------------------------------

LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


MAX_LAYOUT_CHARS = 1 << 20  # a layout longer than this (2^20 layers and stages) is no model's


def _repeat(unit: str, count: str) -> int:
    """A layout repetition count, refused (ValueError) when it would spell more than MAX_LAYOUT_CHARS."""
    if len(count) > 7 or len(unit) * int(count) > MAX_LAYOUT_CHARS:
        raise ValueError(f"'{unit}*{count[:12]}' spells more than {MAX_LAYOUT_CHARS:,} layers and stages")
    return int(count)


def parse_layout(layout: str) -> list[str]:
    """The layout's stages in execution order (index = vpp_rank · pp + pp_rank), each a string of
    E/L/t/m. Grammar: '|' separates stages, 'x*n' repeats one character, '(..)*n' repeats a group
    (not nested), commas are cosmetic. Raises ValueError naming the bad character."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^()]+)\)\*(\d+)", lambda m: m.group(1) * _repeat(m.group(1), m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * _repeat(m.group(1), m.group(2)), text)
    stages = text.split("|")
    for stage in stages:
        bad = [c for c in stage if c not in LAYOUT_CHARS]
        if bad:
            raise ValueError(f"invalid layer character {bad[0]!r} in stage {stage!r}; known: E, L, t, m")
    return stages


def format_layout(stages: Sequence[str]) -> str:
    """A layout string for `stages`: runs of one character become 'x*n', runs of equal stages
    '(..|)*n'. parse_layout(format_layout(s)) == s."""
    def compress(stage: str) -> str:
        return "".join(f"{m.group(1)}*{len(m.group(0))}" if len(m.group(0)) > 2 else m.group(0)
                       for m in re.finditer(r"(.)\1*", stage))

    groups = [(stage, len(list(run))) for stage, run in itertools.groupby(stages)]
    parts = []
    for index, (stage, count) in enumerate(groups):
        text = compress(stage)
        last = index == len(groups) - 1
        repeat = count - 1 if last else count
        if repeat > 1:
            parts.append(f"({text}|)*{repeat}")
        elif repeat == 1:
            parts.append(f"{text}|")
        if last:
            parts.append(text)
    return "".join(parts)


# ---- the rules ---------------------------------------------------------------------------------

def _vpp_size(a: Mapping[str, Any]) -> int | None:
    """Megatron's virtual_pipeline_model_parallel_size (None = not interleaved)."""
    pp = a["pipeline_model_parallel_size"]
    if a["pipeline_model_parallel_layout"] is not None:
        try:
            n = len(parse_layout(a["pipeline_model_parallel_layout"]))
        except ValueError:
            return None
        return n // pp if n % pp == 0 and n // pp > 1 else None
    if a["num_virtual_stages_per_pipeline_rank"] is not None:
        v = a["num_virtual_stages_per_pipeline_rank"]
        return v if v > 1 else None
    if a["num_layers_per_virtual_pipeline_stage"] is not None and a["num_layers"]:
        per_rank = a["num_layers"] // pp
        v = per_rank // a["num_layers_per_virtual_pipeline_stage"]
        return v if v > 1 else None
    return None


def _world(a: Mapping[str, Any], world_size: int) -> list[str]:
    tp, pp, cp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"], a["context_parallel_size"]
    mp = tp * pp * cp
    if world_size % mp:
        return [f"Megatron: 'world size ({world_size}) is not divisible by total_model_size ({mp})' "
                f"(tp·pp·cp = {tp}·{pp}·{cp}); pick degrees whose product divides the GPU count"]
    out = []
    etp = a["expert_tensor_parallel_size"] or tp
    emp = etp * a["expert_model_parallel_size"] * pp
    if world_size % emp:
        out.append(f"Megatron: 'world_size ({world_size}) is not divisible by expert_tensor_model_pipeline_parallel "
                   f"size ({emp})' (etp·ep·pp = {etp}·{a['expert_model_parallel_size']}·{pp}); change ep or etp")
    dp_cp = world_size // mp * cp
    inst = a["num_distributed_optimizer_instances"]
    if dp_cp % inst:
        out.append(f"Megatron: 'Data parallel size should be divisible by partial DistOpt shard factor' "
                   f"(dp·cp = {dp_cp}, --num-distributed-optimizer-instances {inst}); pick a zero shard size "
                   "dividing dp")
    return out


def _pipeline(a: Mapping[str, Any]) -> list[str]:
    out = []
    pp, layers = a["pipeline_model_parallel_size"], a["num_layers"]
    chosen = [f for f in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                          "pipeline_model_parallel_layout") if a[f] is not None]
    if len(chosen) > 1:
        out.append("Megatron: 'No more than one of the following arguments can be set at the same time: "
                   "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, "
                   "--pipeline-model-parallel-layout'; keep one")
    if a["pipeline_model_parallel_layout"] is not None:
        return out + _layout(a)
    first, last = a["decoder_first_pipeline_num_layers"], a["decoder_last_pipeline_num_layers"]
    vpp = _vpp_size(a)
    k = a["num_layers_per_virtual_pipeline_stage"]
    if k is not None and layers and pp > 1:  # arguments.py validate_args (Megatron-LM core_v0.14+)
        middle = layers - (first or 0) - (last or 0)
        ranks = pp - (first is not None) - (last is not None)
        per_stage = middle // ranks if ranks else 0
        if ranks and (middle % ranks or per_stage % k):
            out.append(f"Megatron: 'number of layers per pipeline stage must be divisible number of layers per "
                       f"virtual pipeline stage' ({per_stage} layers per stage, --num-layers-per-virtual-pipeline-"
                       f"stage {k}); use a divisor of {per_stage}")
    if first is not None or last is not None:
        return out + _uneven_first_last(a, vpp)
    if layers is None:
        return out
    if layers % pp:
        out.append(f"Megatron: 'Number of layers should be divisible by the pipeline-model-parallel size' "
                   f"({layers} layers, pp {pp}); use an even split or a --pipeline-model-parallel-layout")
    elif vpp and (layers // pp) % vpp:
        out.append(f"Megatron: 'num_layers_per_pipeline_rank {layers // pp} should be divisible by vp_size {vpp}'; "
                   "change vpp or give layers_per_stage (a pipeline layout)")
    return out


def _uneven_first_last(a: Mapping[str, Any], vpp: int | None) -> list[str]:
    out = []
    layers, stages = a["num_layers"], a["pipeline_model_parallel_size"]
    for key, where in (("decoder_first_pipeline_num_layers", "first"), ("decoder_last_pipeline_num_layers", "last")):
        n = a[key]
        if n is None:
            continue
        if n <= 0:
            out.append(f"Megatron: 'num_layers_in_{where}_pipeline_stage must be larger than 0'; give at least 1 layer")
        if vpp and n % vpp:
            out.append(f"Megatron: 'number of layers at {where} stage: {n} must be divisible by virtual pipeline "
                       f"parallel degree {vpp}'; fix the split")
        layers -= n
        stages -= 1
    if bool(layers) != bool(stages):
        out.append(f"Megatron: 'Mismatch: {layers} middle layers remaining but {stages} middle PP stages available'")
    elif stages and layers % stages:
        out.append(f"Megatron: 'number of layers at middle stage: {layers} must be divisible by the middle pipeline "
                   f"model parallel size {stages}'")
    elif stages and vpp and (layers // stages) % vpp:
        out.append(f"Megatron: 'number of layers on each middle pipeline rank: {layers // stages} must be divisible "
                   f"by virtual pipeline parallel degree {vpp}'")
    return out


def _layout(a: Mapping[str, Any]) -> list[str]:
    """PipelineParallelLayerLayout's parse and validate_layer_layout."""
    pp, text = a["pipeline_model_parallel_size"], a["pipeline_model_parallel_layout"]
    try:
        stages = parse_layout(text)
    except ValueError as exc:
        return [f"Megatron: pipeline layout {text!r}: {exc}; fix the layout string"]
    if len(stages) % pp:
        return [f"Megatron: 'The length of pipeline_model_parallel_layout must be divisible by "
                f"pipeline_model_parallel_size' ({len(stages)} stages, pp {pp})"]
    if any(a[k] is not None for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")) or \
            a["account_for_embedding_in_pipeline_split"] or a["account_for_loss_in_pipeline_split"]:
        return ["Megatron: 'pipeline_model_parallel_layout cannot be set with other pipeline layout arguments'; "
                "drop --decoder-first/last-pipeline-num-layers and --account-for-*"]
    flat = "".join(stages)
    out = []
    if not flat.startswith("E") or flat.count("E") != 1:
        out.append("Megatron: 'The first layer must be embedding' and 'Embedding must be specified exactly once'; "
                   "start the layout with one E")
    if not flat.endswith("L") or flat.count("L") != 1:
        out.append("Megatron: 'The last layer must be loss' and 'Loss must be specified exactly once'; "
                   "end it with one L")
    if a["num_layers"] is not None and flat.count("t") != a["num_layers"]:
        out.append(f"Megatron: 'Number of decoder layers {flat.count('t')} must match num_layers {a['num_layers']}'")
    mtp = a["mtp_num_layers"] or 0
    if flat.count("m") != mtp:
        out.append(f"Megatron: 'Number of mtp layers in layout must match mtp_num_layers' "
                   f"({flat.count('m')} in the layout, --mtp-num-layers {mtp})")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        out.append("Megatron: 'decoder layers must be placed before MTP layers'")
    vpp = len(stages) // pp
    if any("m" in stages[v * pp + r] for r in range(pp) for v in range(vpp - 1)):
        out.append("Megatron: 'Currently we restrict that the MTP should be always in the last virtual pipeline "
                   "stage of that rank'")
    return out


def _interleaving(a: Mapping[str, Any], world_size: int) -> list[str]:
    vpp = _vpp_size(a)
    pp = a["pipeline_model_parallel_size"]
    if not vpp:
        return []
    out = []
    if not a["overlap_p2p_comm"] and pp <= 2:
        out.append("Megatron: 'When interleaved schedule is used and p2p communication overlap is disabled, "
                   "pipeline-model-parallel size should be greater than 2'; drop --no-overlap-p2p-communication")
    if pp == 1:
        out.append("Megatron: 'pipeline-model-parallel size should be greater than 1 with interleaved schedule'")
    m = _num_microbatches(a, world_size)
    if m is not None and (m < pp or m % pp):
        out.append(f"Megatron: 'The number of contiguous micro-batches in a virtual pipeline stage should range in "
                   f"[PP={pp}, M={m}]' and the remainder of M by PP must be 0 (interleaving needs the "
                   f"{m} micro-batches to be a multiple of pp {pp}); change the global batch or use vpp 1")
    return out


def _num_microbatches(a: Mapping[str, Any], world_size: int) -> int | None:
    mp = a["tensor_model_parallel_size"] * a["pipeline_model_parallel_size"] * a["context_parallel_size"]
    mbs, gbs = a["micro_batch_size"], a["global_batch_size"]
    if world_size % mp or not mbs:
        return None
    dp = world_size // mp
    gbs = gbs or mbs * dp
    return gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else None


def _batch(a: Mapping[str, Any], world_size: int) -> list[str]:
    mp = a["tensor_model_parallel_size"] * a["pipeline_model_parallel_size"] * a["context_parallel_size"]
    mbs, gbs = a["micro_batch_size"], a["global_batch_size"]
    if mbs is None:
        return ["Megatron: '--micro-batch-size' is required (assert args.micro_batch_size is not None)"]
    if world_size % mp or gbs is None:
        return []
    dp = world_size // mp
    if gbs % (mbs * dp):
        return [f"Megatron: 'global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times data "
                f"parallel size ({dp})'; change the global batch, the micro batch or the degrees"]
    return []


def _sequence(a: Mapping[str, Any]) -> list[str]:
    out = []
    cp, seq = a["context_parallel_size"], a["seq_length"]
    types = a["cp_comm_type"] or ["p2p"]
    bad = sorted(set(types) - {"p2p", "a2a", "all_gather", "a2a+p2p"})
    if bad:
        out.append(f"Megatron: --cp-comm-type {bad} is not one of p2p, a2a, all_gather, a2a+p2p (the values "
                   "Transformer Engine's context-parallel attention takes)")
    if "a2a+p2p" in types and a["hierarchical_context_parallel_sizes"] is None:
        out.append("Megatron: '--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm'")
    if seq is not None and cp > 1 and seq % (2 * cp):
        out.append(f"Megatron: 'seq-length should be a multiple of 2 * context-parallel-size if "
                   f"context-parallel-size > 1' ({seq} % {2 * cp} != 0); change cp or the sequence length")
    if a["max_position_embeddings"] is None:
        out.append("Megatron: 'max_position_embeddings argument is None'; give --max-position-embeddings")
    elif seq is not None and a["max_position_embeddings"] < seq:
        out.append(f"Megatron: 'max_position_embeddings ({a['max_position_embeddings']}) must be greater than or "
                   f"equal to seq_length ({seq})'; a learned position table cannot train longer sequences")
    return out


def _overlap(a: Mapping[str, Any]) -> list[str]:
    out = []
    if a["overlap_param_gather"]:
        if not (a["use_distributed_optimizer"] or a["use_megatron_fsdp"]):
            out.append("Megatron: '--overlap-param-gather only supported with distributed optimizer or megatron "
                       "fsdp'; set zero 1 or turn overlap_param_gather off")
        if not a["overlap_grad_reduce"]:
            out.append("Megatron: 'Must use --overlap-param-gather with --overlap-grad-reduce'; turn "
                       "overlap_grad_reduce on or overlap_param_gather off")
    sp = a["sequence_parallel"] and a["tensor_model_parallel_size"] > 1
    if a["tp_comm_overlap"] and not sp:
        out.append("Megatron: 'Tensor parallel communication/GEMM overlap can happen only when sequence "
                   "parallelism is enabled' (sequence parallelism is off or dropped at tp 1); enable sp with tp > 1")
    if a["bf16"] and a["fp16"]:
        out.append("Megatron: 'Only one of fp16 and bf16 should be True'")
    return out


def _recompute(a: Mapping[str, Any]) -> list[str]:
    out = []
    gran, method, k = a["recompute_granularity"], a["recompute_method"], a["recompute_num_layers"]
    if a["recompute_activations"]:
        gran = "selective"
    if gran is not None and gran not in ("full", "selective"):
        out.append(f"Megatron: recompute granularity {gran!r} must be 'full' or 'selective'")
    if method is not None and method not in ("block", "uniform"):
        out.append(f"Megatron: 'recompute_method: {method} must be \"block\" or \"uniform\"'")
    if gran == "selective":
        if method is not None:
            out.append("Megatron: 'recompute method is not yet supported for selective recomputing granularity'; "
                       "drop --recompute-method")
        if k is not None:
            out.append("Megatron: 'When using recompute_granularity: selective recompute_num_layers must be None'")
    if gran == "full":
        if method is None:
            out.append("Megatron: 'Using recompute_granularity: full so recompute_method must be \"block\" or "
                       "\"uniform\"'")
        if k is None:
            out.append("Megatron: 'When using recompute_granularity: full recompute_num_layers must be between 1 and "
                       "num_layers_per_pipeline_rank'")
    if a["distribute_saved_activations"] and (a["tensor_model_parallel_size"] == 1 or gran != "full"):
        out.append("Megatron: 'can distribute recomputed activations only across tensor model parallel groups' "
                   "with full granularity")
    modules = a["recompute_modules"] if a["recompute_modules"] is not None else ["core_attn"]
    if gran == "selective":
        allowed = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"}
        bad = sorted(set(modules) - allowed)
        if bad:
            out.append(f"Megatron: 'Invalid choices for recompute_modules: {bad}'; choose from {sorted(allowed)}")
        if "moe_act" in modules and not a["moe_grouped_gemm"]:
            out.append("Megatron: 'moe_act in recompute_modules is only supported with moe_grouped_gemm'")
        if "mla_up_proj" in modules and not a["multi_latent_attention"]:
            out.append("Megatron: 'mla_up_proj in recompute_modules is only supported with multi_latent_attention'")
    return out


def _attention(a: Mapping[str, Any]) -> list[str]:
    out = []
    tp, heads = a["tensor_model_parallel_size"], a["num_attention_heads"]
    if heads is None or a["hidden_size"] is None or a["num_layers"] is None:
        return ["Megatron: '--num-layers, --hidden-size and --num-attention-heads' are required (argument is None)"]
    if heads % tp:
        out.append(f"Megatron: 'num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size "
                   f"({tp})'; use a tp that divides the heads")
    groups = a["num_query_groups"] if a["group_query_attention"] else None
    if groups is not None and groups % tp and tp % groups:
        out.append(f"Megatron: 'num_query_groups ({groups}) must be a multiple or divisor of "
                   f"tensor_model_parallel_size ({tp})'")
    if a["kv_channels"] is None and not a["multi_latent_attention"] and a["hidden_size"] % heads:
        out.append(f"Megatron: hidden size {a['hidden_size']} is not divisible by {heads} heads "
                   "(assert args.hidden_size % args.num_attention_heads == 0); give --kv-channels")
    if a["mtp_num_layers"] and a["position_embedding_type"] not in ("rope", "none"):
        out.append(f"Megatron: 'Multi-Token Prediction (MTP) is not supported with {a['position_embedding_type']} "
                   "position embedding type'; MTP needs rope")
    return out


def _experts(a: Mapping[str, Any]) -> list[str]:
    out = []
    ep, experts = a["expert_model_parallel_size"], a["num_experts"] or None
    if ep > 1 and experts is None:
        out.append("Megatron: 'num_experts must be non None to use expert model parallelism'; set ep 1")
    if ep > 1 and experts is not None and experts % ep:
        out.append(f"Megatron: 'Number of experts should be a multiple of expert model parallel_size' "
                   f"({experts} experts, ep {ep}); use an ep dividing {experts}")
    etp = a["expert_tensor_parallel_size"] or a["tensor_model_parallel_size"]
    if experts is not None and a["add_bias_linear"] and etp != 1:
        out.append("Megatron: 'Bias in Moe is only supported when ETP==1'; set etp 1 or a bias-free model")
    if experts is not None and a["moe_router_topk"] == 1 and a["moe_router_score_function"] == "softmax" \
            and not a["moe_router_pre_softmax"]:
        out.append("Megatron: 'Please use --moe-router-pre-softmax when topk is 1.'")
    if experts is not None and a["moe_token_dispatcher_type"] not in ("allgather", "alltoall", "flex"):
        out.append(f"Megatron: --moe-token-dispatcher-type {a['moe_token_dispatcher_type']!r} is not one of "
                   "allgather, alltoall, flex")
    if a["moe_flex_dispatcher_backend"] not in ("deepep", "hybridep"):
        out.append(f"Megatron: --moe-flex-dispatcher-backend {a['moe_flex_dispatcher_backend']!r} is not one of "
                   "deepep, hybridep")
    if a["moe_enable_deepep"] and a["moe_token_dispatcher_type"] != "flex":
        out.append("Megatron: 'DeepEP backend is only supported with flex token dispatcher.'; add "
                   "--moe-token-dispatcher-type flex or drop --moe-enable-deepep")
    if a["moe_enable_deepep"] and a["moe_flex_dispatcher_backend"] == "hybridep":
        out.append("Megatron: 'Only one backend is supported for flex token dispatcher.'; drop --moe-enable-deepep "
                   "or --moe-flex-dispatcher-backend hybridep")
    deepep = a["moe_enable_deepep"] or a["moe_flex_dispatcher_backend"] == "deepep"
    if experts is not None and a["moe_token_dispatcher_type"] == "flex" and a["moe_pad_expert_input_to_capacity"] \
            and deepep:
        out.append("Megatron: 'Flex token dispatcher with deepep backend does not support "
                   "moe_pad_expert_input_to_capacity'")
    if experts is not None and a["moe_token_dispatcher_type"] == "flex" and \
            a["expert_model_parallel_size"] * (a["expert_tensor_parallel_size"] or a["tensor_model_parallel_size"]) <= 1:
        out.append("Megatron: 'Flex token dispatcher requires TPxEP > 1'; raise the expert-parallel size or use "
                   "--moe-token-dispatcher-type alltoall")
    if a["moe_shared_expert_intermediate_size"] is not None and a["moe_shared_expert_overlap"] \
            and a["moe_token_dispatcher_type"] != "alltoall":
        out.append("Megatron: 'moe_shared_expert_overlap only works with alltoall token dispatcher.'")
    if a["moe_expert_capacity_factor"] is not None and a["moe_expert_capacity_factor"] <= 0:
        out.append("Megatron: the expert capacity factor must be positive; drop it for dropless routing")
    if a["moe_pad_expert_input_to_capacity"] and a["moe_expert_capacity_factor"] is None:
        out.append("Megatron: 'moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity'")
    if experts is not None and a["moe_grouped_gemm"] and not a["bf16"]:
        out.append("Megatron: 'Currently GroupedGEMM for MoE only supports bf16 dtype.'")
    if experts is not None and isinstance(a["moe_layer_freq"], list) and a["num_layers"] is not None \
            and len(a["moe_layer_freq"]) != a["num_layers"]:
        out.append(f"Megatron: the --moe-layer-freq pattern has {len(a['moe_layer_freq'])} entries, not "
                   f"num_layers {a['num_layers']} ('The pattern length must match the total number of layers')")
    return out


def _router(a: Mapping[str, Any]) -> list[str]:
    """TransformerConfig.__post_init__'s router checks and validate_args' balance-loss ones."""
    out = []
    if a["num_experts"] is None:
        return out
    if a["moe_router_enable_expert_bias"] and a["moe_router_score_function"] != "sigmoid":
        out.append("Megatron: 'Expert bias for aux-loss-free routing only supports sigmoid score function'; "
                   "set --moe-router-score-function sigmoid")
    if a["moe_router_score_function"] not in ("softmax", "sigmoid"):
        out.append(f"Megatron: --moe-router-score-function {a['moe_router_score_function']!r} is not softmax or sigmoid")
    groups, group_topk = a["moe_router_num_groups"], a["moe_router_group_topk"]
    if group_topk:
        if not groups:
            out.append("Megatron: 'When using group limited routing, moe_router_num_groups must be specified.'")
        elif a["num_experts"] % groups or group_topk > groups:
            out.append(f"Megatron: the {a['num_experts']} experts must split into moe_router_num_groups ({groups}) "
                       f"groups, and moe_router_group_topk ({group_topk}) must not exceed them")
    if a["moe_router_dtype"] not in (None, "fp32", "fp64"):
        out.append(f"Megatron: --moe-router-dtype {a['moe_router_dtype']!r} is not fp32 or fp64")
    types, coeffs = a["moe_router_load_balancing_type"], a["moe_aux_loss_coeff"]
    bad = sorted(set(types) - {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"})
    if bad:
        out.append(f"Megatron: --moe-router-load-balancing-type {bad} is not one of aux_loss, seq_aux_loss, "
                   "global_aux_loss, sinkhorn, none")
    if len(types) > 1 and len(coeffs) != len(types):
        out.append("Megatron: 'moe_aux_loss_coeff must be a list of the same length as "
                   "moe_router_load_balancing_type'")
    return out


def _rope(a: Mapping[str, Any]) -> list[str]:
    out = []
    if a["rope_type"] not in (None, "rope", "yarn"):
        out.append(f"Megatron: --rope-type {a['rope_type']!r} is not rope or yarn")
    if a["multi_latent_attention"] and a["apply_rope_fusion"] and a["rope_type"] == "rope":
        out.append("Megatron: 'apply_rope_fusion for MLA only works with YARN RoPE.' (MLATransformerConfig, with "
                   "Transformer Engine); add --no-rope-fusion")
    if a["rope_type"] not in (None, "rope") and not a["multi_latent_attention"]:
        out.append(f"Megatron: 'Common attention only support rope_type=\"rope\", but got {a['rope_type']}'; "
                   "YaRN needs --multi-latent-attention")
    if a["window_size"] is not None and len(a["window_size"]) != 2:
        out.append(f"Megatron: --window-size {a['window_size']} must be (left, right)")
    return out


def _fsdp(a: Mapping[str, Any]) -> list[str]:
    """validate_args for Megatron-FSDP (and its user guide's required flags)."""
    out = []
    strategy = a["data_parallel_sharding_strategy"]
    if strategy not in ("no_shard", "optim", "optim_grads", "optim_grads_params"):
        out.append(f"Megatron: --data-parallel-sharding-strategy {strategy!r} is not one of no_shard, optim, "
                   "optim_grads, optim_grads_params")
    if a["ckpt_format"] == "fsdp_dtensor" and not a["use_megatron_fsdp"]:
        out.append("Megatron: '--ckpt-format fsdp_dtensor is only tested with Megatron FSDP.'")
    if not a["use_megatron_fsdp"]:
        return out
    if a["ckpt_format"] != "fsdp_dtensor":
        out.append("Megatron: 'Megatron FSDP only supports fsdp_dtensor checkpoint format'; add --ckpt-format "
                   "fsdp_dtensor")
    if a["use_torch_fsdp2"]:
        out.append("Megatron: --use-megatron-fsdp and --use-torch-fsdp2 are two FSDP implementations; keep one")
    if not a["use_distributed_optimizer"] or a["gradient_accumulation_fusion"]:
        out.append("Megatron-FSDP user guide: the required flags include --use-distributed-optimizer and "
                   "--no-gradient-accumulation-fusion")
    return out


def _mixers(a: Mapping[str, Any]) -> list[str]:
    """megatron-core 0.16's checks of the layer kinds beyond attention + MLP: the hybrid pattern
    (ssm/mamba_hybrid_layer_allocation.py _allocate_override), MambaMixer's head and group splits
    (ssm/mamba_mixer.py), Mamba CP (ssm/mamba_context_parallel.py), the hybrid stack's pipeline
    (ssm/mamba_block.py), Gated DeltaNet's and DSA's (transformer_config.py __post_init__), and
    no_rope_freq's length."""
    out = []
    tp, cp, layers = a["tensor_model_parallel_size"], a["context_parallel_size"], a["num_layers"]
    pattern = a["hybrid_override_pattern"]
    if pattern is not None:
        if len(pattern) != layers:
            out.append(f"Megatron: 'The hybrid override pattern is the wrong length: got {len(pattern)}, expected "
                       f"{layers}'; give one symbol per layer")
        bad = sorted(set(pattern) - set("M*-E"))
        if bad:
            out.append(f"Megatron: 'In hybrid override pattern, {bad[0]!r} is not one of M * - E'")
        if "M" in pattern:
            heads = a["mamba_num_heads"] or (2 * a["hidden_size"]) // a["mamba_head_dim"]
            groups = a["mamba_num_groups"]
            if heads % tp or groups % tp or heads % groups:
                out.append(f"Megatron: MambaMixer needs nheads ({heads}) and ngroups ({groups}) divisible by tp "
                           f"({tp}) and nheads by ngroups; use a tp that divides both")
            elif cp > 1 and (heads // tp) % cp:
                out.append(f"Megatron: Mamba context parallelism needs nheads / tp ({heads // tp}) divisible by cp "
                           f"({cp}); use a cp that divides them")
            width = 2 * heads * a["mamba_head_dim"] + 2 * groups * a["mamba_state_dim"] + heads
            if (a["fp8"] or a.get("fp4")) and width % 16:
                out.append(f"Megatron: 'For FP8, the innermost dimension of the Mamba layer input projection output "
                           f"tensor must be a multiple of 16' ({width}); use bf16")
            vpp = a["num_virtual_stages_per_pipeline_rank"] or a["num_layers_per_virtual_pipeline_stage"]
            if vpp:
                out.append("Megatron: 'The Mamba hybrid model does not currently support virtual/interleaved "
                           "pipeline parallelism'; drop the virtual stages")
            if a["pipeline_model_parallel_layout"] is not None:
                out.append("Megatron: the hybrid stack places layers by --decoder-first/last-pipeline-num-layers, "
                           "not --pipeline-model-parallel-layout")
    variant = a["experimental_attention_variant"]
    if variant == "gated_delta_net":
        keys, values = a["linear_num_key_heads"], a["linear_num_value_heads"]
        if a["linear_attention_freq"] is None:
            out.append("Megatron: 'linear_attention_freq must be set for linear gated_delta_net'")
        if values % keys or keys % tp or values % tp:
            out.append(f"Megatron: gated delta net needs linear_num_value_heads ({values}) a multiple of "
                       f"linear_num_key_heads ({keys}) and both multiples of tensor_model_parallel_size ({tp})")
    if variant == "dsa" and cp > 1:
        out.append("Megatron: 'Currently context parallelism is not supported by DSAttention!'; use cp 1")
    if variant == "dsa" and a["apply_rope_fusion"] and a["position_embedding_type"] == "rope":
        out.append("Megatron: 'RoPE fusion is not supported for DSAttention'; add --no-rope-fusion")
    for dest in ("no_rope_freq", "linear_attention_freq", "window_attn_skip_freq"):
        freq = a[dest]
        if isinstance(freq, list) and len(freq) != layers:
            out.append(f"Megatron: the {flag_of(dest)} list has {len(freq)} entries for {layers} layers")
        if dest == "no_rope_freq" and isinstance(freq, int) and freq and layers % freq:
            out.append(f"Megatron: 'no_rope_freq={freq} should be divisible by num_layers={layers}'")
    return out


_RULES: tuple[Callable[..., list[str]], ...] = (_pipeline, _sequence, _overlap, _recompute, _attention, _experts,
                                                _router, _rope, _fsdp, _mixers)


def megatron_violations(args: Sequence[str] | Mapping[str, Any], world_size: int) -> list[str]:
    """Every check of Megatron's validate_args (and of the core configs it builds) that `args`
    fails at `world_size` GPUs; each names Megatron's reason and the fix. Empty = Megatron accepts."""
    a = parse_megatron_argv(args) if not isinstance(args, Mapping) else args
    out = _world(a, world_size)
    for rule in _RULES:
        out += rule(a)
    out += _batch(a, world_size) + _interleaving(a, world_size)
    return out


def megatron_notes(args: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """Settings Megatron silently changes (warnings, not errors)."""
    a = parse_megatron_argv(args) if not isinstance(args, Mapping) else args
    notes = []
    if a["sequence_parallel"] and a["tensor_model_parallel_size"] == 1:
        notes.append("Megatron disables --sequence-parallel because tensor model parallelism is disabled (tp 1)")
    if a["global_batch_size"] is None:
        notes.append("Megatron sets the global batch to micro batch · dp (one micro-batch per step)")
    if a["expert_model_parallel_size"] > 1 and a["tensor_model_parallel_size"] > 1 and not a["sequence_parallel"]:
        notes.append("Megatron warns: with expert and tensor parallelism, sequence parallelism must be used")
    return notes
