"""Estimate equals the search, for every framework: a plan the search prices, typed into
`autopar estimate` with the CLI's own options as a user would type it, gets the search's step time
and peak memory, bit for bit.

Bit for bit, not within a tolerance: the search prices a candidate with `estimate` itself, sharing
one StepMemo whose numbers are bit-identical to a fresh estimate (autopar.cost.step), and `--json`
writes floats that read back exactly.

Three checks:
  * sampled candidates: a seeded sample of the candidates the search enumerates (space.valid_bases,
    every recompute choice), of each space (dense, context parallel, pipeline, ZeRO 3, MoE) under
    every framework that can express it, priced as the search prices them (one Pricer for the
    space: its bounds, then Pricer.estimate of the trusted plan, as driver._visit does);
  * listed plans: every plan `autopar plan --json` lists (refined ones included: full(K), a
    DP-moved layer split), re-typed from its printed record;
  * torchtitan tp2 cp2 (its CP exchange once lived in the search alone) through `plan --fix` and
    through `estimate`.

A plan field `estimate` has no option for (`CLI_LESS_FIELDS`) is left to the CLI's default; the
search's plan must then hold that same default, or `estimate` prices another plan. The check
compares the whole plan record first, so a failure names the field (e.g. a CP exchange or a layer
split that the search's plan carries and the plan `estimate` builds does not).
"""

from __future__ import annotations

import functools
import json
import random

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.step import DEFAULT_MEMORY_MARGIN
from autopar.inputs import load_cluster, load_model, resolve_cost_model
from autopar.report.records import plan_to_dict
from autopar.schema.plan import Framework, ParallelPlan
from autopar.search.costs import Pricer
from autopar.search.space import as_plan, candidate_drafts, space_spec_for

runner = CliRunner()
CLUSTER = "dgx-h100"
SAMPLES = 8  # candidates per (space, framework): the file runs in well under a minute

# ParallelPlan fields `autopar estimate` has no option for (it leaves them at ParallelPlan's
# defaults); every other field is typed. A plan the search makes with any of these off its default
# cannot be expressed through the CLI.
CLI_LESS_FIELDS = ("zero_shard_size", "overlap_grad_reduce", "overlap_param_gather", "moe_dispatcher",
                   "moe_load_imbalance", "moe_capacity_factor", "moe_grouped_gemm", "grad_reduce_in_bf16",
                   "framework_release")

MEG, TT, DS = Framework.MEGATRON.value, Framework.TORCHTITAN.value, Framework.DEEPSPEED.value
# space -> (model, gpus, seq_len, global_batch, fix as `plan --fix` takes it, which candidates, frameworks)
# DeepSpeed has no CP, EP or interleaving; torchtitan builds no Mixtral, so the MoE space is
# Qwen3-30B-A3B (128 experts) for both; Megatron searches ZeRO 3 only when pinned (space.zero_options).
SPACES = {
    "dense": ("llama3-8b", 16, 16384, 32, "", lambda d: True, (MEG, TT, DS)),
    "cp": ("llama3-8b", 16, 16384, 32, "", lambda d: d.cp > 1, (MEG, TT)),
    "pipeline": ("llama3-70b", 64, 4096, 128, "", lambda d: d.pp > 1, (MEG, TT, DS)),
    "zero3": ("llama3-8b", 16, 8192, 32, "zero=3", lambda d: d.zero == 3, (MEG, TT, DS)),
    "moe": ("qwen3-30b-a3b", 16, 4096, 32, "mbs=1", lambda d: d.ep > 1, (MEG, TT)),
}
CASES = [(space, fw) for space, entry in SPACES.items() for fw in entry[-1]]
# For the listed plans, also a pinned pipeline without interleaving, so that the partition DP moves
# layers: its plans carry layers_per_stage (estimate's --layers-per-stage).
LISTED = CASES + [("pipeline-pp8", fw) for fw in (MEG, TT, DS)]
SPACE_ARGS = {**{k: v[:5] for k, v in SPACES.items()}, "pipeline-pp8": ("llama3-70b", 64, 4096, 128, "pp=8,vpp=1")}


def _fix(text: str) -> dict:
    """A `--fix` string (integer axes only) as the search's fix dict."""
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def estimate_args(model: str, gpus: int, record: dict) -> list[str]:
    """`autopar estimate` of a plan record (records.plan_to_dict, as `plan --json` prints it), every
    field with an option typed; the CLI-less ones (CLI_LESS_FIELDS) are left to its defaults."""
    r = record["recompute"]
    args = ["estimate", model, "-c", CLUSTER, "-n", str(gpus), "-b", str(record["global_batch"]),
            "-s", str(record["seq_len"]), "--framework", record["framework"], "--precision", record["precision"]]
    for axis in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero"):
        args += [f"--{axis}", str(record[axis])]
    args += ["--sp" if record["sp"] else "--no-sp", "--recompute", r["mode"],
             "--recompute-modules", ",".join(r["modules"])]
    if r["num_layers"] is not None:
        args += ["--recompute-layers", str(r["num_layers"])]
    args.append("--tp-comm-overlap" if record["tp_comm_overlap"] else "--no-tp-comm-overlap")
    if record["torch_compile"] is not None:
        args.append("--torch-compile" if record["torch_compile"] else "--no-torch-compile")
    if record["cp"] > 1:  # at cp 1 the plan carries the framework's default, whatever is typed
        args += ["--cp-comm-type", record["cp_comm_type"]]
    if record["layers_per_stage"] is not None:
        args += ["--layers-per-stage", ",".join(map(str, record["layers_per_stage"]))]
    return args + ["--json"]


