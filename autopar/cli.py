"""The `autopar` command line: parse, call autopar.api, render (Rich table or --json).

Every AutoparError becomes one line on stderr and exit code 2; no traceback reaches a user.
"""

import importlib
import os
import sys
from collections.abc import MutableMapping
from enum import Enum
from typing import Annotated, Any, Callable, Optional

import typer
import typer.core
from typer.core import TyperCommand, TyperGroup

from autopar.choices import DEFAULT_MEMORY_MARGIN, Framework, Precision, RecomputeMode
from autopar.cli_coercion import FastParams
from autopar.errors import AutoparError
from autopar.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_HELD_OUT_FITS, MAX_LAYERS, MAX_SEQ_LEN, clip


class _Lazy:
    """A module imported on first attribute access: `autopar --help` and `autopar models` must not
    pay for the cost model, NumPy, Pydantic schemas, Rich consoles or OR-Tools (issue 15)."""

    def __init__(self, name: str, make: Callable[[], Any] | None = None) -> None:
        self._name, self._make, self._obj = name, make, None

    def __getattr__(self, attr: str) -> Any:
        if self._obj is None:
            self._obj = self._make() if self._make else importlib.import_module(self._name)
        return getattr(self._obj, attr)


def _console(**kwargs: Any) -> Callable[[], Any]:
    def make() -> Any:
        from rich.console import Console

        return Console(highlight=False, emoji=False, **kwargs)  # no :name: emoji codes in our output
    return make


api: Any = _Lazy("autopar.api")
listings: Any = _Lazy("autopar.listings")  # api's models() and clusters(), without the cost model
records: Any = _Lazy("autopar.report.records")
tables: Any = _Lazy("autopar.report.tables")

MAX_MESSAGE_CHARS = 1000  # an error line longer than this is cut (every echoed value is already ≤ 80)
# The Click that Typer runs on: Typer >= 0.20 vendors it as typer._click, older Typer imports click.
click = getattr(typer.core, "_click", None) or getattr(typer.core, "click")


class _Command(FastParams, TyperCommand):
    """Every autopar command: Typer's, with option values converted without Pydantic where that
    gives Pydantic's result (autopar.cli_coercion; issue 15: start-up)."""


def _print_version() -> None:
    """`autopar --version`: the installed distribution's version (importlib.metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("autopar")
    except PackageNotFoundError:  # run from a checkout that was never installed
        text = "unknown (not installed; pip install .)"
    click.echo(f"autopar {text}")


class _OneLineErrors(FastParams, TyperGroup):
    """Click/Typer usage errors (a bad option value, a missing or unknown option) as one line on
    stderr and exit code 2, through the same renderer as autopar's own errors. `--version` prints
    the installed version."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if list(sys.argv[1:] if args is None else args) == ["--version"]:
            _print_version()
            sys.exit(0)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `autopar`: the help, as before
            click.echo(exc.ctx.get_help())
            sys.exit(exc.exit_code)
        except click.exceptions.UsageError as exc:
            sub = exc.ctx.info_name if exc.ctx is not None and exc.ctx.parent is not None else None
            hint = f"see `autopar {sub} --help`" if sub else "see `autopar --help`"
            print_error(f"{exc.format_message().rstrip('.')}; {hint}")
            sys.exit(2)
        except click.exceptions.ClickException as exc:
            print_error(exc.format_message())
            sys.exit(2)
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        """The command; Ctrl-C is one line and exit code 130 (Typer would exit 130 without a word)."""
        out._obj = None  # made again for this command: its width reads COLUMNS as it is now
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            print_error("interrupted")
            raise typer.Exit(130) from None


class _Typer(typer.Typer):
    """typer.Typer whose commands are _Command unless a command names its own class."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or _Command, **kwargs)


_APP_SETTINGS: dict[str, Any] = dict(
    cls=_OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, help="autopar: plan how to split an LLM over GPUs, before a GPU is touched. "
                                "`autopar --version` prints the installed version.")
app = _Typer(**_APP_SETTINGS)
def _out_width() -> int | None:
    """The width tables are laid out for: COLUMNS when set (also when piped), else the terminal's,
    else 120 (a pipe or file has no width of its own)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), 40)
    return None if sys.stdout.isatty() else 120


out: Any = _Lazy("out", lambda: _console(width=_out_width())())
err: Any = _Lazy("err", _console(stderr=True))


def render_error(message: str) -> str:
    """One line: whitespace collapsed, any word over 80 characters clipped, at most MAX_MESSAGE_CHARS."""
    words = " ".join(clip(w) for w in str(message).split())
    return clip(words, MAX_MESSAGE_CHARS)


def print_error(message: str) -> None:
    """`error: message` as one line on stderr (the one renderer of every error autopar prints)."""
    from rich.text import Text

    err.print(Text.assemble(("error:", "bold red"), " ", render_error(message)), soft_wrap=True)


def print_warning(message: str) -> None:
    """`warning: message` as one line on stderr: the command goes on."""
    from rich.text import Text

    err.print(Text.assemble(("warning:", "bold yellow"), " ", render_error(message)), soft_wrap=True)


def _warn_cost_model(cluster: str | None, cost_model: str | None) -> None:
    """A warning when --cost-model names a model for another GPU than the cluster's (a bad name or
    file is reported by the command itself, as one error line)."""
    if not cluster or not cost_model:
        return
    try:
        message = api.cost_model_gpu_warning(cluster, cost_model)
    except AutoparError:
        return
    if message:
        print_warning(message)


def fail(message: str, code: int = 2):
    """Print the error line and exit with `code` (2: a bad input)."""
    print_error(message)
    raise typer.Exit(code)


def _finite_margin(value: float | None) -> float | None:
    if value is not None and value != value:  # NaN passes Click's range check
        raise typer.BadParameter("nan is not a number; use a fraction from 0 to 0.9")
    return value


ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help="A preset name (see `autopar models`), a Hugging Face config.json, or a YAML layer-graph file.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="A cluster profile name (see `autopar clusters`) or a YAML file.")]
GpusOpt = Annotated[int, typer.Option("--gpus", "-n", min=1, max=MAX_GPUS, help="Number of GPUs; must fill whole nodes unless it is less than one node.")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq-len", "-s", min=1, max=MAX_SEQ_LEN, help="Sequence length in tokens; default: the model's.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files (refused otherwise).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
CostModelOpt = Annotated[Optional[str], typer.Option("--cost-model", help="A shipped cost model name or a cost-model JSON file; default: the one for the cluster's GPU.")]


def _choice(choices: type[Enum] | tuple[str, ...], option: str) -> Callable[[Any], Any]:
    """An option callback: the value as the enum member (or the string), or one line on stderr and
    exit code 2 naming the choices. The one check of every fixed-choice option."""
    names = tuple(c.value for c in choices) if isinstance(choices, type) else choices

    def check(value: Any) -> Any:
        if value is None:
            return None
        if value not in names:
            fail(f"{option} {clip(repr(value))} is not one of {', '.join(names)}; pick one of them")
        return choices(value) if isinstance(choices, type) else value

    return check


_FW_HELP = "Target framework whose memory layout, limits and launch format apply: megatron, deepspeed or torchtitan."
FrameworkOpt = Annotated[str, typer.Option("--framework", help=_FW_HELP, callback=_choice(Framework, "--framework"))]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="bf16, fp8, mxfp8, nvfp4 or mxfp4 (your choice; not searched); a format the GPU or framework lacks is refused.", callback=_choice(Precision, "--precision"))]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="Activation recomputation: none, selective or full.", callback=_choice(RecomputeMode, "--recompute"))]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="megatron (launch script), deepspeed (ds_config.json + launcher) or torchtitan (launch command).", callback=_choice(Framework, "--format"))]
MarginOpt = Annotated[float, typer.Option("--memory-margin", min=0.0, max=0.9, callback=_finite_margin, help=f"Fraction of HBM kept free when judging whether a plan fits; default {DEFAULT_MEMORY_MARGIN:g} (allocator spikes, NCCL growth). plan, estimate, compare, explain and sweep share it.")]
TrainTokensOpt = Annotated[Optional[str], typer.Option("--train-tokens", help="Price the whole run to this many training tokens (15.6T, 500B, 2e12): days, GPU-hours, cost, interruptions, checkpoints and goodput.")]
GpuHourCostOpt = Annotated[Optional[float], typer.Option("--gpu-hour-cost", help="Price of one GPU-hour in USD, for the run's cost (with --train-tokens).")]
FailureRateOpt = Annotated[Optional[float], typer.Option("--failure-rate", help="Job interruptions per GPU-day; default 5.27e-4, Llama 3's 466 interruptions in 54 days on 16,384 GPUs (with --train-tokens).")]
CheckpointBwOpt = Annotated[Optional[float], typer.Option("--checkpoint-gb-per-s", help="Storage write and read bandwidth the job's checkpoints get, GB/s; default 2000, Llama 3's Tectonic sustained throughput (with --train-tokens).")]
RestartOpt = Annotated[Optional[float], typer.Option("--restart-minutes", help="Minutes to relaunch after an interruption, before the checkpoint is read back; default 10, an assumption (with --train-tokens).")]
AsyncSaveOpt = Annotated[bool, typer.Option("--async-save", help="Save checkpoints in the background (Megatron --async-save, torchtitan async checkpointing): only the copy to host memory blocks (with --train-tokens).")]
CheckpointMinutesOpt = Annotated[Optional[float], typer.Option("--checkpoint-minutes", help="Checkpoint every this many minutes instead of the interval that maximises goodput (with --train-tokens).")]


