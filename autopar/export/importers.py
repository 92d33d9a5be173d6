"""Plans from existing launch configurations: Megatron-LM arguments (an argv list, a command line
or a whole launch script) and DeepSpeed config JSON.

Imports are canonical, so that plan -> export -> import gives the same ParallelPlan: where the
launch configuration cannot tell an explicit value from the default it stands for, the default is
returned (sequence parallelism on with tp > 1 -> sp None; a stage split equal to autopar's default
-> layers_per_stage None). Settings no framework records (moe_load_imbalance, a cost-model input)
come back as their defaults. What autopar cannot represent is refused with InputFileError naming
the flag.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from autopar.cost.layout import stage_layer_counts
from autopar.errors import InputFileError
from autopar.export.megatron_rules import parse_layout, parse_megatron_argv
from autopar.io import read_json_object, read_text_file
from autopar.limits import (MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAUNCH_SCRIPT_BYTES, MAX_SCRIPT_EXPANSION_CHARS, clip,
                            clip_repr)
from autopar.schema import one_line
from autopar.schema.plan import ParallelPlan, Recompute

# ---- Megatron: text -> argv ---------------------------------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")
_ASSIGN = re.compile(r"^(?:export\s+)?(\w+)=(.*)$", re.DOTALL)
_ARRAY_REF = re.compile(r'"?\$\{(\w+)\[@\]\}"?')


class _Expansion:
    """${X:-default}, ${X} and $X from the script's own assignments (never the caller's environment),
    with at most MAX_SCRIPT_EXPANSION_CHARS characters substituted over the whole script: a
    variable that doubles itself (A=$A$A, 24 times) would otherwise grow to 16 MiB and hang the split."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env, self.left = env, MAX_SCRIPT_EXPANSION_CHARS

    def __call__(self, text: str) -> str:
        def sub(m: re.Match) -> str:
            name = m.group(1) or m.group(3)
            if name in self.env:
                return self.spend(self.env[name])
            return self.spend(m.group(2)) if m.group(2) is not None else m.group(0)
        return _VAR.sub(sub, text)

    def spend(self, value: str) -> str:
        """`value`, counted against the budget (InputFileError once it is spent)."""
        self.left -= len(value)
        if self.left < 0:
            raise InputFileError(f"the launch script's variables expand to over {MAX_SCRIPT_EXPANSION_CHARS:,} "
                                 "characters, more than autopar reads; pass the pretrain_gpt.py arguments "
                                 "themselves (or a script whose variables do not repeat themselves)")
        return value