def cli_estimate(model: str, gpus: int, record: dict) -> dict:
    args = estimate_args(model, gpus, record)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, f"autopar {' '.join(args)} refused a plan the search made:\n{result.output}"
    return json.loads(result.output)


def differences(model: str, gpus: int, record: dict, step_time_s: float, peak_memory_bytes: float) -> list[str]:
    """What `autopar estimate` of `record` gives otherwise than the search: plan fields, then the
    step time, peak memory and time terms (empty when it prices the search's plan alike)."""
    out = cli_estimate(model, gpus, record)
    got = out["parallel"]
    diffs = [f"{k}: search {record[k]!r}, estimate {got.get(k)!r}"
             + (" (no estimate option)" if k in CLI_LESS_FIELDS else "")
             for k in record if record[k] != got.get(k)]
    for name, want in (("step_time_s", step_time_s), ("peak_memory_bytes", peak_memory_bytes)):
        if out[name] != want:
            diffs.append(f"{name}: search {want!r}, estimate {out[name]!r} ({out[name] / want - 1:+.3e})")
    return diffs


def _label(record: dict) -> str:
    axes = ",".join(f"{k}={record[k]}" for k in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "sp"))
    r = record["recompute"]
    return f"{axes},recompute={r['mode']}" + (f"({r['num_layers']})" if r["num_layers"] is not None else "")


@functools.lru_cache(maxsize=None)
def _inputs(model: str, gpus: int):
    cluster = load_cluster(CLUSTER, gpus)
    return load_model(model), cluster, resolve_cost_model(cluster, None)


def search_priced_sample(space: str, framework: str) -> list[tuple[ParallelPlan, float, float]]:
    """A seeded sample of the space's candidates (those its predicate keeps), each with the step
    time and peak memory the search gives it: one Pricer for the space, each candidate's memory and
    time bounds first (as driver._visit reaches it: they fill the tables and memos the estimate
    shares), then Pricer.estimate of its trusted plan."""
    model, gpus, seq, gbs, fix, keep, _ = SPACES[space]
    graph, cluster, p = _inputs(model, gpus)
    spec = space_spec_for(graph, cluster, seq, gbs, framework=framework, fix=_fix(fix))
    pool = [d for d in candidate_drafts(spec) if keep(d)]
    assert pool, f"the {space} space under {framework} has no candidate to sample"
    sample = random.Random(f"{space}/{framework}").sample(pool, min(SAMPLES, len(pool)))
    pricer = Pricer(graph, cluster, p)
    out = []
    for draft in sample:
        pricer.quick_memory_lower_bound_bytes(draft)
        pricer.rank_memory_lower_bound_bytes(draft)
        pricer.time_lower_bound_s(draft)
        plan = as_plan(draft)
        est = pricer.estimate(plan, DEFAULT_MEMORY_MARGIN)
        out.append((plan, est.step_time_s, est.peak_memory_bytes))
    return out


@pytest.mark.parametrize(("space", "framework"), CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_sampled_candidates_price_alike_through_estimate(space, framework):
    model, gpus = SPACES[space][:2]
    sample = search_priced_sample(space, framework)
    failures = []
    for plan, step_s, peak_bytes in sample:
        record = plan_to_dict(plan, gpus)
        diffs = differences(model, gpus, record, step_s, peak_bytes)
        if diffs:
            failures.append(f"{_label(record)}: " + "; ".join(diffs))
    assert not failures, f"{space} under {framework}: estimate differs from the search on " + \
        f"{len(failures)}/{len(sample)} sampled candidates:\n" + "\n".join(failures)


@pytest.mark.parametrize(("space", "framework"), LISTED, ids=[f"{s}-{f}" for s, f in LISTED])
def test_every_plan_the_plan_command_lists_prices_alike_through_estimate(space, framework):
    model, gpus, seq, gbs, fix = SPACE_ARGS[space]
    args = ["plan", model, "-c", CLUSTER, "-n", str(gpus), "-s", str(seq), "-b", str(gbs), "--framework", framework,
            "--top", "5", "--json", "-q"] + (["--fix", fix] if fix else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    listed = {json.dumps(e["parallel"], sort_keys=True): e for e in data["plans"] + data["alternatives"]}
    failures = []
    for entry in listed.values():
        record, est = entry["parallel"], entry["estimate"]
        diffs = differences(model, gpus, record, est["step_time_s"], est["peak_memory_bytes"])
        if diffs:
            failures.append(f"{_label(record)}: " + "; ".join(diffs))
    assert not failures, f"`autopar {' '.join(args)}`: estimate differs on {len(failures)}/{len(listed)} listed " + \
        "plans:\n" + "\n".join(failures)


def test_torchtitan_cp_through_plan_fix_equals_estimate():
    """Issue 27's case, both commands as a user types them: torchtitan's CP under `plan --fix` and
    under `estimate` (whose defaults are mbs 1, ZeRO 3 for torchtitan, selective recompute)."""
    common = ["llama3-8b", "-c", CLUSTER, "-n", "16", "-b", "32", "-s", "16384", "--framework", TT, "--json"]
    planned = runner.invoke(app, ["plan", *common, "-q", "--fix", "tp=2,pp=1,cp=2,mbs=1,zero=3,recompute=selective"])
    estimated = runner.invoke(app, ["estimate", *common, "--tp", "2", "--cp", "2"])
    assert planned.exit_code == 0 and estimated.exit_code == 0, planned.output + estimated.output
    best, est = json.loads(planned.output)["plans"][0], json.loads(estimated.output)
    assert best["parallel"] == est["parallel"]
    assert best["estimate"]["step_time_s"] == est["step_time_s"]
    assert best["estimate"]["peak_memory_bytes"] == est["peak_memory_bytes"]
