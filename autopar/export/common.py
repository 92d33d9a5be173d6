"""What every exporter shares: the plan checked against the target framework, the layer split,
the node shape, and the bash that launches one process group per node."""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from autopar.cost.layout import Layout
from autopar.errors import AutoparError, ExportError
from autopar.schema.plan import ParallelPlan, plan_violations
from autopar.schema.plan_file import PlanFile

DEFAULT_GPUS_PER_NODE = 8  # HGX/DGX boards; used when the plan's cluster profile cannot be loaded


def require_exportable(pf: PlanFile, framework: str) -> ParallelPlan:
    """The plan with `framework` as its target (ParallelPlan.for_framework: resolved under it), or
    ExportError listing every broken invariant."""
    plan = pf.parallel if pf.parallel.framework == framework else pf.parallel.for_framework(framework)
    spec = pf.target.model_spec
    problems = plan_violations(plan, num_gpus=pf.target.gpus, num_layers=spec.num_layers,
                               num_heads=spec.num_attention_heads, num_kv_heads=spec.kv_heads,
                               num_experts=spec.moe.num_experts if spec.moe else 0, **spec.mixer_counts())
    if problems:
        raise ExportError(f"cannot export this plan to {framework}: " + "; ".join(problems))
    return plan


def refuse(framework: str, reasons: Sequence[str]) -> None:
    """ExportError naming every reason `framework` cannot express the plan (no-op when empty)."""
    if reasons:
        raise ExportError(f"{framework} cannot express this plan: " + "; ".join(reasons))


def plan_layout(pf: PlanFile, plan: ParallelPlan | None = None, gpus_per_node: int | None = None) -> Layout:
    """The Layout of the plan file's plan (or `plan`, e.g. retargeted) on its GPUs; the node size is
    `gpus_per_node`, else the cluster profile's, else DEFAULT_GPUS_PER_NODE when the profile cannot
    be loaded."""
    from autopar.hardware import load_profile  # local: the exporters work without a loadable profile

    per_node = gpus_per_node
    if per_node is None:
        try:
            per_node = load_profile(pf.target.cluster).node.gpus_per_node
        except (AutoparError, OSError, ValueError):
            per_node = DEFAULT_GPUS_PER_NODE
    spec = pf.target.model_spec
    return Layout.build(plan or pf.parallel, pf.target.gpus, per_node, spec.num_layers, spec.tie_embeddings)


def layer_counts(pf: PlanFile) -> tuple[int, ...]:
    """Decoder layers per virtual stage in execution order (the plan's, or autopar's default split)."""
    return plan_layout(pf).stage_counts


def node_shape(pf: PlanFile) -> tuple[int, int]:
    """(GPUs per node, nodes) for the launcher: the cluster profile's node size, capped at the GPU count."""
    return plan_layout(pf).launch_shape


# The only words a script leaves unquoted: its own variables, "$NAME" (the exporters' path settings).
_OWN_VARIABLE = re.compile(r'"\$[A-Z_][A-Z0-9_]*"')


def shell_word(arg: str) -> str:
    """`arg` for a bash command line: one of the script's own "$VARIABLE" references as it is, anything
    else shell-quoted (a value from a file can never become a command)."""
    return arg if _OWN_VARIABLE.fullmatch(arg) else shlex.quote(arg)