def _run(fn: Callable[[], Any]) -> Any:
    """Call fn; map domain errors to one line and exit code 2."""
    try:
        return fn()
    except AutoparError as exc:
        fail(str(exc))
    except Exception as exc:
        pydantic = sys.modules.get("pydantic")  # not imported: fn validated nothing, so nothing to map
        if pydantic is None or not isinstance(exc, pydantic.ValidationError):
            raise
        fail(api.one_line(exc, "invalid value"))  # a boundary model rejected a value the CLI passed through


def _check_outputs(paths: list[str], force: bool, inputs: list[str] = ()) -> None:
    """Refuse, before any work, outputs that exist (without --force), cannot be files or be written
    there, name one file twice or are one of the command's `inputs` (_inputs)."""
    _run(lambda: api.check_outputs(paths, force, inputs))


def _inputs(*paths: str | None) -> list[str]:
    """The command's input paths, for its outputs to be checked against (a model folder: its
    config.json); names that are no file (presets, shipped profiles) are skipped by autopar.io."""
    return [os.path.join(p, "config.json") if os.path.isdir(os.path.expanduser(p)) else p
            for p in paths if p and p != "-"]


def _given(ctx: typer.Context, *names: str) -> list[str]:
    """The flags of the options among `names` that the command line gives (not left at a default)."""
    return [p.opts[0] for p in ctx.command.params if p.name in names
            and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]


def _refuse_unused(ctx: typer.Context, names: tuple[str, ...], why: str | tuple[str, str], other: str = "") -> None:
    """One line and exit 2 when any option of `names` is given: `why` (for one option, for several)
    says why it would be ignored, `other` another fix beside dropping it."""
    given = _given(ctx, *names)
    if given:
        listed = ", ".join(given)
        one, many = (why, why) if isinstance(why, str) else why
        fail(f"{listed} {one if len(given) == 1 else many}, so {'it' if len(given) == 1 else 'they'} would be "
             f"ignored; drop {listed}" + (f" or {other}" if other else ""))


def _merge_fix(fixes: list[str] | None) -> str | None:
    """Every --fix given, merged into one 'axis=value,...' string: `--fix tp=8 --fix pp=4` pins
    both, the same pin twice is one; an axis pinned to two values is refused (its syntax is
    checked later, by the search)."""
    if not fixes:
        return None
    axis_to_value: dict[str, str] = {}
    for part in (p.strip() for text in fixes for p in text.split(",")):
        axis, _, value = part.partition("=")
        axis, value = axis.strip(), value.strip()
        if axis in axis_to_value and axis_to_value[axis] != value:
            fail(f"--fix pins {clip(axis)} twice, to {clip(axis_to_value[axis])} and {clip(value)}; "
                 f"give one --fix {clip(axis)}=VALUE")
        if part and axis not in axis_to_value:
            axis_to_value[axis] = value
    return ",".join(f"{a}={v}" for a, v in axis_to_value.items()) or None


def _pins_tp(fix: str | None) -> bool:
    """Whether a --fix string pins tp (its syntax is checked later, by the search)."""
    return bool(fix) and any(part.split("=", 1)[0].strip() == "tp" for part in fix.split(","))


