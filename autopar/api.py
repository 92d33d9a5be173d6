"""The library surface a notebook calls; the CLI is a thin shell over these functions.

Every function takes names or paths (a preset or config file, a cluster profile) and returns
plain dicts or dataclasses; errors are autopar.errors.AutoparError subclasses with one-line
messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autopar.cost.layout import check_layout
from autopar.cost.memory import model_state_bytes
from autopar.cost.step import DEFAULT_MEMORY_MARGIN, Estimate, estimate
from autopar.errors import InvalidPlanError
from autopar.frameworks import framework_spec
from autopar.hardware import Cluster, cluster_rows, list_clusters, load_profile  # noqa: F401 (re-exported)
from autopar.inputs import (  # noqa: F401 (re-exported)
    load_cluster, load_model, load_target_model, make_plan, plan_from_fields, resolve_cost_model)
from autopar.listings import clusters, models  # noqa: F401 (re-exported)
from autopar.model import PRESET_NAMES, ModelGraph
from autopar.report.records import estimate_to_dict, plan_entry, plan_to_dict  # noqa: F401 (re-exported)
from autopar.schema import one_line  # noqa: F401 (re-exported: the CLI's one line for a rejected value)
from autopar.schema.plan import Framework, ParallelPlan, Precision, parse_assignments

if TYPE_CHECKING:
    from autopar.report.explain import Explanation
    from autopar.report.sweep import SweepPoint
    from autopar.schema.cost_model import CostModelFile


def inspect(model: str, seq_len: int | None = None, dp: int = 1, framework: Framework = Framework.MEGATRON
            ) -> dict[str, Any]:
    """Parameters, FLOPs per token, model-state bytes per GPU by ZeRO stage, activation bytes per token."""
    g = load_model(model)
    s = seq_len or g.spec.seq_length
    per_layer = []
    seen = set()
    for layer in g.layers:
        key = layer.cost_key
        if key in seen:
            continue
        seen.add(key)
        acts = layer.activation_bytes_per_token(s)
        per_layer.append({"kind": layer.kind, "name": key, "count": sum(1 for x in g.layers if x.cost_key == key),
                          "mixer": layer.mixer if layer.kind in ("dense", "moe", "mtp") else None,
                          "params": layer.params, "active_params": layer.active_params,
                          "forward_flops_per_token": {"matmul": layer.matmul_flops_per_token,
                                                      "attention": layer.attention_flops_per_token(s),
                                                      "scan": layer.scan_flops_per_token,
                                                      "elementwise": layer.elementwise_flops_per_token},
                          "activation_bytes_per_token": sum(acts.values()),
                          "activation_bytes_per_token_by_tensor": acts})
    # Every stage the framework offers, with the bytes that framework keeps (Megatron's 2 and 3 are
    # Megatron-FSDP's: the fp32 main gradients stay 4 bytes), exactly as estimate charges them.
    zero = {str(stage): sum(model_state_bytes(g.total_params, framework, stage, dp).values())
            for stage in framework_spec(framework).zero_stages}
    return {
        "model": g.spec.name, "source": g.spec.source, "seq_len": s,
        "total_params": g.total_params, "active_params": g.active_params,
        "mtp_params_included": g.mtp_params > 0, "mtp_params": g.mtp_params,
        "mtp_source": g.spec.mtp_source or None,
        "layer_pattern": g.spec.layer_pattern, "ffn_pattern": g.spec.ffn_pattern,
        "params_by_kind": g.params_by_kind(),
        "flops_per_token": g.model_flops_per_token(s, causal=True),
        "flops_per_token_6n": 6.0 * g.active_params,
        "attention_flops_per_token": 3.0 * sum(x.attention_flops_per_token(s) for x in g.layers),
        "scan_flops_per_token": 3.0 * sum(x.scan_flops_per_token for x in g.layers),
        "flops_convention": "training FLOPs per token = 3 × forward (matmuls + causal attention + recurrent "
                            "mixers' scans); 6·N counts all active weights",
        "model_state_bytes_per_gpu_by_zero": zero, "dp": dp, "framework": framework,
        "layers": per_layer,
    }


def validate_plan_for(graph: ModelGraph, cluster: Cluster, plan: ParallelPlan) -> None:
    """Raise InvalidPlanError naming every broken invariant (autopar.cost.layout.check_layout)."""
    check_layout(plan, cluster, graph)


def estimate_plan(model: str, cluster: str, gpus: int, plan: ParallelPlan, cost_model: str | None = None,
                  memory_margin: float = DEFAULT_MEMORY_MARGIN) -> Estimate:
    """Validate and score one plan; it fits when its peak is within HBM · (1 − memory_margin)."""
    g = load_model(model)
    c = load_cluster(cluster, gpus)
    check_layout(plan, c, g)
    return estimate(g, c, plan, resolve_cost_model(c, cost_model), memory_margin)


# --------------------------------------------------------------------------- plan and compare


def plan_from_assignments(text: str, gpus: int, global_batch: int, seq_len: int, **defaults: Any) -> ParallelPlan:
    """A plan from a --plan string such as 'tp=8,pp=8,mbs=1,recompute=full' (dp is derived)."""
    return plan_from_fields(parse_assignments(text, "--plan"), gpus, global_batch, seq_len, f"--plan {text!r}: ",
                            **defaults)


def search_plans(model: str, cluster: str, gpus: int, seq_len: int | None, global_batch: int, *, top: int = 5,
                 framework: Framework = Framework.MEGATRON, fix: str | None = None, max_tp: int | None = None,
                 memory_margin: float | None = None, precision: Precision = Precision.BF16,
                 cost_model: str | None = None, progress=None):
    """Run the search (autopar.search.search) with CLI-shaped arguments."""
    from autopar.search import search

    seq = seq_len or load_model(model).spec.seq_length
    return search(model, cluster, gpus, seq, global_batch, top=top, framework=framework,
                  fix=parse_assignments(fix) if fix else None, max_tp=max_tp,
                  memory_margin=DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin,
                  precision=precision, cost_model=cost_model, progress=progress)


def plan_file_for(model: str, cluster: str, gpus: int, plan: ParallelPlan, est: Estimate,
                  cost_model: str | None = None, run: dict[str, Any] | None = None):
    """The schema-versioned plan JSON record of one plan (`run`: its whole-run block, run_for,
    kept under estimate.run, where the exports read the checkpoint interval)."""
    from autopar import __version__
    from autopar.schema.plan_file import PlanFile, PlanTarget

    target = PlanTarget(model=model, model_spec=load_model(model).spec, cluster=cluster, gpus=gpus,
                        cost_model=cost_model)
    record = estimate_to_dict(est, plan)
    if run is not None:
        record["run"] = run
    return PlanFile(autopar_version=__version__, target=target, parallel=plan, estimate=record)


def score_plan_file(path: str, cost_model: str | None = None, memory_margin: float = DEFAULT_MEMORY_MARGIN
                    ) -> tuple[Any, ParallelPlan, Estimate]:
    """Re-score a plan JSON under the current cost model."""
    from autopar.schema.plan_file import read_plan_file

    pf = read_plan_file(path)
    t = pf.target
    g = load_target_model(t.model, t.model_spec)
    c = load_cluster(t.cluster, t.gpus)
    check_layout(pf.parallel, c, g)
    return pf, pf.parallel, estimate(g, c, pf.parallel, resolve_cost_model(c, cost_model or t.cost_model),
                                     memory_margin)


def compare_plans(plan_files: list[str], plan_strings: list[str], *, model: str | None = None,
                  cluster: str | None = None, gpus: int | None = None, global_batch: int | None = None,
                  seq_len: int | None = None, framework: Framework = Framework.MEGATRON, cost_model: str | None = None,
                  memory_margin: float = DEFAULT_MEMORY_MARGIN,
                  from_megatron: list[str] = (), from_deepspeed: list[str] = (), run_opts=None):
    """Score plan files and --plan strings for one model and cluster, in input order:
    (entries, gpus), and with `run_opts` (run_options) (entries, gpus, each entry's run block)."""
    from autopar.errors import SchemaError

    if not plan_files and not plan_strings and not from_megatron and not from_deepspeed:
        raise SchemaError("nothing to compare; pass plan JSON files, --plan 'tp=8,pp=8,...' strings, "
                          "--from-megatron or --from-deepspeed")
    entries = []
    for path in plan_files:
        pf, plan, est = score_plan_file(path, cost_model, memory_margin)
        t = pf.target
        model, cluster, gpus = model or t.model, cluster or t.cluster, gpus or t.gpus
        global_batch, seq_len = global_batch or plan.global_batch, seq_len or plan.seq_len
        if (t.model, t.cluster, t.gpus) != (model, cluster, gpus):
            raise SchemaError(f"{path} is for {t.model} on {t.gpus} x {t.cluster}, not {model} on {gpus} x {cluster}; "
                              "compare plans of one model and cluster")
        entries.append((path, plan, est))
    imports = [(m, None) for m in from_megatron] + [(None, d) for d in from_deepspeed]
    if imports:
        missing = [n for n, v in (("--model", model), ("--cluster", cluster), ("--gpus", gpus)) if v is None]
        if missing:
            raise SchemaError(f"--from-megatron/--from-deepspeed need {', '.join(missing)} (or a plan file)")
        for meg, ds in imports:
            plan = imported_plan(meg, ds, gpus, seq_len, model)
            label = "megatron: " + (meg if len(meg) < 40 else meg[:37] + "...") if meg else f"deepspeed: {ds}"
            entries.append((label, plan, estimate_plan(model, cluster, gpus, plan, cost_model, memory_margin)))
    if plan_strings:
        missing = [name for name, v in (("--model", model), ("--cluster", cluster), ("--gpus", gpus),
                                        ("--global-batch", global_batch)) if v is None]
        if missing:
            raise SchemaError(f"--plan strings need {', '.join(missing)} (or a plan file to take them from)")
        seq = seq_len or load_model(model).spec.seq_length
        for text in plan_strings:
            plan = plan_from_assignments(text, gpus, global_batch, seq, framework=framework)
            entries.append((text, plan, estimate_plan(model, cluster, gpus, plan, cost_model, memory_margin)))
    if run_opts is not None:
        return entries, gpus, [run_for(model, cluster, gpus, plan, est, run_opts) for _, plan, est in entries]
    return entries, gpus


# --------------------------------------------------------------------------- export and import


def export_plan_file(path: str, fmt: str) -> dict[str, str]:
    """Launch files for a plan JSON: {file name: content}."""
    from autopar.export import export
    from autopar.schema.plan_file import read_plan_file

    pf = read_plan_file(path)
    load_target_model(pf.target.model, pf.target.model_spec)  # the model it names is the one it describes
    return export(pf, fmt)


def export_plan(model: str, cluster: str, gpus: int, plan: ParallelPlan, est: Estimate, fmt: str,
                cost_model: str | None = None, run: dict[str, Any] | None = None) -> dict[str, str]:
    from autopar.export import export

    return export(plan_file_for(model, cluster, gpus, plan, est, cost_model, run), fmt)


def write_files(files: dict[str, str], out: str | None, force: bool = False, inputs: list[str] = ()) -> list[str]:
    """Write export files: into directory `out`, or to file `out` when there is exactly one file
    and `out` has a suffix; nothing when out is None (the caller prints them). All or nothing,
    atomically (autopar.io.write_outputs); existing files are refused unless `force`, a file that
    is one of `inputs` (the plan file exported) always."""
    from pathlib import Path

    from autopar.io import write_outputs

    if out is None:
        return []
    target = Path(out).expanduser()
    if len(files) == 1 and target.suffix and not target.is_dir():
        ((_, text),) = files.items()
        return write_outputs({target: text}, force=force, inputs=inputs)
    return write_outputs({target / name: text for name, text in files.items()}, force=force, inputs=inputs)


def output_paths(file_names: list[str], out: str) -> list[str]:
    """The paths write_files would write for these names (to check them before any work)."""
    from pathlib import Path

    target = Path(out).expanduser()
    if len(file_names) == 1 and target.suffix and not target.is_dir():
        return [str(target)]
    return [str(target / name) for name in file_names]


def imported_plan(from_megatron: str | None, from_deepspeed: str | None, gpus: int, seq_len: int | None,
                  model: str, framework_default: Framework = Framework.MEGATRON, *,
                  global_batch: int | None = None, mbs: int | None = None) -> ParallelPlan:
    """The plan of an existing Megatron command/script or DeepSpeed config. A Megatron script whose
    model (layers, hidden size, heads) is not `model` is refused; a DeepSpeed config's "auto" batch
    keys take `global_batch` and `mbs`."""
    from autopar.errors import SchemaError
    plan_from_megatron_args = framework_spec("megatron").import_function()
    plan_from_deepspeed_config = framework_spec("deepspeed").import_function()

    if from_megatron and from_deepspeed:
        raise SchemaError("give --from-megatron or --from-deepspeed, not both; score them one at a time or "
                          "side by side with `autopar compare`")
    if from_megatron:
        plan, fields = plan_from_megatron_args(from_megatron, num_gpus=gpus)
        check_same_model(fields, load_model(model).spec, model)
        return plan
    seq = seq_len or load_model(model).spec.seq_length
    return plan_from_deepspeed_config(from_deepspeed, gpus, seq_len=seq, global_batch=global_batch, mbs=mbs)


def import_notes(from_megatron: str | None) -> list[str]:
    """One-line notes on an import: the Megatron flags autopar did not read (listed in one line)."""
    from autopar.export.importers import ignored_flags_note

    note = ignored_flags_note(from_megatron) if from_megatron else None
    return [note] if note else []


def model_from_launch(from_megatron: str, name: str = "megatron-script"):
    """The ModelSpec a Megatron command line or launch script describes (its shape, attention, MoE,
    RoPE and norm flags), for scoring a script without naming its model."""
    from autopar.export.importers import model_from_megatron_args

    return model_from_megatron_args(from_megatron, name)


def estimate_launch(from_megatron: str, cluster: str, gpus: int, cost_model: str | None = None,
                    memory_margin: float = DEFAULT_MEMORY_MARGIN):
    """(plan, estimate, model spec) of a Megatron command line or script whose flags describe the
    model too (model_from_launch): `estimate --from-megatron` without a model."""
    from autopar.model import build_graph

    spec = model_from_launch(from_megatron)
    plan, _ = framework_spec("megatron").import_function()(from_megatron, num_gpus=gpus)
    g = build_graph(spec)
    c = load_cluster(cluster, gpus)
    check_layout(plan, c, g)
    return plan, estimate(g, c, plan, resolve_cost_model(c, cost_model), memory_margin), spec


_SHAPE_KEYS = (("num_layers", "layers"), ("hidden_size", "hidden size"), ("num_attention_heads", "heads"))


def check_same_model(script_fields: dict[str, Any], spec, model: str) -> None:
    """Refuse a launch script that describes another model than `model` (layers, hidden size or
    heads differ; a shape the script does not state is not compared)."""
    from autopar.errors import SchemaError
    from autopar.limits import clip

    differ = [(label, script_fields[k], getattr(spec, k)) for k, label in _SHAPE_KEYS
              if script_fields.get(k) is not None and script_fields[k] != getattr(spec, k)]
    if differ:
        said = ", ".join(f"{label} {a} (the model has {b})" for label, a, b in differ)
        raise SchemaError(f"the Megatron script is for another model than {clip(model)}: {said}; pass the model the "
                          "script trains, or the script for this model")


# --- validate, calibrate, profile, explain, sweep


def validate(split: str = "holdout", sources: set[str] | None = None, cost_model: str | None = None
             ) -> dict[str, Any]:
    """The shipped measured runs of `split` (holdout, fit or all; of `sources` only, when given),
    each predicted, with the error by hardware, source, regime and framework (autopar.validate.report)."""
    from autopar.validate.report import validate as run

    return run(split, sources, cost_model)


def validate_runs(path: str, cost_model: str | None = None) -> dict[str, Any]:
    """A runs YAML of one's own measured runs (autopar/schema/runs.py), each predicted with the plan
    it states; the same rows and summaries as validate, plus runs_file."""
    from autopar.validate.report import validate_runs as run

    return run(path, cost_model)


def leave_one_source_out(iters: int = 40, sources: set[str] | None = None) -> dict[str, Any]:
    """Every source of measured runs (or those in `sources`) scored by a refit that never saw it: the
    error to expect on a new source (autopar.calibration.loso). `iters`: Nelder-Mead iterations per refit."""
    from autopar.calibration.loso import leave_one_source_out as run

    return run(iters=iters, sources=sources)


def calibrate_builtin(gpu: str, base: str, command: str, rounds: int = 2, iters: int = 200) -> CostModelFile:
    """The cost model `base` (a name or file) fitted on the shipped runs of GPU family `gpu` (a100,
    h100), with `command` as its provenance (autopar.calibration.fit.calibrate_builtin)."""
    from autopar.calibration.fit import calibrate_builtin as run

    return run(gpu, _cost_model_file(base), command, rounds, iters)


def calibrate_runs(path: str, base: str | None, command: str, iters: int = 150
                   ) -> tuple[CostModelFile, list[tuple[str, float]]]:
    """`base` fitted on a runs YAML of one's own measured runs, and the leave-one-out error of each
    run as (run_id, error) pairs (autopar.calibration.fit.calibrate_user). `base` None: the
    shipped cost model of the runs' GPU; the file is named after it and applies to those GPUs."""
    from autopar.calibration.fit import calibrate_user

    return calibrate_user(path, _cost_model_file(base) if base else None, command, iters=iters)


def uncalibrated_error(path: str, base: str | None) -> float | None:
    """Mean absolute error of the base cost model, unfitted, on a runs YAML: what a calibration's
    held-out error must beat (autopar.calibration.fit.uncalibrated_mape)."""
    from autopar.calibration.fit import uncalibrated_mape

    return uncalibrated_mape(path, _cost_model_file(base) if base else None)


def calibration_base_warning(path: Any, base: str | None) -> str | None:
    """A line when `base`, given for a calibration on a runs YAML, lists none of the runs' GPUs:
    the parameters the runs cannot identify keep another GPU's values. None without a base."""
    if not base:
        return None
    from autopar.calibration.fit import runs_gpus, stated_runs

    f = _cost_model_file(base)
    gpus = runs_gpus(stated_runs(path))  # a runs YAML, or the runs read from training logs
    if set(gpus) & set(f.gpus):
        return None
    return (f"--base {base} is for {', '.join(f.gpus)}, and the runs are on {', '.join(gpus)}: what the runs "
            "do not fit keeps that GPU's values; drop --base to start from the runs' GPU's own model")


def cost_model_gpu_warning(cluster: str, cost_model: str | None) -> str | None:
    """A line when the cost model given (a name or file) does not list the GPU of `cluster` among
    its `gpus`: its efficiencies were measured or fitted on another GPU. None when it does, or
    when no cost model is given (the cluster's own is used)."""
    if not cost_model:
        return None
    from autopar.hardware import load_profile

    f = _cost_model_file(cost_model)
    gpu = load_profile(cluster).gpu.name
    if gpu in f.gpus:
        return None
    return (f"cost model {f.name} ({cost_model}) is for {', '.join(f.gpus)}, and {cluster} has {gpu}: its "
            "efficiencies may not hold there; calibrate on runs of this GPU, or drop --cost-model to use its own")


def derive_cost_model(base: str, name: str, gpus: list[str], command: str, reason: str = "") -> CostModelFile:
    """A cost model for GPUs without measured runs: `base`'s efficiencies under `name`, for `gpus`
    (GPU names as in hardware profiles), with `reason` recorded (autopar.calibration.fit.derive)."""
    from autopar.calibration.fit import derive

    return derive(_cost_model_file(base), name, gpus, command, reason)


def _cost_model_file(name: str) -> CostModelFile:
    from autopar.cost.params import load_cost_model

    return load_cost_model(name)[0]


def profile(device: str = "cpu", model: str = "llama3-8b", quick: bool = False, base: str | None = None,
            command: str = "autopar profile", progress=None) -> CostModelFile:
    """GEMM, attention, memory bandwidth and collectives measured on this machine, as a cost-model file
    (returned, not written; autopar.profile). `base`: the cost model whose unmeasured parameters to keep."""
    from autopar.profile import profile as run

    return run(device, model, quick, base, command, progress)


def explain_plan(model: str, cluster: str, gpus: int, plan: ParallelPlan, cost_model: str | None = None,
                 memory_margin: float = DEFAULT_MEMORY_MARGIN) -> Explanation:
    """Why `plan` wins: per-stage time and memory, and the verdict on every neighbouring plan
    (autopar.report.explain)."""
    from autopar.report.explain import explain as run

    return run(model, cluster, gpus, plan, cost_model, memory_margin)


def explain(plan_file: str | None = None, plan_string: str | None = None, *, model: str | None = None,
            cluster: str | None = None, gpus: int | None = None, global_batch: int | None = None,
            seq_len: int | None = None, framework: Framework = Framework.MEGATRON, cost_model: str | None = None,
            memory_margin: float = DEFAULT_MEMORY_MARGIN) -> Explanation:
    """explain_plan of a plan JSON (its target's model, cluster and GPUs), or of a plan string such as
    'tp=8,pp=4,mbs=1' with model, cluster, gpus and global_batch."""
    from autopar.errors import SchemaError

    if plan_file:
        pf, plan, _ = score_plan_file(plan_file, cost_model, memory_margin)
        model, cluster, gpus = pf.target.model, pf.target.cluster, pf.target.gpus
    elif plan_string:
        missing = [n for n, v in (("--model", model), ("--cluster", cluster), ("--gpus", gpus),
                                  ("--global-batch", global_batch)) if v is None]
        if missing:
            raise SchemaError(f"--plan needs {', '.join(missing)}")
        seq = seq_len or load_model(model).spec.seq_length
        plan = plan_from_assignments(plan_string, gpus, global_batch, seq, framework=framework)
    else:
        raise SchemaError("explain needs a plan JSON or --plan 'tp=...,pp=...' with --model --cluster --gpus --global-batch")
    return explain_plan(model, cluster, gpus, plan, cost_model, memory_margin)


def sweep(model: str, cluster: str, gpus: str, global_batch: str, seq_len: str | None = None, *,
          framework: Framework = Framework.MEGATRON, precision: Precision = Precision.BF16, fix: str | None = None,
          max_tp: int | None = None, memory_margin: float = DEFAULT_MEMORY_MARGIN, cost_model: str | None = None,
          progress=None) -> list[SweepPoint]:
    """The best plan at each point of a sweep (autopar.report.sweep). gpus, global_batch and seq_len
    are comma-separated values or one value ('64,128,256'); the lists given are zipped point by point.
    Raises NoFeasiblePlanError when no point has a plan that fits."""
    from autopar.errors import NoFeasiblePlanError
    from autopar.report.sweep import parse_values, sweep as run

    g, b = parse_values(gpus, "--gpus"), parse_values(global_batch, "--global-batch")
    s = parse_values(seq_len, "--seq-len") if seq_len else None
    points = run(model, cluster, gpus_list=g if len(g) > 1 else None, global_batch_list=b if len(b) > 1 else None,
                 seq_len_list=s if s and len(s) > 1 else None, gpus=g[0], global_batch=b[0],
                 seq_len=s[0] if s else None, framework=framework, precision=precision, fix=fix,
                 memory_margin=memory_margin, cost_model=cost_model, max_tp=max_tp, progress=progress)
    if not any(p.plan is not None for p in points):
        raise NoFeasiblePlanError("no point of the sweep has a plan that fits: " + "; ".join(
            f"{p.gpus} GPUs: {p.reason}" for p in points[:3]))
    return points


def plan_file_text(model: str, cluster: str, gpus: int, plan: ParallelPlan, est: Estimate,
                   cost_model: str | None = None, run: dict[str, Any] | None = None) -> str:
    """The plan JSON `autopar plan --out` writes (plan_file_for; equal plans give equal bytes)."""
    from autopar.schema.plan_file import plan_file_text as text

    return text(plan_file_for(model, cluster, gpus, plan, est, cost_model, run))


def check_outputs(paths: list[str], force: bool = False, inputs: list[str] = ()) -> None:
    """Refuse, before any work, outputs that exist (unless `force`), cannot be files or be written
    there, name one file twice or are one of the command's `inputs` (autopar.io)."""
    from autopar.io import check_output, check_outputs_apart

    for path in paths:
        check_output(path, force)
    check_outputs_apart(paths, inputs)


def write_output(path: str, text: str | bytes, force: bool = False, inputs: list[str] = ()) -> str:
    """Write one file atomically; an existing file is refused unless `force`, one of `inputs`
    always (autopar.io)."""
    from autopar.io import write_output as write

    return write(path, text, force=force, inputs=inputs)


def write_outputs(path_to_text: dict[str, str | bytes], force: bool = False, inputs: list[str] = ()) -> list[str]:
    """Write every file or none, atomically; existing files are refused unless `force`, one of
    `inputs` always (autopar.io)."""
    from autopar.io import write_outputs as write

    return write(path_to_text, force=force, inputs=inputs)


# --------------------------------------------------------------------------- the whole run


def run_options(train_tokens: str | None, *, gpu_hour_cost: float | None = None, failure_rate: float | None = None,
                checkpoint_gb_per_s: float | None = None, restart_minutes: float | None = None,
                async_save: bool = False, checkpoint_minutes: float | None = None):
    """The RunOptions of --train-tokens and its companions (autopar.cost.run), or None without
    --train-tokens; every value checked, each refusal one line naming the fix."""
    import math

    from autopar.cost.run import (DEFAULT_CHECKPOINT_BYTES_PER_S, DEFAULT_FAILURES_PER_GPU_DAY, DEFAULT_RESTART_S,
                                  RunOptions, parse_tokens)
    from autopar.units import GB

    given = {"--gpu-hour-cost": gpu_hour_cost, "--failure-rate": failure_rate,
             "--checkpoint-gb-per-s": checkpoint_gb_per_s, "--restart-minutes": restart_minutes,
             "--checkpoint-minutes": checkpoint_minutes, "--async-save": async_save or None}
    if train_tokens is None:
        named = [k for k, v in given.items() if v is not None]
        if named:
            raise InvalidPlanError(f"{', '.join(named)} price a whole run and need --train-tokens (e.g. 15.6T); "
                                   f"add it or drop {', '.join(named)}")
        return None
    for name, value, lowest in (("--gpu-hour-cost", gpu_hour_cost, 0.0), ("--failure-rate", failure_rate, 0.0),
                                ("--checkpoint-gb-per-s", checkpoint_gb_per_s, 0.0),
                                ("--checkpoint-minutes", checkpoint_minutes, 0.0)):
        if value is not None and not (math.isfinite(value) and lowest < value < 1e15):
            raise InvalidPlanError(f"{name} {value!r} must be a positive number; give one above 0")
    if restart_minutes is not None and not (math.isfinite(restart_minutes) and 0.0 <= restart_minutes < 1e9):
        raise InvalidPlanError(f"--restart-minutes {restart_minutes!r} must be 0 or more minutes")
    return RunOptions(
        train_tokens=parse_tokens(train_tokens), gpu_hour_cost_usd=gpu_hour_cost,
        failures_per_gpu_day=DEFAULT_FAILURES_PER_GPU_DAY if failure_rate is None else failure_rate,
        checkpoint_bytes_per_s=(DEFAULT_CHECKPOINT_BYTES_PER_S if checkpoint_gb_per_s is None
                                else checkpoint_gb_per_s * GB),
        restart_launch_s=DEFAULT_RESTART_S if restart_minutes is None else restart_minutes * 60.0,
        async_save=async_save, checkpoint_interval_s=None if checkpoint_minutes is None else checkpoint_minutes * 60.0)


def run_for(model, cluster: str, gpus: int, plan: ParallelPlan, est: Estimate, opts) -> dict[str, Any]:
    """The `run` block of one plan's estimate: days, GPU-hours, cost, interruptions, checkpoints
    and goodput to opts.train_tokens (autopar.cost.run.run_block), the days' band from the
    estimate's throughput band."""
    from autopar.cost.run import run_block
    from autopar.hardware import gpu_arch
    from autopar.validate.bands import estimate_band

    spec = framework_spec(plan.framework)
    if opts.async_save and not spec.async_checkpoint:
        raise InvalidPlanError(f"{plan.framework} saves checkpoints synchronously (it has no background save); "
                               "drop --async-save")
    low, high = estimate_band(plan, est)
    from autopar.model import build_graph

    graph = load_model(model) if isinstance(model, str) else build_graph(model)  # a name or a ModelSpec
    block = run_block(params=graph.total_params, num_gpus=gpus,
                      tokens_per_step=plan.global_batch * plan.seq_len, step_s=est.step_time_s,
                      tokens_per_s_low=low * gpus, tokens_per_s_high=high * gpus,
                      bytes_per_param=spec.checkpoint_bytes_per_param,
                      gpu_arch=gpu_arch(load_cluster(cluster, gpus).gpu_name), opts=opts)
    return {**block, "async_save": opts.async_save}



# --------------------------------------------------------------------------- your own cluster in the loop


def profile_distributed(out: str, *, cluster: str | None = None, quick: bool = False, timeout_s: float = 300,
                        force: bool = False, inputs: list[str] = (), command: str = "autopar profile --distributed"
                        ) -> dict[str, Any] | None:
    """Run on every rank under torchrun or srun: the collectives measured inside and across nodes;
    rank 0 writes the cluster profile `out` and its cost model beside it and returns what it wrote,
    the others return None (autopar.distributed_profile)."""
    from autopar.distributed_profile import profile_distributed as run

    return run(out, cluster=cluster, quick=quick, timeout_s=timeout_s, force=force, inputs=inputs, command=command)


def profile_launch_command(launcher: str, nodes: int, gpus_per_node: int, out: str, extra: str = "") -> str:
    """The torchrun command or Slurm batch script that runs `autopar profile --distributed`."""
    from autopar.distributed_profile import check_launch_options, launch_command

    check_launch_options(nodes)
    return launch_command(launcher, nodes, gpus_per_node, out, extra)


def log_runs(paths: list[str], cluster: str, *, model: str | None = None, framework: str | None = None,
             seq_len: int | None = None) -> tuple[list[Any], list[dict[str, Any]]]:
    """Measured runs from Megatron-LM, torchtitan or DeepSpeed training logs on `cluster` (a
    MeasuredRun each, with the plan its log states), and what was read from each log
    (autopar.logs.runs_from_logs): framework, release, steps used after warm-up, median step."""
    from autopar.logs import runs_from_logs

    return runs_from_logs(paths, cluster, model=model, framework=framework, seq_len=seq_len)


def validate_logs(paths: list[str], cluster: str, *, model: str | None = None, framework: str | None = None,
                  seq_len: int | None = None, cost_model: str | None = None) -> dict[str, Any]:
    """`validate --from-log`: each log's run predicted with the plan it states; validate's rows and
    summaries, plus `logs` (what was read from each) and `warmup_rule`."""
    from autopar.logs import WARMUP_RULE
    from autopar.validate.report import validate_stated

    runs, read = log_runs(paths, cluster, model=model, framework=framework, seq_len=seq_len)
    result = validate_stated(runs, cost_model)
    return {**result, "logs": read, "warmup_rule": WARMUP_RULE}