def comment_safe(text: object) -> str:
    """`text` for a comment or docstring of a generated file: on one line, every character that is
    not printable (a newline would end the comment and start a command) written as its escape."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text))


def bash_array(name: str, args: Sequence[str], per_line: int = 2) -> str:
    """`NAME=( ... )` with flag/value pairs on one line each, every word shell-quoted (shell_word)."""
    lines, current = [], []
    for arg in args:
        if arg.startswith("--") and current:
            lines.append(" ".join(current))
            current = []
        current.append(shell_word(arg))
    if current:
        lines.append(" ".join(current))
    body = "\n".join(f"    {line}" for line in lines)
    return f"{name}=(\n{body}\n)"


def header(pf: PlanFile, framework: str, what: str) -> str:
    plan, spec = pf.parallel, pf.target.model_spec
    dp = plan_layout(pf).dp
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# {what} for {comment_safe(spec.name)} on {pf.target.gpus} GPUs ({comment_safe(pf.target.cluster)}), "
        f"written by autopar {comment_safe(pf.autopar_version)} plan schema {pf.schema_version}.",
        f"# Plan: {plan.layout()} dp{dp}, micro batch {plan.mbs}, global batch {plan.global_batch} sequences of "
        f"{plan.seq_len} tokens, zero {plan.zero}, recompute {plan.recompute.label(plan.framework)}, {plan.precision}.",
        f"# Target framework: {framework}. Lines marked '<-- SET' name your paths; everything else is the plan.",
        "set -euo pipefail",
    ])


def cluster_block(pf: PlanFile, default_port: int, per_node: bool = True) -> str:
    """NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, GPUS_PER_NODE from the environment, with the
    plan's node shape as defaults, and a check that they multiply to the planned GPU count.
    per_node: the script runs once per node (torchrun), else once (a launcher that reaches every node)."""
    gpus_per_node, nodes = node_shape(pf)
    gpus = pf.target.gpus
    how = ("run this script once per node (same MASTER_ADDR, NODE_RANK 0..NNODES-1)" if per_node
           else "run this script once, on the first node; the launcher reaches the others")
    return "\n".join([
        f"# ---- Cluster: {how} ----",
        f'GPUS_PER_NODE="${{GPUS_PER_NODE:-{gpus_per_node}}}"',
        f'NNODES="${{NNODES:-{nodes}}}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        f'MASTER_PORT="${{MASTER_PORT:-{default_port}}}"',
        "WORLD_SIZE=$((GPUS_PER_NODE * NNODES))",
        f'if [ "$WORLD_SIZE" -ne {gpus} ]; then',
        f'    echo "this plan is for {gpus} GPUs, but GPUS_PER_NODE x NNODES = $WORLD_SIZE" >&2',
        "    exit 1",
        "fi",
    ])


TORCHRUN = ('torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \\\n'
            '    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"')


LARGE_MODEL_PARAMS = 20e9  # above it Llama 2's 34B/70B peak learning rate


def model_params(pf: PlanFile) -> int:
    """Parameters of the plan file's model (autopar.model's graph)."""
    from autopar.model import build_graph

    return build_graph(pf.target.model_spec).total_params


def peak_lr(params: int) -> float:
    """The peak learning rate a launch file proposes (marked <-- SET): Llama 2's (Touvron et al. 2023,
    arXiv 2307.09288, sec. 2.2, Table 1), 3e-4 for its 7B/13B models and 1.5e-4 for 34B/70B."""
    return 1.5e-4 if params > LARGE_MODEL_PARAMS else 3e-4


FALLBACK_CHECKPOINT_INTERVAL_STEPS = 1000  # a plan file without a step time: a round number, as before


def _whole_number(value, highest: int) -> int | None:
    """A file's value when it is a whole number from 1 to `highest`, else None (ignored)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= highest
    return value if ok else None


def checkpoint_schedule(pf: PlanFile) -> tuple[int, bool, int | None]:
    """(checkpoint interval in steps, asynchronous save, training steps or None) for the launch
    files: the plan file's whole-run block (`autopar plan --train-tokens`, autopar.cost.run) when
    it has one; else the interval that maximises goodput under autopar.cost.run's defaults for this
    model, framework, GPU count and estimated step time; else FALLBACK_CHECKPOINT_INTERVAL_STEPS."""
    import math

    from autopar.cost import run as whole
    from autopar.frameworks import framework_spec

    record = pf.estimate or {}
    block = record.get("run") if isinstance(record.get("run"), dict) else {}
    interval = _whole_number(block.get("checkpoint_interval_steps"), 10**9)
    steps = _whole_number(block.get("steps"), 10**12)
    async_save = block.get("async_save") is True and framework_spec(pf.parallel.framework).async_checkpoint
    if interval is not None:
        return interval, async_save, steps
    step_s = record.get("step_time_s")
    if not (isinstance(step_s, (int, float)) and not isinstance(step_s, bool) and math.isfinite(step_s)
            and 1e-6 < step_s < 1e7):
        return FALLBACK_CHECKPOINT_INTERVAL_STEPS, False, None
    from autopar.model import build_graph

    params = build_graph(pf.target.model_spec).total_params
    total = whole.checkpoint_bytes(params, framework_spec(pf.parallel.framework).checkpoint_bytes_per_param)
    storage = whole.DEFAULT_CHECKPOINT_BYTES_PER_S
    blocking = whole.checkpoint_write_s(total, storage)
    mtbf = whole.job_mtbf_s(whole.DEFAULT_FAILURES_PER_GPU_DAY, pf.target.gpus)
    restart = whole.restart_s(whole.DEFAULT_RESTART_S, total, storage)
    return max(1, round(whole.optimal_interval_s(blocking, mtbf, restart) / step_s)), False, None