def _shell_scan(text: str) -> tuple[list[int], str]:
    """Indices of the characters outside quotes and comments, and the quote left open ('' = none)."""
    plain, quote, k = [], "", 0
    while k < len(text):
        ch = text[k]
        if quote:
            if ch == "\\" and quote == '"':
                k += 1
            elif ch == quote:
                quote = ""
        elif ch == "\\":
            k += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1].isspace()):
            nl = text.find("\n", k)
            k = len(text) if nl < 0 else nl
            continue
        else:
            plain.append(k)
        k += 1
    return plain, quote


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and quoted strings spanning lines kept whole."""
    out, pending = [], ""
    for raw in re.sub(r"\\\r?\n", " ", text).splitlines():
        pending = f"{pending}\n{raw}" if pending else raw
        if not _shell_scan(pending)[1]:
            out.append(pending.strip())
            pending = ""
    return out + ([pending.strip()] if pending else [])


def _script_argv(text: str) -> tuple[list[str], dict[str, str]]:
    """The arguments after pretrain_gpt.py (variables and arrays expanded, unquoted values
    word-split as bash does), and the script's variable defaults. Text without such a line is
    read as one argument list."""
    env: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    expand = _Expansion(env)
    lines = _logical_lines(text)
    command: list[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        m = _ASSIGN.match(line)
        if m and m.group(2).startswith("("):
            body = m.group(2)[1:]
            while _array_end(body) is None and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            arrays[m.group(1)] = _split(expand(body[:_array_end(body)]))
        elif m:
            value = _split(expand(m.group(2)))
            env[m.group(1)] = value[0] if value else ""
        elif re.search(r"pretrain_\w+\.py", line) and not line.startswith("#"):
            line = _ARRAY_REF.sub(lambda r: expand.spend(shlex.join(arrays.get(r.group(1), []))), line)
            words = _split(expand(line))
            at = next((k for k, w in enumerate(words) if re.search(r"pretrain_\w+\.py", w)), None)
            command = words[at + 1:] if at is not None else command
    if command is None:
        return _split(expand("\n".join(lines))), env
    return command, env


def _array_end(body: str) -> int | None:
    """Index of the unquoted ')' that closes a bash array body (None = not closed yet)."""
    depth = 1
    for k in _shell_scan(body)[0]:
        depth += {"(": 1, ")": -1}.get(body[k], 0)
        if depth == 0:
            return k
    return None


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise InputFileError(f"cannot split the Megatron arguments ({exc}); check the quoting")


def _is_file(text: str) -> bool:
    if "\n" in text or text.lstrip().startswith("-"):
        return False
    try:
        return Path(text).exists()  # a directory or a device too: reading it says why it is no script
    except (OSError, ValueError):  # e.g. a whole argument string is too long for a file name
        return False


def _argv(source: str | Path | list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    if isinstance(source, (list, tuple)):
        return list(source), {}
    if isinstance(source, Path) or _is_file(source):
        path = Path(source)
        size = path.stat().st_size if path.is_file() else 0
        if size > MAX_LAUNCH_SCRIPT_BYTES:
            raise InputFileError(f"launch script {clip(path)} is {size:,} bytes; autopar imports scripts of up to "
                                 f"{MAX_LAUNCH_SCRIPT_BYTES:,} bytes (128 KiB), so pass the launch script itself")
        return _script_argv(read_text_file(path, "launch script", "pass the script's path or its arguments",
                                           max_bytes=MAX_LAUNCH_SCRIPT_BYTES))
    if len(source) > MAX_LAUNCH_SCRIPT_BYTES:  # (Linux caps one command-line argument at 128 KiB as well)
        raise InputFileError(f"the Megatron arguments are {len(source):,} characters; autopar reads at most "
                             f"{MAX_LAUNCH_SCRIPT_BYTES:,}, so pass the launch script's own arguments")
    return _script_argv(source)


# ---- Megatron: argv -> plan and model fields ------------------------------------------------------


def _megatron_precision(a: dict[str, Any]) -> str:
    """The plan's precision from Megatron's flags (megatron/training/arguments.py, core_r0.14+):
    --fp4-format with --fp4-recipe nvfp4 is nvfp4, --fp8-format with --fp8-recipe mxfp8 is mxfp8, any
    other --fp8-format recipe (delayed, tensorwise, blockwise) fp8, else bf16."""
    if a.get("fp4"):
        recipe = a.get("fp4_recipe") or "nvfp4"
        if recipe not in ("nvfp4", "mxfp4"):
            raise InputFileError(f"--fp4-recipe {recipe}: autopar plans nvfp4 or mxfp4; use --fp4-recipe nvfp4")
        return recipe
    if a["fp8"]:
        return "mxfp8" if a.get("fp8_recipe") == "mxfp8" else "fp8"
    return "bf16"

def plan_from_megatron_args(args: str | Path | list[str], num_gpus: int | None = None
                            ) -> tuple[ParallelPlan, dict[str, Any]]:
    """(plan, model fields) from Megatron-LM `pretrain_gpt.py` arguments: an argv list, a command
    line, script text or a script path. `num_gpus` defaults to the script's GPUS_PER_NODE · NNODES
    (needed only without --global-batch-size or with --num-distributed-optimizer-instances).
    Model fields are ModelSpec keyword arguments (no name or source; mla and moe as dicts;
    vocab_size only when --vocab-size is given)."""
    argv, env = _argv(args)
    a = parse_megatron_argv(argv)
    if num_gpus is None and env.get("GPUS_PER_NODE", "").isdigit() and env.get("NNODES", "").isdigit():
        num_gpus = int(env["GPUS_PER_NODE"]) * int(env["NNODES"])
    _refuse_unmodelled(a)
    _check_ranges(a)
    model = megatron_model_fields(a)
    fields: dict[str, Any] = {
        "tp": a["tensor_model_parallel_size"], "pp": a["pipeline_model_parallel_size"],
        "cp": a["context_parallel_size"], "ep": a["expert_model_parallel_size"],
        "mbs": a["micro_batch_size"] or 1, "seq_len": a["seq_length"], "framework": "megatron",
        "zero": _megatron_zero(a), "precision": _megatron_precision(a),
        "overlap_grad_reduce": a["overlap_grad_reduce"], "overlap_param_gather": a["overlap_param_gather"],
        "tp_comm_overlap": a["tp_comm_overlap"], "recompute": _megatron_recompute(a),
        "grad_reduce_in_bf16": a["grad_reduce_in_bf16"], "cross_entropy_fusion": a["cross_entropy_loss_fusion"],
    }
    fields["etp"] = a["expert_tensor_parallel_size"]
    fields |= _megatron_comm_types(a)
    sp = a["sequence_parallel"] and fields["tp"] > 1
    fields["sp"] = None if sp == (fields["tp"] > 1) else sp
    fields["vpp"], fields["layers_per_stage"] = _megatron_stages(a)
    fields |= _megatron_batch(a, fields, num_gpus)
    _megatron_refusals(a, num_gpus)
    if fields["seq_len"] is None:
        raise InputFileError("the Megatron arguments have no --seq-length; add it")
    try:
        return ParallelPlan(**fields), model
    except ValidationError as exc:
        raise InputFileError(one_line(exc, "the Megatron arguments give an invalid plan"))


# Integer arguments autopar reads, with the smallest value Megatron accepts; the largest is the
# limits' (autopar.limits), so no later arithmetic divides by zero or builds a list of 10^12 items.
_POSITIVE = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size", "global_batch_size",
             "seq_length", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
             "num_experts", "moe_ffn_hidden_size", "kv_channels", "num_layers_per_virtual_pipeline_stage",
             "num_virtual_stages_per_pipeline_rank", "vocab_size", "max_position_embeddings")
_NON_NEGATIVE = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "recompute_num_layers",
                 "mtp_num_layers", "moe_shared_expert_intermediate_size", "q_lora_rank")


def _check_ranges(a: Mapping[str, Any]) -> None:
    """InputFileError naming the flag of an integer argument out of range (zero or negative where
    Megatron needs a positive one, or beyond autopar's limits)."""
    from autopar.export.megatron_rules import flag_of
    from autopar.limits import MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN

    highest = max(MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, 1 << 24)
    for dests, lowest in ((_POSITIVE, 1), (_NON_NEGATIVE, 0)):
        for dest in dests:
            value = a.get(dest)
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            if not lowest <= value <= highest:
                shown = str(value) if len(str(value)) <= 20 else str(value)[:17] + "..."
                raise InputFileError(f"{flag_of(dest)} {shown} is out of range: it must be from {lowest} to "
                                     f"{highest:,}; fix the argument")


def _megatron_refusals(a: Mapping[str, Any], num_gpus: int | None) -> None:
    """InputFileError with every check of Megatron's validate_args the arguments fail, in Megatron's
    words (export.megatron_rules, the rules the exports are checked by). Without a GPU count the
    world-size and batch checks are left out."""
    from autopar.export import megatron_rules as rules

    if num_gpus is not None:
        problems = rules.megatron_violations(a, num_gpus)
    else:
        problems = [p for rule in rules._RULES for p in rule(a)]
    # a model flag left out is the model argument's to give (autopar checks the two agree: api.check_same_model)
    problems = [p for p in problems if "argument is None" not in p]
    if a["multi_latent_attention"] and not a["qk_layernorm"]:
        problems.append("--multi-latent-attention without --qk-layernorm builds MLA without the q_a/kv_a norms that "
                        "DeepSeek-V2/V3 have and autopar's MLA counts; add --qk-layernorm")
    if problems:
        raise InputFileError("Megatron would refuse these arguments: " + "; ".join(problems))


# Megatron-LM flags (megatron/training/arguments.py) that set data, tokenizer, optimizer values, logging,
# checkpoints or initialisation: they change no step time or memory, so an import reads past them quietly.
_NO_COST_FLAGS = frozenset({
    "--split", "--train-iters", "--train-samples", "--lr", "--min-lr", "--weight-decay", "--clip-grad",
    "--init-method-std", "--seed", "--vocab-file", "--merge-file", "--mock-data", "--distributed-backend",
    "--distributed-timeout-minutes", "--use-flash-attn", "--transformer-impl", "--attention-backend",
    "--use-mcore-models", "--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--manual-gc",
    "--start-weight-decay", "--end-weight-decay", "--weight-decay-incr-style", "--optimizer", "--sgd-momentum",
    "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler", "--finetune", "--no-load-optim",
    "--no-load-rng", "--pretrained-checkpoint", "--profile", "--profile-step-start", "--profile-step-end",
    "--num-workers", "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss", "--use-dist-ckpt",
    "--auto-detect-ckpt-format", "--dist-ckpt-format", "--no-create-attention-mask-in-dataloader",
    "--exit-duration-in-mins", "--exit-interval", "--exit-signal-handler", "--timing-log-level",
    "--timing-log-option", "--bias-gelu-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion", "--cross-entropy-fusion-impl"})
_NO_COST_PREFIXES = ("--data-", "--train-data", "--valid-data", "--test-data", "--tokenizer-", "--save", "--load",
                     "--log-", "--eval-", "--lr-", "--adam-", "--wandb-", "--tensorboard", "--ckpt-", "--fp8-amax-",
                     "--no-save-", "--no-load-", "--rerun-", "--check-", "--one-logger", "--no-one-logger",
                     "--hidden-dropout-", "--loss-scale", "--initial-loss-scale", "--min-loss-scale")


def megatron_ignored_flags(args: str | Path | list[str]) -> list[str]:
    """The flags of Megatron arguments (as plan_from_megatron_args reads them) that autopar neither
    reads nor knows as cost-free (_NO_COST_FLAGS: data, optimizer values, logging, checkpoints), in
    order: a flag autopar does not model, or a misspelt one."""
    argv, _ = _argv(args)
    return [f for f in parse_megatron_argv(argv)["unknown"]
            if f not in _NO_COST_FLAGS and not f.startswith(_NO_COST_PREFIXES)]


def ignored_flags_note(args: str | Path | list[str]) -> str | None:
    """One line naming the flags autopar ignored in an import (None when it read every flag)."""
    flags = megatron_ignored_flags(args)
    if not flags:
        return None
    shown = ", ".join(flags[:40]) + (f" and {len(flags) - 40} more" if len(flags) > 40 else "")
    return (f"autopar ignored {len(flags)} flag{'s' if len(flags) > 1 else ''} it does not model (no effect on the "
            f"estimate; check the spelling): {shown}")


def model_from_megatron_args(args: str | Path | list[str], name: str = "megatron-script"):
    """The ModelSpec the Megatron arguments describe (the model is then the script's own): the
    shape flags are required (--num-layers, --hidden-size, --num-attention-heads, --vocab-size)."""
    from autopar.schema.model import ModelSpec

    argv, _ = _argv(args)
    a = parse_megatron_argv(argv)
    missing = [flag for flag, dest in (("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
                                       ("--num-attention-heads", "num_attention_heads"),
                                       ("--vocab-size", "vocab_size")) if a[dest] is None]
    if missing:
        raise InputFileError(f"the Megatron arguments lack {', '.join(missing)}, so they do not describe the model "
                             "(--vocab-size: Megatron pads the tokenizer's); add them or name the model")
    fields = megatron_model_fields(a)
    try:
        return ModelSpec(name=name, source="Megatron-LM arguments", seq_length=a["seq_length"] or 2048,
                         **{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise InputFileError(one_line(exc, "the Megatron arguments describe an invalid model"))


def _refuse_unmodelled(a: Mapping[str, Any]) -> None:
    unmodelled = {"use_torch_fsdp2": "--use-torch-fsdp2",
                  "quick_geglu": "--quick-geglu", "fp16": "--fp16",
                  "use_legacy_models": "--use-legacy-models",
                  "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
                  "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split"}
    found = [flag for dest, flag in unmodelled.items() if a[dest]]
    if a["position_embedding_type"] not in ("rope", "learned_absolute", "none") and \
            not a["use_rotary_position_embeddings"]:
        found.append(f"--position-embedding-type {a['position_embedding_type']}")
    if a["use_megatron_fsdp"] and a["data_parallel_sharding_strategy"] not in ("optim_grads", "optim_grads_params"):
        found.append(f"--use-megatron-fsdp with --data-parallel-sharding-strategy "
                     f"{a['data_parallel_sharding_strategy']}")
    if found:
        raise InputFileError(f"autopar does not model {', '.join(found)}; remove it to import the rest")


def _megatron_zero(a: Mapping[str, Any]) -> int:
    """Megatron-FSDP's sharding strategy as a ZeRO stage, else 1/0 with/without the distributed optimizer."""
    if a["use_megatron_fsdp"]:
        return {"optim_grads": 2, "optim_grads_params": 3}[a["data_parallel_sharding_strategy"]]
    return 1 if a["use_distributed_optimizer"] else 0


def _megatron_comm_types(a: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    types = set(a["cp_comm_type"] or ["p2p"])
    if len(types) != 1 or not types <= {"p2p", "a2a", "all_gather"}:
        raise InputFileError(f"--cp-comm-type {sorted(types)} has no autopar form; use one of p2p, a2a, all_gather "
                             "for every layer")
    (kind,) = types
    out["cp_comm_type"] = "allgather" if kind == "all_gather" else kind
    if a["attention_backend"] not in ("auto", "flash", "fused", "unfused"):
        raise InputFileError(f"--attention-backend {a['attention_backend']} is not modelled; use auto, flash, fused "
                             "or unfused")
    out["attention_backend"] = a["attention_backend"]
    if a["num_experts"]:
        if a["moe_token_dispatcher_type"] not in ("alltoall", "allgather", "flex"):
            raise InputFileError(f"--moe-token-dispatcher-type {a['moe_token_dispatcher_type']} is not modelled; "
                                 "use alltoall, allgather or flex")
        if a["moe_token_dispatcher_type"] == "flex" and a["moe_flex_dispatcher_backend"] != "deepep" \
                and not a["moe_enable_deepep"]:
            raise InputFileError(f"--moe-flex-dispatcher-backend {a['moe_flex_dispatcher_backend']} is not modelled "
                                 "(autopar prices DeepEP's kernels only); use --moe-flex-dispatcher-backend deepep "
                                 "or --moe-token-dispatcher-type alltoall")
        out["moe_dispatcher"] = a["moe_token_dispatcher_type"]
        out["moe_grouped_gemm"] = bool(a["moe_grouped_gemm"])
    if a["moe_expert_capacity_factor"] is not None:
        out["moe_capacity_factor"] = a["moe_expert_capacity_factor"]
    if a["moe_pad_expert_input_to_capacity"]:
        out["moe_pad_to_capacity"] = True
    if a["moe_shared_expert_overlap"]:
        out["moe_shared_expert_overlap"] = True
    return out


def _megatron_recompute(a: Mapping[str, Any]) -> Recompute:
    gran = "selective" if a["recompute_activations"] else a["recompute_granularity"]
    if gran is None:
        return Recompute(mode="none")
    if gran == "selective":
        modules = a["recompute_modules"] if a["recompute_modules"] is not None else ["core_attn"]
        try:
            return Recompute(mode="selective", modules=tuple(modules))
        except ValidationError as exc:
            raise InputFileError(one_line(exc, "--recompute-modules"))
    method, k = a["recompute_method"], a["recompute_num_layers"]
    if method == "block" and k is not None:
        return Recompute(mode="full", num_layers=k)
    if method == "uniform" and k == 1:
        return Recompute(mode="full")
    raise InputFileError(f"full recompute with --recompute-method {method} --recompute-num-layers {k} has no autopar "
                         "form; use block with K layers per stage, or uniform with 1 (every layer)")


def _megatron_stages(a: Mapping[str, Any]) -> tuple[int, tuple[int, ...] | None]:
    """(vpp, layers_per_stage or None when the split is autopar's default)."""
    pp, layers = a["pipeline_model_parallel_size"], a["num_layers"]
    counts: list[int] | None = None
    if a["pipeline_model_parallel_layout"] is not None:
        try:
            stages = parse_layout(a["pipeline_model_parallel_layout"])
        except ValueError as exc:
            raise InputFileError(f"--pipeline-model-parallel-layout: {exc}")
        if len(stages) % pp:
            raise InputFileError(f"the layout has {len(stages)} stages, not a multiple of pp {pp}; fix the layout")
        counts, vpp = [s.count("t") for s in stages], len(stages) // pp
    else:
        vpp = a["num_virtual_stages_per_pipeline_rank"] or 1
        if a["num_layers_per_virtual_pipeline_stage"] and layers:
            vpp = max(layers // pp // a["num_layers_per_virtual_pipeline_stage"], 1)
        first, last = a["decoder_first_pipeline_num_layers"], a["decoder_last_pipeline_num_layers"]
        if (first is not None or last is not None) and layers:
            counts = _first_last_counts(layers, pp, vpp, first, last)
    if counts is None or layers is None:
        return vpp, None
    default = stage_layer_counts(layers, pp * vpp)
    return vpp, None if tuple(counts) == default else tuple(counts)


def _first_last_counts(layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> list[int]:
    """Per-virtual-stage counts of --decoder-first/last-pipeline-num-layers (each rank's layers split
    evenly over its vpp chunks, as Megatron's get_num_layers_to_build does)."""
    middle_ranks = pp - (first is not None) - (last is not None)
    middle = layers - (first or 0) - (last or 0)
    per_middle = middle // middle_ranks if middle_ranks else 0
    per_rank = [per_middle] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return [per_rank[r] // vpp for _ in range(vpp) for r in range(pp)]


def _megatron_batch(a: Mapping[str, Any], fields: Mapping[str, Any], num_gpus: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dp = num_gpus // (fields["tp"] * fields["pp"] * fields["cp"]) if num_gpus else None
    gbs = a["global_batch_size"]
    if gbs is None:
        if dp is None:
            raise InputFileError("the Megatron arguments have no --global-batch-size; add it or pass num_gpus")
        gbs = fields["mbs"] * dp
    out["global_batch"] = gbs
    inst = a["num_distributed_optimizer_instances"]
    if inst > 1:
        if dp is None:
            raise InputFileError("--num-distributed-optimizer-instances needs the GPU count; pass num_gpus")
        out["zero_shard_size"] = dp // inst
    return out


def megatron_model_fields(a: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields the Megatron arguments determine (name and source are the caller's)."""
    fields: dict[str, Any] = {
        "num_layers": a["num_layers"], "hidden_size": a["hidden_size"], "num_attention_heads": a["num_attention_heads"],
        "num_kv_heads": a["num_query_groups"] if a["group_query_attention"] else None, "head_dim": a["kv_channels"],
        "activation": "swiglu" if a["swiglu"] else "gelu",
        "normalization": "rmsnorm" if a["normalization"] == "RMSNorm" else "layernorm",
        "position_embedding": "rope" if a["position_embedding_type"] == "rope" or a["use_rotary_position_embeddings"]
        else "learned",
        "tie_embeddings": not a["untie_embeddings_and_output_weights"],
        "qkv_bias": a["add_bias_linear"] or a["add_qkv_bias"], "attn_out_bias": a["add_bias_linear"],
        "mlp_bias": a["add_bias_linear"],
        "qk_norm": a["qk_layernorm"] and not a["multi_latent_attention"],  # MLA: the latent q_a / kv_a norms
        "dropout": a["attention_dropout"] > 0 or a["hidden_dropout"] > 0,
        "max_position_embeddings": a["max_position_embeddings"], "mtp_layers": a["mtp_num_layers"] or 0,
        "norm_epsilon": a["layernorm_epsilon"], "rope_theta": float(a["rotary_base"]),
        "rotary_percent": a["rotary_percent"],
        "sliding_window": a["window_size"][0] + 1 if a["window_size"] else None,
    }
    if a["use_rope_scaling"]:
        fields["rope_scaling"] = {"type": "llama3", "factor": a["rope_scaling_factor"],
                                  "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0}
    elif a["multi_latent_attention"] and a["rope_type"] in (None, "yarn"):  # MLA's default rope_type is yarn
        fields["rope_scaling"] = {"type": "yarn", "factor": a["rotary_scaling_factor"],
                                  "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "mscale": a["mscale"], "mscale_all_dim": a["mscale_all_dim"]}
    hidden = a["hidden_size"]
    if a["ffn_hidden_size"] is not None:
        fields["ffn_hidden_size"] = a["ffn_hidden_size"]
    elif hidden is not None:  # Megatron's default when the flag is absent
        fields["ffn_hidden_size"] = int(4 * hidden * 2 / 3 / 64) * 64 if a["swiglu"] else 4 * hidden
    if a["vocab_size"] is not None:
        fields["vocab_size"] = a["vocab_size"]
    if a["multi_latent_attention"]:
        fields["mla"] = {"q_lora_rank": a["q_lora_rank"], "kv_lora_rank": a["kv_lora_rank"],
                         "qk_nope_head_dim": a["qk_head_dim"], "qk_rope_head_dim": a["qk_pos_emb_head_dim"],
                         "v_head_dim": a["v_head_dim"]}
    if a["num_experts"]:
        fields["moe"] = _moe_fields(a)
    return fields | _mixer_fields(a, fields)


def _every(freq: int | list | None, layers: int, one_is_kind: bool = True) -> list[int] | None:
    """Megatron's per-layer 0/1 frequency flags as a list: an int N is N-1 of one kind then one of
    the other (window_attn_skip_freq, linear_attention_freq: 1 = SWA / LA; no_rope_freq: 1 = NoPE
    on every N-th)."""
    if freq is None:
        return None
    if isinstance(freq, list):
        return freq
    return [int(((i + 1) % freq != 0) == one_is_kind) for i in range(layers)]


def _mixer_fields(a: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """The layer kinds beyond attention + MLP (the inverse of megatron.mixer_args): the hybrid
    pattern and Mamba-2 sizes, Gated DeltaNet, DSA, per-layer windows, NoPE layers, sinks, the
    attention output gate, squared ReLU."""
    layers, out = a["num_layers"] or 0, {}
    if a["squared_relu"]:
        out["activation"] = "relu2"
    nope = a["position_embedding_type"] == "none"
    if nope:
        out["position_embedding"] = "rope"
    mixers, ffns = ["A"] * layers, None
    if a["hybrid_override_pattern"] is not None and len(a["hybrid_override_pattern"]) == layers:
        from autopar.model.mixers import split_hybrid_pattern

        mix, ffn = split_hybrid_pattern(a["hybrid_override_pattern"])
        mixers, ffns = [("N" if nope else "A") if c == "N" else c for c in mix], ffn
        heads = a["mamba_num_heads"] or 2 * a["hidden_size"] // a["mamba_head_dim"]
        out["mamba"] = {"num_heads": heads, "head_dim": a["mamba_head_dim"], "state_size": a["mamba_state_dim"],
                        "num_groups": a["mamba_num_groups"], "proj_bias": a["add_bias_linear"]}
    elif nope:
        mixers = ["N"] * layers
    variant = a["experimental_attention_variant"]
    if variant == "gated_delta_net":
        la = _every(a["linear_attention_freq"], layers) or [0] * layers
        mixers = ["G" if x else m for x, m in zip(la, mixers)]
        out["linear_attention"] = {"kind": "gated_deltanet", "num_key_heads": a["linear_num_key_heads"],
                                   "num_value_heads": a["linear_num_value_heads"],
                                   "key_head_dim": a["linear_key_head_dim"],
                                   "value_head_dim": a["linear_value_head_dim"],
                                   "conv_kernel": a["linear_conv_kernel_dim"]}
    if variant == "dsa":
        out["indexer"] = {"num_heads": a["dsa_indexer_n_heads"], "head_dim": a["dsa_indexer_head_dim"],
                          "top_k": a["dsa_indexer_topk"]}
    swa = _every(a["window_attn_skip_freq"], layers) if fields.get("sliding_window") else None
    if swa is not None:
        mixers = ["W" if x and m == "A" else m for x, m in zip(swa, mixers)]
    no_rope = _every(a["no_rope_freq"], layers, one_is_kind=False)
    if no_rope is not None:
        mixers = ["N" if x and m == "A" else m for x, m in zip(no_rope, mixers)]
    if a["softmax_type"] == "learnable":
        out["attention_sinks"] = True
    if a["num_experts"] and a["add_bias_linear"]:  # megatron-core's experts and router take add_bias_linear
        out["moe"] = {**fields["moe"], "expert_mlp_bias": True, "router_bias": True}
    if a["attention_output_gate"]:
        out["attention_output_gate"] = True
    if set(mixers) != {"A"} and layers:
        out["layer_pattern"] = "".join(mixers)
    if ffns is not None:
        out["ffn_pattern"] = ffns
    return out


def _moe_fields(a: Mapping[str, Any]) -> dict[str, Any]:
    moe: dict[str, Any] = {"num_experts": a["num_experts"], "top_k": a["moe_router_topk"],
                           "expert_ffn_hidden_size": a["moe_ffn_hidden_size"] or a["ffn_hidden_size"]}
    moe |= _router_fields(a)
    shared = a["moe_shared_expert_intermediate_size"]
    if shared:
        moe |= {"num_shared_experts": 1, "shared_expert_ffn_hidden_size": shared,
                "shared_expert_gate": a["moe_shared_expert_gate"]}
    freq = a["moe_layer_freq"]
    if isinstance(freq, int):
        moe |= {"first_k_dense": 0, "layer_freq": freq}
        return moe
    k = next((i for i, x in enumerate(freq) if x), len(freq))
    for f in range(1, len(freq) - k + 1):
        if all(x == int((i - k) % f == 0) for i, x in enumerate(freq[k:], start=k)):
            return moe | {"first_k_dense": k, "layer_freq": f}
    raise InputFileError(f"--moe-layer-freq pattern {freq} is not 'k dense layers, then every f-th layer MoE'; "
                         "autopar cannot model it")


def _router_fields(a: Mapping[str, Any]) -> dict[str, Any]:
    """MoESpec router fields from Megatron's router flags (the inverse of megatron.router_args)."""
    softmax = a["moe_router_score_function"] == "softmax"
    types, coeffs = a["moe_router_load_balancing_type"], a["moe_aux_loss_coeff"]
    kind = types[0] if types else "aux_loss"
    coeff = coeffs[0] if isinstance(coeffs, list) and coeffs else float(coeffs or 0.0)
    return {"score_function": a["moe_router_score_function"],
            "norm_topk_prob": not (softmax and a["moe_router_pre_softmax"]) or a["moe_router_topk"] == 1,
            "expert_bias": a["moe_router_enable_expert_bias"], "num_groups": a["moe_router_num_groups"],
            "group_topk": a["moe_router_group_topk"],
            "routed_scaling_factor": a["moe_router_topk_scaling_factor"] or 1.0,
            "aux_loss_coeff": coeff if kind in ("aux_loss", "seq_aux_loss", "global_aux_loss") else 0.0,
            "aux_loss_per_sequence": kind == "seq_aux_loss", "router_fp32": a["moe_router_dtype"] is not None}


# ---- DeepSpeed ---------------------------------------------------------------------------------

def _ds_dict(config: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    raw = read_json_object(Path(config), "DeepSpeed config", "pass a ds_config.json path or a dict")
    _check_ds_types(raw)
    return raw


_DS_SECTIONS = ("pipeline", "zero_optimization", "activation_checkpointing", "fp16", "bf16")
_DS_COUNTS = (("train_batch_size",), ("train_micro_batch_size_per_gpu",), ("gradient_accumulation_steps",),
              ("zero_optimization", "stage"), ("pipeline", "stages"),
              ("activation_checkpointing", "number_checkpoints"))


def _check_ds_types(c: Mapping[str, Any]) -> None:
    """The sections autopar reads are objects and the counts whole numbers (a bool is not one)."""
    for key in _DS_SECTIONS:
        if key in c and not isinstance(c[key], dict):
            raise InputFileError(f"DeepSpeed config key {key!r} must be an object, not {type(c[key]).__name__}")
    for keys in _DS_COUNTS:
        value = c.get(keys[0]) if len(keys) == 1 else c.get(keys[0], {}).get(keys[1])
        if value == "auto" and len(keys) == 1:  # batch keys the Hugging Face Trainer fills (_fill_auto)
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InputFileError(f"DeepSpeed config {'.'.join(keys)} is {clip_repr(value)}; it must be a whole "
                                 "number")


def plan_from_deepspeed_config(config: str | Path | Mapping[str, Any], num_gpus: int, *, seq_len: int,
                               global_batch: int | None = None, mbs: int | None = None) -> ParallelPlan:
    """A plan from a DeepSpeed config on `num_gpus` GPUs. A config does not record the sequence
    length, so the caller gives it; batch keys set to "auto" (Hugging Face Trainer's configs) take
    `global_batch` and `mbs` from the caller. Pipeline stages come from "pipeline": {"stages": n}.
    Without an activation_checkpointing section nothing is recomputed (a Hugging Face model has no
    selective recompute: transformers' gradient checkpointing is whole layers). CPU offload
    (offload_optimizer / offload_param) is refused: autopar does not price the PCIe traffic."""
    c = _ds_dict(config)
    pipeline, zero = _ds_section(c, "pipeline"), _ds_section(c, "zero_optimization")
    _refuse_offload(zero)
    stages = pipeline.get("stages", 1)
    pp = _ds_count(stages, "pipeline.stages", 1, MAX_GPUS) if stages != "auto" else 1
    if num_gpus % pp:
        raise InputFileError(f"pipeline stages {pp} do not divide {num_gpus} GPUs; fix num_gpus or the config")
    dp = num_gpus // pp
    mbs, gas, gbs = _ds_batch(_fill_auto(c, global_batch, mbs), dp)
    stage = _ds_count(zero.get("stage", 0), "zero_optimization.stage", 0, 3)
    if _ds_section(c, "fp16").get("enabled"):
        raise InputFileError("autopar plans bf16 or fp8 training; this DeepSpeed config enables fp16")
    overlap_comm = zero.get("overlap_comm", stage == 3)  # DeepSpeed's default: on for stage 3 only
    prefetch = zero.get("stage3_prefetch_bucket_size", zero.get("prefetch_bucket_size", 5e7))
    fields = {"pp": pp, "mbs": mbs, "global_batch": gbs, "seq_len": seq_len, "zero": stage, "framework": "deepspeed",
              "overlap_grad_reduce": bool(overlap_comm), "recompute": _ds_recompute(c),
              "overlap_param_gather": bool(prefetch) if stage == 3 else stage >= 1}
    try:
        return ParallelPlan(**fields)
    except ValidationError as exc:
        raise InputFileError(one_line(exc, "the DeepSpeed config gives an invalid plan"))


def _refuse_offload(zero: Mapping[str, Any]) -> None:
    """InputFileError for ZeRO-Offload / ZeRO-Infinity (Ren et al. 2021): optimizer states or
    parameters in CPU (or NVMe) memory, moved over PCIe every step, which autopar does not price."""
    for key, what in (("offload_optimizer", "optimizer states"), ("offload_param", "parameters")):
        section = zero.get(key)
        device = section.get("device", "none") if isinstance(section, Mapping) else section
        if device not in (None, "none", False):
            raise InputFileError(f"zero_optimization.{key} (device {clip_repr(device)}) keeps the {what} in host "
                                 "memory and moves them over PCIe each step, which autopar does not price; remove it "
                                 "to score the plan with everything in GPU memory")


_AUTO_KEYS = (("train_batch_size", "global_batch", "--global-batch"),
              ("train_micro_batch_size_per_gpu", "mbs", "--mbs"))


def _fill_auto(c: Mapping[str, Any], global_batch: int | None, mbs: int | None) -> dict[str, Any]:
    """The config with its "auto" batch keys set from the command line (Hugging Face Trainer fills
    them from TrainingArguments); InputFileError naming the option when one is missing."""
    given = {"global_batch": global_batch, "mbs": mbs}
    out = dict(c)
    missing = [option for key, name, option in _AUTO_KEYS if out.get(key) == "auto" and given[name] is None]
    if missing:
        keys = [k for k, _, o in _AUTO_KEYS if o in missing]
        raise InputFileError(f"the DeepSpeed config leaves {' and '.join(keys)} \"auto\" (the Hugging Face Trainer "
                             f"fills {'them' if len(keys) > 1 else 'it'}): give {' and '.join(missing)} on the "
                             "command line, and --seq-len (a DeepSpeed config has no sequence length)")
    for key, name, option in _AUTO_KEYS:
        if out.get(key) == "auto":
            out[key] = given[name]
        elif given[name] is not None and out.get(key) is not None and out[key] != given[name]:
            raise InputFileError(f"the DeepSpeed config sets {key} {clip_repr(out[key])} but {option} is "
                                 f"{given[name]}; drop {option} (it fills only \"auto\" keys) or edit the config")
    if out.get("gradient_accumulation_steps") == "auto":
        out["gradient_accumulation_steps"] = None  # derived from the two batch sizes, as the Trainer does
    return out


def _ds_section(c: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The config's `key` section ({} when absent); InputFileError when it is not a mapping."""
    value = c.get(key, {})
    if not isinstance(value, Mapping):
        raise InputFileError(f"DeepSpeed config key {key!r} must be a mapping of settings, not "
                             f"{type(value).__name__}; fix the config")
    return value


def _ds_count(value: Any, key: str, lowest: int, highest: int) -> int:
    """A whole-number setting from lowest to highest; InputFileError naming the key otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        shown = repr(value) if len(repr(value)) <= 24 else repr(value)[:21] + "..."
        raise InputFileError(f"DeepSpeed config {key} {shown} must be a whole number from {lowest} to {highest:,}; "
                             "fix the config")
    return value


def _ds_batch(c: Mapping[str, Any], dp: int) -> tuple[int, int, int]:
    """(micro batch, accumulation steps, global batch), filled in as DeepSpeed fills them."""
    gbs, mbs, gas = (c.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps"))
    for key, value in (("train_batch_size", gbs), ("train_micro_batch_size_per_gpu", mbs),
                       ("gradient_accumulation_steps", gas)):
        if value is not None and value != "auto":
            _ds_count(value, key, 1, MAX_GLOBAL_BATCH * MAX_GPUS)
    gbs, mbs, gas = (None if v == "auto" else v for v in (gbs, mbs, gas))
    if gbs is not None and mbs is not None and gas is None:
        gas = gbs // (mbs * dp)
    elif gbs is not None and gas is not None and mbs is None:
        mbs = gbs // (gas * dp)
    elif mbs is not None and gbs is None:
        gas = gas or 1
        gbs = mbs * gas * dp
    elif gbs is not None and mbs is None:
        gas, mbs = 1, gbs // dp
    if not (gbs and mbs and gas) or gbs != mbs * gas * dp:
        raise InputFileError(f"DeepSpeed batch keys are inconsistent: train_batch_size {gbs} != micro batch {mbs} "
                             f"x accumulation {gas} x data parallel {dp}; fix the config or num_gpus")
    return mbs, gas, gbs


def _ds_recompute(c: Mapping[str, Any]) -> Recompute:
    interval = c.get("pipeline", {}).get("activation_checkpoint_interval", 0)
    if "activation_checkpointing" not in c and not interval:
        return Recompute(mode="none")
    k = c.get("activation_checkpointing", {}).get("number_checkpoints")
    return Recompute(mode="full", num_layers=k)