def _emit_json(data: Any) -> None:
    """`data` as JSON; a number that is not finite (JSON has none) is written as null."""
    import json

    try:
        text = json.dumps(data, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    sys.stdout.write(text + "\n")


def _finite(data: Any) -> Any:
    """`data` with every non-finite float replaced by None."""
    import math

    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


@app.command()
def models(as_json: JsonOpt = False) -> None:
    """List the model presets."""
    rows = _run(listings.models)
    if as_json:
        _emit_json({"models": rows})
    else:
        tables.print_table(out, tables.models_table(rows))


@app.command()
def clusters(as_json: JsonOpt = False) -> None:
    """List the shipped cluster profiles."""
    rows = _run(listings.clusters)
    if as_json:
        _emit_json({"clusters": rows})
    else:
        tables.print_table(out, tables.clusters_table(rows))


@app.command()
def inspect(
    model: ModelArg,
    seq_len: SeqOpt = None,
    dp: Annotated[int, typer.Option("--dp", min=1, max=MAX_GPUS, help="Data-parallel degree used to shard model states under ZeRO.")] = 1,
    framework: FrameworkOpt = Framework.MEGATRON.value,
    as_json: JsonOpt = False,
) -> None:
    """Show a model's parameters, FLOPs per token, model-state memory by ZeRO stage and activations."""
    info = _run(lambda: api.inspect(model, seq_len, dp, framework))
    if as_json:
        _emit_json(info)
    else:
        tables.print_inspect(out, info)


# What an imported config decides, so an option beside --from-megatron/--from-deepspeed would be ignored.
_IMPORT_DECIDES = ("global_batch", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "sp", "recompute",
                   "recompute_layers", "recompute_modules", "precision", "framework", "tp_comm_overlap",
                   "torch_compile", "cp_comm_type", "layers_per_stage")


def _refuse_ignored_layout(ctx: typer.Context, source: str) -> None:
    """Refuse layout options given beside an imported config (the config decides them)."""
    decides = _IMPORT_DECIDES + (("seq_len",) if source == "--from-megatron" else ())
    if source == "--from-deepspeed":  # they fill a config's "auto" batch keys (Hugging Face Trainer configs)
        decides = tuple(d for d in decides if d not in ("global_batch", "mbs"))
    given = [p for p in ctx.command.params if p.name in decides
             and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
    if given:
        names = ", ".join(p.opts[0] for p in given)
        fail(f"{source} sets the layout, so {names} would be ignored; drop {names}, or edit the imported config")


def _run_opts(train_tokens, gpu_hour_cost, failure_rate, checkpoint_gb_per_s, restart_minutes, async_save,
              checkpoint_minutes):
    """The whole-run options (api.run_options), refused in one line before any work."""
    return _run(lambda: api.run_options(train_tokens, gpu_hour_cost=gpu_hour_cost, failure_rate=failure_rate,
                                        checkpoint_gb_per_s=checkpoint_gb_per_s, restart_minutes=restart_minutes,
                                        async_save=async_save, checkpoint_minutes=checkpoint_minutes))


_RUN_ARGS = ("train_tokens", "gpu_hour_cost", "failure_rate", "checkpoint_gb_per_s", "restart_minutes", "async_save",
             "checkpoint_minutes")


def _int_list(text: str | None, option: str) -> tuple[int, ...] | None:
    """'10,10,11,9' -> (10, 10, 11, 9), with a one-line error for anything else."""
    if text is None:
        return None
    parts = [x.strip() for x in text.split(",")]
    if not parts or not all(x.isascii() and x.isdigit() and len(x) <= 7 for x in parts):
        fail(f"{option} {clip(text)!r} must be whole numbers separated by commas, e.g. 10,10,11,9")
    return tuple(int(x) for x in parts)


@app.command()
def estimate(
    ctx: typer.Context,
    cluster: ClusterOpt,
    gpus: GpusOpt,
    model: Annotated[Optional[str], typer.Argument(metavar="[MODEL]", help="A preset name (see `autopar models`), a Hugging Face config.json, or a YAML layer-graph file; optional with --from-megatron, whose flags then describe the model.")] = None,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", "-b", min=1, max=MAX_GLOBAL_BATCH, help="Global batch size in sequences (required unless imported).")] = None,
    seq_len: SeqOpt = None,
    from_megatron: Annotated[Optional[str], typer.Option("--from-megatron", help="Score an existing Megatron-LM config: its pretrain_gpt.py arguments, or a launch script path.")] = None,
    from_deepspeed: Annotated[Optional[str], typer.Option("--from-deepspeed", help="Score an existing DeepSpeed ds_config.json (data parallel + ZeRO).")] = None,
    tp: Annotated[int, typer.Option("--tp", min=1, max=MAX_GPUS, help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, max=MAX_GPUS, help="Pipeline-parallel degree.")] = 1,
    cp: Annotated[int, typer.Option("--cp", min=1, max=MAX_GPUS, help="Context-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", min=1, max=MAX_GPUS, help="Expert-parallel degree (MoE models).")] = 1,
    etp: Annotated[Optional[int], typer.Option("--etp", min=1, max=MAX_GPUS, help="Expert tensor-parallel degree; default: tp.")] = None,
    vpp: Annotated[int, typer.Option("--vpp", min=1, max=MAX_LAYERS, help="Virtual stages per pipeline rank (interleaved 1F1B when > 1).")] = 1,
    mbs: Annotated[int, typer.Option("--mbs", min=1, max=MAX_GLOBAL_BATCH, help="Micro-batch size in sequences.")] = 1,
    zero: Annotated[Optional[int], typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3; default: 1 (Megatron distributed optimizer), 3 for torchtitan.")] = None,
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallelism; default: on when tp > 1.")] = None,
    recompute: RecomputeOpt = RecomputeMode.SELECTIVE.value,
    recompute_layers: Annotated[Optional[int], typer.Option("--recompute-layers", min=0, max=MAX_LAYERS, help="With --recompute full: layers per virtual stage recomputed; default: all.")] = None,
    recompute_modules: Annotated[str, typer.Option("--recompute-modules", help="With --recompute selective: comma-separated modules (core_attn, mlp, layernorm, moe, moe_act, shared_experts, mla_up_proj).")] = "core_attn",
    precision: PrecisionOpt = Precision.BF16.value,
    framework: FrameworkOpt = Framework.MEGATRON.value,
    tp_comm_overlap: Annotated[bool, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap TP communication with GEMMs (needs sp).")] = False,
    torch_compile: Annotated[Optional[bool], typer.Option("--torch-compile/--no-torch-compile", help="torchtitan: compile each block (fused norms, RoPE, activation; the default); off = eager PyTorch.")] = None,
    cp_comm_type: Annotated[Optional[str], typer.Option("--cp-comm-type", help="Context-parallel K/V exchange (Megatron --cp-comm-type): p2p, a2a or allgather; default: the framework's (torchtitan allgather, else p2p).", callback=_choice(("p2p", "a2a", "allgather"), "--cp-comm-type"))] = None,
    layers_per_stage: Annotated[Optional[str], typer.Option("--layers-per-stage", help="Decoder layers of each virtual stage in execution order, comma-separated (pp·vpp entries), as plan lists them; default: an even split.")] = None,
    memory_margin: MarginOpt = DEFAULT_MEMORY_MARGIN,
    cost_model: CostModelOpt = None,
    train_tokens: TrainTokensOpt = None,
    gpu_hour_cost: GpuHourCostOpt = None,
    failure_rate: FailureRateOpt = None,
    checkpoint_gb_per_s: CheckpointBwOpt = None,
    restart_minutes: RestartOpt = None,
    async_save: AsyncSaveOpt = False,
    checkpoint_minutes: CheckpointMinutesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Predict step time, throughput, MFU and per-stage memory of one plan."""
    if from_megatron or from_deepspeed:
        _refuse_ignored_layout(ctx, "--from-megatron" if from_megatron else "--from-deepspeed")
    elif cp == 1:
        _refuse_unused(ctx, ("cp_comm_type",), "sets how context-parallel ranks exchange K/V, and --cp is 1",
                       "set --cp above 1")
    _warn_cost_model(cluster, cost_model)

    if model is None and not from_megatron:
        fail("give MODEL (a preset, config.json or YAML file), or --from-megatron with a script whose flags describe "
             "the model")
    inferred = None

    def run():
        nonlocal inferred
        if model is None:  # the model the script's own flags describe
            for note in api.import_notes(from_megatron):
                print_warning(note)
            plan, est, inferred = api.estimate_launch(from_megatron, cluster, gpus, cost_model, memory_margin)
            return plan, est
        if from_megatron or from_deepspeed:
            typed = ctx.get_parameter_source("mbs") is click.core.ParameterSource.COMMANDLINE
            plan = api.imported_plan(from_megatron, from_deepspeed, gpus, seq_len, model,
                                     global_batch=global_batch, mbs=mbs if typed else None)
            for note in api.import_notes(from_megatron):
                print_warning(note)
            return plan, api.estimate_plan(model, cluster, gpus, plan, cost_model, memory_margin)
        if global_batch is None:
            raise AutoparError("--global-batch is required (or import a config with --from-megatron/--from-deepspeed)")
        seq = seq_len or api.load_model(model).spec.seq_length
        plan = api.make_plan(
            tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, global_batch=global_batch, seq_len=seq,
            zero=zero, sp=sp,
            recompute={"mode": recompute, "modules": tuple(m for m in recompute_modules.split(",") if m),
                       "num_layers": recompute_layers},
            precision=precision, framework=framework, tp_comm_overlap=tp_comm_overlap, torch_compile=torch_compile,
            cp_comm_type=cp_comm_type, layers_per_stage=_int_list(layers_per_stage, "--layers-per-stage"))
        return plan, api.estimate_plan(model, cluster, gpus, plan, cost_model, memory_margin)

    opts = _run_opts(train_tokens, gpu_hour_cost, failure_rate, checkpoint_gb_per_s, restart_minutes, async_save,
                     checkpoint_minutes)
    plan, est = _run(run)
    whole = _run(lambda: api.run_for(model or inferred, cluster, gpus, plan, est, opts)) if opts else None
    if as_json:
        _emit_json({"parallel": records.plan_to_dict(plan, gpus), **records.estimate_to_dict(est, plan),
                    **({"run": whole} if whole else {})})
    else:
        tables.print_estimate(out, plan, est)
        if whole:
            tables.print_run(out, whole)


FromLogOpt = Annotated[Optional[list[str]], typer.Option("--from-log", help="A Megatron-LM, torchtitan or DeepSpeed training log (repeatable): its plan from the logged arguments or config, its step time the median over the logged steps after warm-up (the first max(2, 10 %) dropped), its peak memory where the log has it.")]
LogClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="With --from-log: the cluster profile (name or YAML) the logged runs ran on; logs do not record the hardware.")]
LogModelOpt = Annotated[Optional[str], typer.Option("--model", help="With --from-log: the model the logs train; default: the preset the logged arguments (Megatron-LM) or model name (torchtitan) match. DeepSpeed logs need it.")]
LogFrameworkOpt = Annotated[Optional[str], typer.Option("--framework", help="With --from-log: megatron, torchtitan or deepspeed, the framework that wrote the logs (a log of another is refused); default: recognised from each log.", callback=_choice(Framework, "--framework"))]
LogSeqOpt = Annotated[Optional[int], typer.Option("--seq-len", "-s", min=1, max=MAX_SEQ_LEN, help="With --from-log: the sequence length of DeepSpeed runs, which their config does not record; default: the model's.")]


def _log_options(ctx: typer.Context, from_log: list[str] | None, cluster: str | None, model: str | None,
                 framework: Any, seq_len: int | None) -> dict[str, Any]:
    """The keywords of api.log_runs; without --from-log, its options are refused as unused."""
    if not from_log:
        _refuse_unused(ctx, ("log_cluster", "log_model", "log_framework", "log_seq_len"),
                       ("applies only with --from-log", "apply only with --from-log"), "add --from-log LOG")
        return {}
    if cluster is None:
        fail("--from-log needs --cluster: a training log does not record the hardware it ran on; add --cluster NAME "
             "(see `autopar clusters`) or a profile YAML")
    return {"cluster": cluster, "model": model, "seq_len": seq_len,
            "framework": None if framework is None else str(getattr(framework, "value", framework))}


def _print_logs_read(read: list[dict[str, Any]], rule: str) -> None:
    """One line per training log: what was recognised and the step time kept."""
    for r in read:
        out.print(f"{r['log']}: {r['framework']} {r['release']}, {r['model']} on {r['gpus']} GPUs, "
                  f"{r['steps_used']} of {r['step_lines']} step lines, median step {r['measured_step_time_s']:.4g} s"
                  + (f", peak memory {r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] else ""))
    out.print(f"warm-up: {rule}")


@app.command()
def validate(
    ctx: typer.Context,
    split: Annotated[str, typer.Option("--split", help="Which runs to score: holdout (a third of each source's model shapes), fit, or all. The shipped cost models are fitted on every split: the error on unseen data is --leave-one-source-out's.", callback=_choice(("holdout", "fit", "all"), "--split"))] = "holdout",
    source: Annotated[Optional[list[str]], typer.Option("--source", help="Only this data source (repeatable), e.g. vtrain-multi, narayanan21.")] = None,
    cost_model: CostModelOpt = None,
    summary_only: Annotated[bool, typer.Option("--summary-only", help="Print only the error summaries, not every run.")] = False,
    leave_one_source_out: Annotated[bool, typer.Option("--leave-one-source-out", help="For every source, refit the cost model without it and score that source: the error to expect on a new source.")] = False,
    iters: Annotated[int, typer.Option("--iters", help="Nelder-Mead iterations of each leave-one-source-out refit (fewer is faster and rougher).", min=0, max=10000)] = 40,
    runs: Annotated[Optional[str], typer.Option("--runs", help="Instead of the shipped runs, a runs YAML of your own measured runs (format: autopar/schema/runs.py, as for `autopar calibrate`): each is predicted with the plan it states, and its error reported by source, regime and framework, with peak memory where you give it.")] = None,
    from_log: FromLogOpt = None,
    log_cluster: LogClusterOpt = None,
    log_model: LogModelOpt = None,
    log_framework: LogFrameworkOpt = None,
    log_seq_len: LogSeqOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare predicted with measured tokens/s/GPU on the shipped measured runs, or on your own (--runs, --from-log)."""
    if from_log:
        _refuse_unused(ctx, ("runs", "split", "source", "leave_one_source_out", "iters"),
                       tuple(f"{verb} the runs to score, and --from-log scores the runs of its logs"
                             for verb in ("selects", "select")))
        if as_json:
            _refuse_unused(ctx, ("summary_only",), "shortens the tables, and --json prints every run")
        kw = _log_options(ctx, from_log, log_cluster, log_model, log_framework, log_seq_len)
        result = _run(lambda: api.validate_logs(from_log, **kw, cost_model=cost_model))
        if as_json:
            _emit_json(result)
            return
        _print_logs_read(result["logs"], result["warmup_rule"])
        tables.print_validate(out, result, rows=not summary_only)
        return
    _log_options(ctx, from_log, log_cluster, log_model, log_framework, log_seq_len)
    if runs is not None:
        given = [p.opts[0] for p in ctx.command.params if p.name in ("split", "source", "leave_one_source_out", "iters")
                 and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
        if given:
            names = ", ".join(given)
            fail(f"{names} {'select' if len(given) > 1 else 'selects'} among the shipped runs; drop {names} with --runs")
        if as_json:
            _refuse_unused(ctx, ("summary_only",), "shortens the tables, and --json prints every run")
        result = _run(lambda: api.validate_runs(runs, cost_model))
        if as_json:
            _emit_json(result)
        else:
            tables.print_validate(out, result, rows=not summary_only)
        return
    if leave_one_source_out:
        _refuse_unused(ctx, ("split", "cost_model", "summary_only"),
                       tuple(f"{verb} not apply to --leave-one-source-out, which scores every split with refits of the "
                             "shipped cost models and prints only summaries" for verb in ("does", "do")))
        result = _run(lambda: api.leave_one_source_out(iters, set(source) if source else None))
        if as_json:
            _emit_json(result)
        else:
            tables.print_loso(out, result)
        return
    _refuse_unused(ctx, ("iters",), "sets the refits of --leave-one-source-out, which is not given",
                   "add --leave-one-source-out")
    if as_json:
        _refuse_unused(ctx, ("summary_only",), "shortens the tables, and --json prints every run")
    result = _run(lambda: api.validate(split, set(source) if source else None, cost_model))
    if as_json:
        _emit_json(result)
    else:
        tables.print_validate(out, result, rows=not summary_only)


@app.command()
def calibrate(
    ctx: typer.Context,
    runs: Annotated[str, typer.Argument(help="'builtin' for the shipped measured runs, or a runs YAML of your own measured step times (format: autopar/schema/runs.py).")] = "builtin",
    gpu: Annotated[str, typer.Option("--gpu", help="GPU family whose runs to fit: a100 or h100.")] = "a100",
    base: Annotated[Optional[str], typer.Option("--base", help="Cost model to start from (name or path); default: the shipped one of the runs' GPU (of --gpu for builtin; a100 for --derive-as).")] = None,
    out_path: Annotated[str, typer.Option("--out", help="Where to write the calibrated cost-model JSON.")] = "calibrated.json",
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=100, help="Alternations of plan choice and fitting.")] = 2,
    iters: Annotated[int, typer.Option("--iters", min=1, max=100_000, help="Nelder-Mead iterations per round.")] = 200,
    derive_as: Annotated[Optional[str], typer.Option("--derive-as", help="Instead of fitting, copy the base model's efficiencies under this name (for GPUs without measured runs).")] = None,
    derive_gpus: Annotated[Optional[str], typer.Option("--derive-gpus", help="With --derive-as: comma-separated GPU names (as in hardware profiles) it applies to.")] = None,
    reason: Annotated[str, typer.Option("--reason", help="With --derive-as: why the base applies, recorded in the file.")] = "",
    from_log: FromLogOpt = None,
    log_cluster: LogClusterOpt = None,
    log_model: LogModelOpt = None,
    log_framework: LogFrameworkOpt = None,
    log_seq_len: LogSeqOpt = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Fit a cost model's efficiencies to measured runs (builtin, a runs file, or training logs with
    --from-log) and write it with its provenance."""
    if from_log:
        if runs != "builtin":
            fail(f"give a runs file ({clip(runs)!r}) or --from-log, not both; fit on one, or write the logs' runs "
                 "into the runs file")
        _refuse_unused(ctx, ("derive_as", "derive_gpus", "reason", "gpu", "rounds"),
                       tuple(f"{verb} a fit of other runs, and --from-log fits the logs' runs in one round"
                             for verb in ("shapes", "shape")))
    log_kw = _log_options(ctx, from_log, log_cluster, log_model, log_framework, log_seq_len)
    if derive_as:
        if runs != "builtin":
            fail(f"--derive-as copies the base file's efficiencies without fitting, so the runs file {clip(runs)!r} "
                 "would be ignored; drop it, or drop --derive-as to fit on it")
        _refuse_unused(ctx, ("gpu", "rounds", "iters"), tuple(f"{verb} a fit, and --derive-as copies the base file's "
                                                             "efficiencies without fitting" for verb in ("sets", "set")))
    else:
        _refuse_unused(ctx, ("derive_gpus", "reason"), ("applies only with --derive-as", "apply only with --derive-as"),
                       "add --derive-as NAME")
        if runs != "builtin":
            _refuse_unused(ctx, ("gpu", "rounds"), tuple(f"{verb} the fit of the shipped runs (`calibrate builtin`), and "
                                                         "a runs file is fitted in one round to the runs it holds"
                                                         for verb in ("shapes", "shape")))
    command = "autopar calibrate " + " ".join(sys.argv[2:])
    inputs = _inputs(None if runs == "builtin" else runs, base, *(from_log or []))
    _check_outputs([out_path], force, inputs)

    def run():
        if derive_as:
            return api.derive_cost_model(base or "a100", derive_as, [g.strip() for g in (derive_gpus or "").split(",")
                                                           if g.strip()], command, reason)
        if runs != "builtin" or from_log:
            stated = api.log_runs(from_log, **log_kw)[0] if from_log else runs  # a runs file, or the logs' runs
            fitted, loo = api.calibrate_runs(stated, base, command, iters=iters)
            leave_one_out.extend(loo)
            uncalibrated.append(api.uncalibrated_error(stated, base))
            other_gpu = api.calibration_base_warning(stated, base)
            if other_gpu:
                print_warning(other_gpu)
            if not as_json:
                held = "leave-one-out" if len(loo) <= MAX_HELD_OUT_FITS else f"{MAX_HELD_OUT_FITS}-fold held-out"
                for run_id, e in loo:
                    out.print(f"{held} {run_id}: error {e:+.1%}")
            return fitted
        return api.calibrate_builtin(gpu, base or gpu, command, rounds, iters)

    leave_one_out: list[tuple[str, float]] = []
    uncalibrated: list[float | None] = []
    result = _run(run)
    _write_one(out_path, result.model_dump_json(indent=2) + "\n", force, inputs)
    held_out = result.fit.mape_holdout if result.fit else None
    if uncalibrated and uncalibrated[0] is not None and held_out is not None and held_out > uncalibrated[0]:
        print_warning(f"the calibration's held-out error ({held_out:.1%} MAPE, each run predicted by a fit that "
                      f"never saw it) is worse than the uncalibrated {result.name.removesuffix('-calibrated')} "
                      f"model's ({uncalibrated[0]:.1%}) on these runs: it fits noise; measure more runs, or keep "
                      "the shipped model (no --cost-model)")
    if as_json:
        _emit_json({"out": out_path, "cost_model": result.model_dump(mode="json"),
                    "leave_one_out": [{"run_id": r, "error": e} for r, e in leave_one_out]})
        return
    fit = result.fit
    if fit:
        held = f"; held-out {fit.runs_holdout} runs: MAPE {fit.mape_holdout:.1%}" if fit.mape_holdout is not None else ""
        out.print(f"fitted on {fit.runs_fit} runs: MAPE {fit.mape_fit:.1%}{held}")
    out.print(f"wrote {out_path}")


def _write_one(path: str, text: str, force: bool, inputs: list[str] = ()) -> None:
    _run(lambda: api.write_output(path, text, force, inputs))


QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
PlotOpt = Annotated[Optional[str], typer.Option("--plot", help="Pipeline timeline to this .png/.svg/.pdf (memory bars beside it as NAME-memory.png); needs matplotlib (autopar[plot]); '-' draws in the terminal.")]


def _picture_paths(path: str | None, with_memory: bool = True) -> list[str]:
    """The files --plot PATH writes (none for '-' or another suffix). A picture file without
    matplotlib is refused up front (exit 2, nothing computed or written), naming the install."""
    from pathlib import Path

    if not path or path == "-" or Path(path).suffix.lower() not in (".png", ".svg", ".pdf"):
        return []
    from importlib.util import find_spec

    if find_spec("matplotlib") is None:
        fail(f"--plot {Path(path).name} needs matplotlib, which is not installed; pip install 'autopar[plot]', "
             "or --plot - to draw in the terminal")
    return [path, _memory_picture_path(path)] if with_memory else [path]


def _memory_picture_path(path: str) -> str:
    from pathlib import Path

    return path if path == "-" else str(Path(path).with_name(Path(path).stem + "-memory" + Path(path).suffix))


def _progress_sink(quiet: bool):
    """A Rich progress bar on stderr for searches, unless quiet or not a terminal."""
    if quiet or not sys.stderr.isatty():
        return None, None
    from rich.progress import Progress

    bar = Progress(transient=True, console=err)
    tasks: dict[str, Any] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)

    return bar, update


@app.command()
def plan(
    ctx: typer.Context,
    model: ModelArg,
    cluster: ClusterOpt,
    gpus: GpusOpt,
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", min=1, max=MAX_GLOBAL_BATCH, help="Global batch size in sequences.")],
    seq_len: SeqOpt = None,
    top: Annotated[int, typer.Option("--top", min=1, max=100, help="How many of the best plans to list.")] = 5,
    framework: FrameworkOpt = Framework.MEGATRON.value,
    fixes: Annotated[Optional[list[str]], typer.Option("--fix", help="Pin axes, e.g. 'tp=8,pp=16,mbs=1' (tp pp dp cp ep etp vpp mbs zero sp recompute); repeatable: --fix tp=8 --fix pp=4 pins both.")] = None,
    max_tp: Annotated[Optional[int], typer.Option("--max-tp", min=1, max=MAX_GPUS, help="Largest tensor-parallel degree to consider.")] = None,
    memory_margin: MarginOpt = DEFAULT_MEMORY_MARGIN,
    precision: PrecisionOpt = Precision.BF16.value,
    cost_model: CostModelOpt = None,
    train_tokens: TrainTokensOpt = None,
    gpu_hour_cost: GpuHourCostOpt = None,
    failure_rate: FailureRateOpt = None,
    checkpoint_gb_per_s: CheckpointBwOpt = None,
    restart_minutes: RestartOpt = None,
    async_save: AsyncSaveOpt = False,
    checkpoint_minutes: CheckpointMinutesOpt = None,
    out_path: Annotated[Optional[str], typer.Option("--out", "-o", help="Write the best plan as a schema-versioned plan JSON here.")] = None,
    export_fmt: Annotated[Optional[str], typer.Option("--export", help="Also export the best plan: megatron, deepspeed or torchtitan; files go to the --out directory (with plan.json).", callback=_choice(Framework, "--export"))] = None,
    explain_best: Annotated[bool, typer.Option("--explain", help="Explain the chosen plan: time and memory per stage, and why each neighbouring plan loses.")] = False,
    plot: PlotOpt = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest plans that fit, by search over tp, pp, vpp, cp, ep, mbs, ZeRO and recompute."""
    from pathlib import Path

    fix = _merge_fix(fixes)
    if _pins_tp(fix):
        _refuse_unused(ctx, ("max_tp",), "limits the tp the search tries, and --fix pins tp")
    if as_json:
        _refuse_unused(ctx, ("plot", "explain_best"), ("draws beside the tables, and --json prints none",
                                                       "draw beside the tables, and --json prints none"))
        if export_fmt and not out_path:
            fail("--export prints its files after the tables, and --json prints none, so they would be lost; "
                 "add --out DIR for the files, or drop --export")
    if not out_path and not plot:
        _refuse_unused(ctx, ("force",), "overwrites existing outputs, and none is named", "add --out or --plot")
    if out_path and export_fmt and (out_path.lower().endswith(".json") or Path(out_path).is_file()):
        fail(f"--out {Path(out_path).name} is a file, not a folder: with --export, --out is the folder for plan.json "
             f"and the {export_fmt} files; give --out DIR, or write the plan alone with --out {Path(out_path).name} "
             f"and run `autopar export {Path(out_path).name} --format {export_fmt} --out DIR`")
    plan_json = str(Path(out_path) / "plan.json") if out_path and export_fmt else out_path
    inputs = _inputs(model, cluster, cost_model)
    _check_outputs(([plan_json] if plan_json else []) + _picture_paths(plot), force, inputs)
    _warn_cost_model(cluster, cost_model)
    opts = _run_opts(train_tokens, gpu_hour_cost, failure_rate, checkpoint_gb_per_s, restart_minutes, async_save,
                     checkpoint_minutes)
    bar, update = _progress_sink(quiet or as_json)

    def run():
        if bar is None:
            return api.search_plans(model, cluster, gpus, seq_len, global_batch, top=top, framework=framework, fix=fix,
                                    max_tp=max_tp, memory_margin=memory_margin, precision=precision,
                                    cost_model=cost_model)
        with bar:
            return api.search_plans(model, cluster, gpus, seq_len, global_batch, top=top, framework=framework,
                                    fix=fix, max_tp=max_tp, memory_margin=memory_margin, precision=precision,
                                    cost_model=cost_model, progress=update)

    result = _run(run)
    runs: dict[int, dict] = {}  # id(estimate) -> its run block

    def whole(p, e):
        if opts is None:
            return None
        if id(e) not in runs:
            runs[id(e)] = _run(lambda: api.run_for(model, cluster, gpus, p, e, opts))
        return runs[id(e)]

    exported: dict[str, str] = {}
    best_plan, best_est = result.chosen
    if export_fmt:
        exported = _run(lambda: api.export_plan(model, cluster, gpus, best_plan, best_est, export_fmt, cost_model,
                                                whole(best_plan, best_est)))
    targets: list[tuple[str, str | bytes]] = []  # every file of the command, written all or none
    if out_path:
        text = api.plan_file_text(model, cluster, gpus, best_plan, best_est, cost_model, whole(best_plan, best_est))
        targets = [(plan_json, text), *((str(Path(out_path) / name), t) for name, t in exported.items())]
    pictures = _picture_files(plot, plan=best_plan, estimate=best_est)
    if targets or pictures:
        _run(lambda: api.write_outputs(targets + pictures, force, inputs))
    written = [path for path, _ in targets]
    if as_json:
        def entry(p, e):
            block = whole(p, e)
            return {**records.plan_entry(p, e, gpus), **({"run": block} if block else {})}

        _emit_json({"plans": [{**entry(p, e), "equivalent_to_best": result.equivalent_to_best(e)}
                              for p, e in result.plans],
                    "alternatives": [{**entry(r.plan, r.estimate), "equivalent_to_best": r.equivalent_to_best}
                                     for r in result.alternatives],
                    "equivalence_band": result.band,
                    "search": {"candidates": result.candidates, "pruned": result.pruned, "scored": result.scored,
                               "feasible": result.feasible, "refined": result.refined, "time_s": result.time_s}})
        return
    tables.print_plans(out, result)
    if opts is not None:
        tables.print_run(out, whole(*result.chosen), "chosen plan (first row)")
    for f in written:
        out.print(f"wrote {f}")
    if exported and not out_path:
        _emit_files(exported, None)
    if explain_best:
        from autopar.report.explain import render_explanation

        render_explanation(out, _run(lambda: api.explain_plan(model, cluster, gpus, best_plan, cost_model,
                                                              memory_margin)))
    if plot:
        _picture_notes(plot, pictures, plan=best_plan, estimate=best_est)


@app.command()
def compare(
    ctx: typer.Context,
    plan_files: Annotated[Optional[list[str]], typer.Argument(help="Plan JSON files written by `autopar plan --out`.")] = None,
    plan_strings: Annotated[Optional[list[str]], typer.Option("--plan", help="A plan as 'tp=8,pp=8,mbs=1,recompute=full' (repeatable); needs MODEL etc. below or a plan file to take them from.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model for --plan strings (default: the first plan file's).")] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", "-c", help="Cluster for --plan strings (default: the first plan file's).")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", "-n", min=1, max=MAX_GPUS, help="GPU count for --plan strings (default: the first plan file's).")] = None,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", "-b", min=1, max=MAX_GLOBAL_BATCH, help="Global batch for --plan strings.")] = None,
    seq_len: SeqOpt = None,
    framework: FrameworkOpt = Framework.MEGATRON.value,
    from_megatron: Annotated[Optional[list[str]], typer.Option("--from-megatron", help="An existing Megatron-LM config (arguments or script path); repeatable.")] = None,
    from_deepspeed: Annotated[Optional[list[str]], typer.Option("--from-deepspeed", help="An existing DeepSpeed ds_config.json; repeatable.")] = None,
    memory_margin: MarginOpt = DEFAULT_MEMORY_MARGIN,
    cost_model: CostModelOpt = None,
    train_tokens: TrainTokensOpt = None,
    gpu_hour_cost: GpuHourCostOpt = None,
    failure_rate: FailureRateOpt = None,
    checkpoint_gb_per_s: CheckpointBwOpt = None,
    restart_minutes: RestartOpt = None,
    async_save: AsyncSaveOpt = False,
    checkpoint_minutes: CheckpointMinutesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Score several plans side by side; differences highlighted, the winner marked."""
    if not plan_strings:  # these options shape --plan strings only; without one they would be ignored
        used = ("seq_len",) if from_deepspeed else ()
        given = [p.opts[0] for p in ctx.command.params if p.name in ("global_batch", "seq_len", "framework")
                 and p.name not in used and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
        if given:
            fail(f"{', '.join(given)} apply to --plan strings only, and none is given; drop {', '.join(given)} "
                 "(plan files and imported configs carry their own)")

    opts = _run_opts(train_tokens, gpu_hour_cost, failure_rate, checkpoint_gb_per_s, restart_minutes, async_save,
                     checkpoint_minutes)

    def run():
        return api.compare_plans(plan_files or [], plan_strings or [], model=model, cluster=cluster, gpus=gpus,
                                 global_batch=global_batch, seq_len=seq_len, framework=framework,
                                 cost_model=cost_model, memory_margin=memory_margin,
                                 from_megatron=from_megatron or [], from_deepspeed=from_deepspeed or [],
                                 run_opts=opts)

    entries, n, *rest = _run(run)
    runs = rest[0] if rest else [None] * len(entries)
    if as_json:
        _emit_json({"plans": [{**records.plan_entry(p, e, n), **({"run": r} if r else {})}
                              for (_, p, e), r in zip(entries, runs)]})
    else:
        tables.print_compare(out, entries)
        if opts:
            tables.print_runs(out, [(label, r) for (label, _, _), r in zip(entries, runs)])


@app.command()
def profile(
    ctx: typer.Context,
    out_path: Annotated[Optional[str], typer.Option("--out", "-o", help="Where to write the measured cost-model JSON (e.g. cost_models/h200.json); with --distributed, the cluster profile YAML (its cost model is written beside it as NAME.cost.json).")] = None,
    device: Annotated[str, typer.Option("--device", help="cuda (the local GPUs) or cpu (a functional check).", callback=_choice(("cuda", "cpu"), "--device"))] = "cuda",
    model: Annotated[str, typer.Option("--model", help="Model whose layer shapes the GEMM benchmark uses.")] = "llama3-8b",
    quick: Annotated[bool, typer.Option("--quick", help="Fewer shapes and repeats (about a minute on a CPU); with --distributed, messages up to 16 MiB (1 MiB on CPUs).")] = False,
    base: Annotated[Optional[str], typer.Option("--base", help="Cost model whose unmeasured parameters to keep; default: the shipped one for the GPU.")] = None,
    distributed: Annotated[bool, typer.Option("--distributed", help="Run on every rank under torchrun or srun (`torchrun ... -m autopar profile --distributed --out cluster.yaml`): measure all-reduce, all-gather, reduce-scatter, all-to-all and send/recv inside and across nodes, and have rank 0 write a cluster profile for `plan --cluster`.")] = False,
    cluster: Annotated[Optional[str], typer.Option("--cluster", "-c", help="With --distributed: the profile whose GPU, NIC count and topology the written profile keeps; default: the shipped one of the GPU found (dgx-h100 on a CPU).")] = None,
    timeout: Annotated[int, typer.Option("--timeout", min=1, max=86400, help="With --distributed: seconds to wait for a rank or a collective before stopping with a line naming the rank.")] = 300,
    print_launch: Annotated[Optional[str], typer.Option("--print-launch", help="Print the command that runs the distributed profile: slurm (an sbatch script) or torchrun (the command for every node); runs nothing.", callback=_choice(("slurm", "torchrun"), "--print-launch"))] = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=MAX_GPUS, help="With --print-launch: nodes to profile.")] = 2,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1, max=1024, help="With --print-launch: ranks (GPUs) per node.")] = 8,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure GEMM, attention, memory bandwidth and collectives here and write a cost-model file;
    or (--distributed) the network inside and across nodes, as a cluster profile."""
    if print_launch:
        _refuse_unused(ctx, ("device", "model", "base", "distributed", "cluster", "timeout", "force", "quiet", "as_json"),
                       ("prints a command and runs nothing", "print a command and run nothing"))
        extra = "--quick" if quick else ""
        sys.stdout.write(_run(lambda: api.profile_launch_command(print_launch, nodes, gpus_per_node,
                                                                  out_path or "cluster.yaml", extra)))
        return
    _refuse_unused(ctx, ("nodes", "gpus_per_node"), ("applies only with --print-launch", "apply only with --print-launch"),
                   "add --print-launch slurm|torchrun")
    if out_path is None:
        fail("Missing option '--out' / '-o'; see `autopar profile --help`")
    if distributed:
        _refuse_unused(ctx, ("device", "model", "base"), tuple(f"{verb} the single-host benchmark, and --distributed "
                                                               "measures collectives only" for verb in ("sets", "set")))
        _profile_distributed(out_path, cluster, quick, timeout, force, as_json)
        return
    _refuse_unused(ctx, ("cluster", "timeout"), ("applies only with --distributed", "apply only with --distributed"),
                   "add --distributed")
    _drop_process_env_default("OPENBLAS_NUM_THREADS")  # torch's CPU kernels may use OpenBLAS: all threads
    inputs = _inputs(base)
    _check_outputs([out_path], force, inputs)
    command = "autopar profile " + " ".join(sys.argv[2:])
    bar, update = _progress_sink(quiet or as_json)

    def run():
        if bar is None:
            return api.profile(device, model, quick, base, command)
        with bar:
            return api.profile(device, model, quick, base, command, update)

    result = _run(run)
    _write_one(out_path, result.model_dump_json(indent=2) + "\n", force, inputs)
    if as_json:
        _emit_json({"out": out_path, "cost_model": result.model_dump(mode="json")})
        return
    out.print(f"wrote {out_path}: {len(result.gemm_table)} GEMM shapes, "
              f"{len(result.measurements.get('collectives', []))} collective measurements")


def _profile_distributed(out_path: str, cluster: str | None, quick: bool, timeout: int, force: bool,
                         as_json: bool) -> None:
    """`profile --distributed` on this rank; rank 0 prints what it wrote, the others nothing."""
    command = "autopar profile " + " ".join(sys.argv[2:])
    result = _run(lambda: api.profile_distributed(out_path, cluster=cluster, quick=quick, timeout_s=timeout,
                                                  force=force, inputs=_inputs(cluster), command=command))
    if result is None:
        return
    if as_json:
        _emit_json({k: result[k] for k in ("out", "cost_model", "nodes", "ranks_per_node", "summary", "rows")})
        return
    s = result["summary"]

    def gb(x: float | None) -> str:
        return "n/a" if x is None else f"{x / 1e9:.3g} GB/s"

    out.print(f"wrote {result['out']} and {result['cost_model']}: {result['nodes']} node(s) x "
              f"{result['ranks_per_node']} ranks, {len(result['rows'])} measurements; all-reduce bus bandwidth "
              f"intra-node {gb(s['intra_busbw_bytes_per_s'])}, inter-node {gb(s['inter_busbw_bytes_per_s'])}")


def _picture_files(path: str | None, with_memory: bool = True, **what: Any) -> list[tuple[str, bytes]]:
    """The files --plot PATH writes, rendered, to be written with the command's other outputs (all
    or none): the pipeline timeline at PATH and the memory bars at PATH with '-memory' before the
    suffix (or the sweep's curves: `what` holds plan and estimate, or points and runs); none
    where the pictures are drawn in the terminal (_picture_paths)."""
    paths = _picture_paths(path, with_memory)
    if not paths:
        return []
    from autopar.report.plots import picture_bytes

    kinds = ("timeline", "memory") if with_memory else ("sweep",)
    return [(target, _run(lambda: picture_bytes(kind, target, **what))) for kind, target in zip(kinds, paths)]


def _picture_notes(path: str, files: list[tuple[str, bytes]], with_memory: bool = True, **what: Any) -> None:
    """After the tables: 'wrote ...' for each picture file written, or the terminal renderings
    (with the note why) where --plot PATH writes none ('-', another suffix, no matplotlib)."""
    kinds = ("timeline", "memory") if with_memory else ("sweep",)
    if files:
        for kind, (target, _) in zip(kinds, files):
            out.print(f"wrote the {kind} picture to {target}")
        return
    from autopar.report.plots import save_picture

    targets = (path, _memory_picture_path(path)) if with_memory else (path,)
    for kind, target in zip(kinds, targets):
        note = _run(lambda: save_picture(kind, target, console=out, **what))
        if note:
            out.print(note, markup=False)  # plain text: Rich would read "[plot]" as markup


@app.command()
def explain(
    ctx: typer.Context,
    plan_file: Annotated[Optional[str], typer.Argument(help="A plan JSON written by `autopar plan --out` (or give --plan with the model and cluster).")] = None,
    plan_string: Annotated[Optional[str], typer.Option("--plan", help="A plan as 'tp=8,pp=4,vpp=5,mbs=1,recompute=selective'.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model, with --plan.")] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", "-c", help="Cluster, with --plan.")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", "-n", min=1, max=MAX_GPUS, help="GPU count, with --plan.")] = None,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", "-b", min=1, max=MAX_GLOBAL_BATCH, help="Global batch, with --plan.")] = None,
    seq_len: SeqOpt = None,
    framework: FrameworkOpt = Framework.MEGATRON.value,
    memory_margin: MarginOpt = DEFAULT_MEMORY_MARGIN,
    cost_model: CostModelOpt = None,
    plot: PlotOpt = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Why a plan wins: time and memory per stage, and the reason each neighbouring plan loses or fails."""
    from autopar.report.explain import render_explanation

    if plan_file:
        if plan_string:
            fail("give a plan file or --plan, not both; explain them one at a time, or side by side with "
                 "`autopar compare`")
        _refuse_unused(ctx, ("model", "cluster", "gpus", "global_batch", "seq_len", "framework"),
                       tuple(f"{verb} with --plan, and the plan file names its own" for verb in ("goes", "go")),
                       "explain --plan '...' instead of the file")
    if as_json:
        _refuse_unused(ctx, ("plot",), "draws beside the tables, and --json prints none")
    if not plot:
        _refuse_unused(ctx, ("force",), "overwrites existing pictures, and no --plot is named", "add --plot")
    inputs = _inputs(plan_file, model, cluster, cost_model)
    _check_outputs(_picture_paths(plot), force, inputs)
    _warn_cost_model(cluster, cost_model)
    ex = _run(lambda: api.explain(plan_file, plan_string, model=model, cluster=cluster, gpus=gpus,
                                  global_batch=global_batch, seq_len=seq_len, framework=framework,
                                  cost_model=cost_model, memory_margin=memory_margin))
    if as_json:
        _emit_json(ex.to_dict())
        return
    pictures = _picture_files(plot, plan=ex.plan, estimate=ex.estimate)
    if pictures:
        _run(lambda: api.write_outputs(pictures, force, inputs))
    render_explanation(out, ex)
    if plot:
        _picture_notes(plot, pictures, plan=ex.plan, estimate=ex.estimate)


@app.command()
def sweep(
    ctx: typer.Context,
    model: ModelArg,
    cluster: ClusterOpt,
    gpus: Annotated[str, typer.Option("--gpus", "-n", help="GPU counts, comma-separated (e.g. 64,128,256), or one value.")],
    global_batch: Annotated[str, typer.Option("--global-batch", "-b", help="Global batch sizes, comma-separated, or one value.")],
    seq_len: Annotated[Optional[str], typer.Option("--seq-len", "-s", help="Sequence lengths, comma-separated, or one value; default: the model's.")] = None,
    framework: FrameworkOpt = Framework.MEGATRON.value,
    precision: PrecisionOpt = Precision.BF16.value,
    fixes: Annotated[Optional[list[str]], typer.Option("--fix", help="Pin axes at every point, e.g. 'tp=8,recompute=full'; repeatable: --fix tp=8 --fix pp=4 pins both.")] = None,
    max_tp: Annotated[Optional[int], typer.Option("--max-tp", min=1, max=MAX_GPUS, help="Largest tensor-parallel degree to consider.")] = None,
    memory_margin: MarginOpt = DEFAULT_MEMORY_MARGIN,
    cost_model: CostModelOpt = None,
    train_tokens: TrainTokensOpt = None,
    gpu_hour_cost: GpuHourCostOpt = None,
    failure_rate: FailureRateOpt = None,
    checkpoint_gb_per_s: CheckpointBwOpt = None,
    restart_minutes: RestartOpt = None,
    async_save: AsyncSaveOpt = False,
    checkpoint_minutes: CheckpointMinutesOpt = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Scaling curves of tokens/s/GPU and MFU: a .png/.svg/.pdf path (needs matplotlib) or '-' for the terminal.")] = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The best plan at each point of a GPU-count, batch or sequence sweep: where scaling breaks."""
    from autopar.report.sweep import render_sweep

    fix = _merge_fix(fixes)
    if _pins_tp(fix):
        _refuse_unused(ctx, ("max_tp",), "limits the tp the search tries, and --fix pins tp")
    if as_json:
        _refuse_unused(ctx, ("plot",), "draws beside the tables, and --json prints none")
    if not plot:
        _refuse_unused(ctx, ("force",), "overwrites an existing picture, and no --plot is named", "add --plot")
    inputs = _inputs(model, cluster, cost_model)
    _check_outputs(_picture_paths(plot, with_memory=False), force, inputs)
    _warn_cost_model(cluster, cost_model)
    opts = _run_opts(train_tokens, gpu_hour_cost, failure_rate, checkpoint_gb_per_s, restart_minutes, async_save,
                     checkpoint_minutes)
    bar, update = _progress_sink(quiet or as_json)
    kwargs = dict(framework=framework, precision=precision, fix=fix, max_tp=max_tp, memory_margin=memory_margin,
                  cost_model=cost_model)

    def run():
        if bar is None:
            return api.sweep(model, cluster, gpus, global_batch, seq_len, **kwargs)
        with bar:
            return api.sweep(model, cluster, gpus, global_batch, seq_len, progress=update, **kwargs)

    points = _run(run)
    runs = [_run(lambda: api.run_for(model, cluster, p.gpus, p.plan, p.estimate, opts)) if opts and p.fits else None
            for p in points]
    if as_json:
        _emit_json({"points": [{**p.to_dict(), **({"run": r} if opts else {})} for p, r in zip(points, runs)]})
        return
    pictures = _picture_files(plot, with_memory=False, points=points, runs=runs if opts else None)
    if pictures:
        _run(lambda: api.write_outputs(pictures, force, inputs))
    render_sweep(out, points)
    if opts:
        tables.print_runs(out, [(f"{p.gpus:,} GPUs, gbs {p.global_batch}, seq {p.seq_len}", r)
                                for p, r in zip(points, runs)], title="Whole run across the sweep")
    if plot:
        _picture_notes(plot, pictures, with_memory=False, points=points, runs=runs if opts else None)


@app.command()
def export(
    ctx: typer.Context,
    plan_file: Annotated[str, typer.Argument(help="A plan JSON written by `autopar plan --out`.")],
    fmt: FormatOpt = Framework.MEGATRON.value,
    out_path: Annotated[Optional[str], typer.Option("--out", "-o", help="A directory for the files (or a file name when the format makes one file); default: print them.")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Turn a plan into a launch config that Megatron-LM, DeepSpeed or torchtitan accepts."""
    if not out_path:
        _refuse_unused(ctx, ("force",), "overwrites existing files under --out, and without --out the files are "
                       "printed", "add --out")
    files = _run(lambda: api.export_plan_file(plan_file, fmt))
    if as_json:
        written = _run(lambda: api.write_files(files, out_path, force, [plan_file]))
        _emit_json({"format": fmt, "files": files, "written": written})
        return
    _emit_files(files, out_path, force, [plan_file])


def _emit_files(files: dict[str, str], out_path: str | None, force: bool = False, inputs: list[str] = ()) -> None:
    written = _run(lambda: api.write_files(files, out_path, force, inputs))
    if written:
        for f in written:
            out.print(f"wrote {f}")
        return
    for name, text in files.items():
        sys.stdout.write(f"# ===== {name} =====\n{text}" + ("" if text.endswith("\n") else "\n"))


# Environment defaults of the `autopar` process (issue 15: start-up), each kept when the user set it.
PROCESS_ENV_DEFAULTS = {
    # Pydantic scans every installed package's entry points for plugins when it builds autopar's
    # first schema (25-40 ms with a framework stack installed); Typer turns them off the same way
    # while it builds its own adapters. The command line has no use for one.
    "PYDANTIC_DISABLE_PLUGINS": "__all__",
    # autopar's NumPy work is elementwise, with no BLAS call; OpenBLAS's worker threads only spin
    # while NumPy loads (about 45 ms of CPU on the 2-core development machine).
    "OPENBLAS_NUM_THREADS": "1",
}
_ENV_SET_HERE: set[str] = set()  # the defaults main() set (the user had not)


def _set_process_env_defaults() -> None:
    for key, value in PROCESS_ENV_DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = value
            _ENV_SET_HERE.add(key)


def _drop_process_env_default(key: str) -> None:
    """Unset a default of main()'s before a command loads a library that reads it differently."""
    if key in _ENV_SET_HERE:
        os.environ.pop(key, None)
        _ENV_SET_HERE.discard(key)


class _LazyCommands(MutableMapping):
    """A group's commands by name, in registration order, each built by Typer when first looked up
    (a value is a Click command or a function making one). Typer builds every command's Click
    parameters from its signature: 15-20 ms for autopar's twelve, of which a run uses one (issue
    15). Listing the names builds nothing; the group's help, which shows every command, builds all."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self._entries = entries

    def __getitem__(self, name: str) -> Any:
        command = self._entries[name]
        if not isinstance(command, click.Command):
            command = self._entries[name] = command()
        return command

    def __setitem__(self, name: str, command: Any) -> None:
        self._entries[name] = command

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def lazy_command(typer_app: typer.Typer = app) -> Any:
    """The Click group `typer.main.get_command(typer_app)` makes, with commands built on first use
    (_LazyCommands; tests/test_cli_lazy.py checks both groups answer alike)."""
    import functools

    import typer.main

    if not all(hasattr(typer.main, f) for f in ("get_group", "get_command_from_info", "get_command_name")):
        return typer.main.get_command(typer_app)  # a Typer whose internals differ: every command built
    group = typer.main.get_group(_Typer(**_APP_SETTINGS))  # the group alone: the same settings, no command
    group.commands = _LazyCommands({
        info.name or typer.main.get_command_name(info.callback.__name__): functools.partial(
            typer.main.get_command_from_info, info, pretty_exceptions_short=typer_app.pretty_exceptions_short,
            rich_markup_mode=typer_app.rich_markup_mode)
        for info in typer_app.registered_commands})
    return group


def entry() -> None:
    """The `autopar` program (console script and `python -m autopar`): `main`, then its exit status
    without tearing the interpreter down. A search leaves ~10^5 small objects behind, and the
    interpreter's final collection and module teardown took ~0.1 s of every `plan` process (a
    tenth of its wall time) to free memory the OS reclaims at once. Everything the commands write
    goes through closed files (autopar.io); standard output and error are flushed here. A library
    caller (or a test) calls `main`, which exits through SystemExit as usual. A terminal or pipe
    whose encoding cannot write a character autopar prints (PYTHONIOENCODING=ascii: '·', '≈', box
    lines) gets an escape for it instead of a UnicodeEncodeError."""
    _escape_unwritable_characters()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): the message on stderr, status 1
        sys.stderr.write(f"{code}\n")
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`autopar ... | head`) or stream
            pass
    os._exit(code)


def _escape_unwritable_characters() -> None:
    """Standard output and error write what their encoding lacks as backslash escapes."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding not in ("utf8", "utf16", "utf32") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def main() -> None:
    """Entry point of the CLI (exits through SystemExit; the program itself runs `entry`)."""
    _set_process_env_defaults()
    try:
        lazy_command()(standalone_mode=True)
    except KeyboardInterrupt:
        print_error("interrupted")
        sys.exit(130)
