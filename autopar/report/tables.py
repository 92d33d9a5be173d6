"""Rich tables for the CLI. Pure rendering: every number comes from autopar.api, but for an
estimate's error band, looked up in the shipped bands (autopar.validate.bands)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from autopar.units import GiB


def _whole(table: Table) -> Table:
    """Every column of `table` folds rather than cuts ("…"), and right-aligned (number) columns never
    wrap: a number and its unit stay on one line."""
    for column in table.columns:
        column.overflow = "fold"
        if column.justify == "right":
            column.no_wrap = True
    return table


def fits_width(console: Console, table: Table, natural: bool = False) -> bool:
    """Whether `table` prints at the console's width with every word and number whole (its
    minimum width: the longest word of each wrapping column, the widest cell of every other), or
    with `natural`, with no cell wrapped at all."""
    _whole(table)
    options = console.options.update_width(1 << 16)  # unclamped: Rich clamps a measure to the width
    needed = table._extra_width  # borders and the edge padding
    for column in table.columns:
        m = table._measure_column(console, options, column)  # cells and header, padding included
        needed += m.maximum if column.no_wrap or natural else m.minimum
    return needed <= console.width


def split_columns(console: Console, table: Table, keys: int = 1) -> list[Table]:
    """`table`'s columns in groups that each fit the console's width, the first `keys` columns
    (what names a row) repeated in every group; the title on the first, "(continued)" after."""
    head, rest = table.columns[:keys], table.columns[keys:]
    groups: list[list] = []
    for column in rest:
        if groups and fits_width(console, _part(table, head + groups[-1] + [column], "")):
            groups[-1].append(column)
        else:
            groups.append([column])
    return [_part(table, head + g, table.title if i == 0 else "(continued)" if table.title else "")
            for i, g in enumerate(groups or [[]])]


def _part(table: Table, columns: list, title) -> Table:
    t = Table(title=title or None, show_header=table.show_header)
    for c in columns:
        t.add_column(c.header, justify=c.justify, no_wrap=c.no_wrap, overflow=c.overflow, style=c.style,
                     header_style=c.header_style)
    cells = [list(c.cells) for c in columns]
    for i, row in enumerate(table.rows):
        t.add_row(*(col[i] for col in cells), style=row.style, end_section=row.end_section)
    return _whole(t)


def print_table(console: Console, table: Table, narrow: Table | None = None, keys: int = 1,
                unwrapped: bool = False) -> None:
    """Print `table` whole at the console's width (COLUMNS, also when piped): as it is when it fits
    (with `unwrapped`, only when no cell of it wraps), else `narrow` (the same figures in fewer
    columns, rows stacked) when it fits, else the columns of the narrowest split into tables that
    each fit, with the first `keys` columns in each."""
    for t, natural in ((table, unwrapped), (narrow, False)):
        if t is not None and fits_width(console, t, natural):
            console.print(_widths_set(console, t))
            return
    for part in split_columns(console, narrow if narrow is not None else table, keys):
        console.print(_widths_set(console, part))


def _widths_set(console: Console, table: Table) -> Table:
    """`table` with each column's width fixed between its minimum (longest word; a no-wrap
    column's widest cell) and its natural width, the room left shared in proportion to what each
    would take: Rich, left to itself, narrows a wrapping column below its longest word (cutting a
    header or a name) when the table is wider than the console."""
    options = console.options.update_width(1 << 16)
    measures = [table._measure_column(console, options, c) for c in table.columns]
    low = [m.maximum if c.no_wrap else m.minimum for m, c in zip(measures, table.columns)]
    spare = [m.maximum - lo for m, lo in zip(measures, low)]
    room = console.width - table._extra_width - sum(low)
    if room >= sum(spare) or room < 0:  # it fits as it is, or nothing can make it fit (folds)
        return table
    for i, (column, lo, extra) in enumerate(zip(table.columns, low, spare)):
        column.width = lo + extra * room // sum(spare) - table._get_padding_width(i)
    return table


def human_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    return f"{t * 1e3:.1f} ms"


def models_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Model presets")
    for col in ("name", "params", "active", "layers", "hidden", "source"):
        t.add_column(col, justify="right" if col in ("params", "active", "layers", "hidden") else "left",
                     no_wrap=col == "name")
    for r in rows:
        t.add_row(r["name"], human_count(r["total_params"]), human_count(r["active_params"]), str(r["layers"]),
                  str(r["hidden_size"]), r["source"])
    return t


def clusters_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Cluster profiles")
    for col in ("name", "gpu", "gpus/node", "domain", "bf16 TFLOP/s", "HBM", "NVLink GB/s", "network"):
        t.add_column(col, no_wrap=col == "name",
                     justify="right" if col in ("gpus/node", "bf16 TFLOP/s", "HBM", "NVLink GB/s") else "left")
    for r in rows:  # domain: GPUs of one scale-up domain and how they are joined (switch or mesh)
        t.add_row(r["name"], r["gpu"], str(r["gpus_per_node"]),
                  f"{r['scale_up_domain_gpus']} {r['scale_up']['fabric']}", f"{r['bf16_tflops']:g}",
                  f"{r['hbm_gib']:g} GiB", f"{r['nvlink_gb_per_s']:g}", r["network"])
    return t


def print_inspect(console: Console, info: dict[str, Any]) -> None:
    console.print(f"[bold]{info['model']}[/]  ({info['source']})")
    console.print(f"total parameters  {info['total_params']:,}   active per token  {info['active_params']:,}")
    console.print(f"training FLOPs per token at seq {info['seq_len']}: {info['flops_per_token']:.4g} "
                  f"(6N = {info['flops_per_token_6n']:.4g} + causal attention {info['attention_flops_per_token']:.4g})")
    t = Table(title="Layers")
    for col in ("layer", "count", "params", "active", "fwd matmul FLOP/token", "fwd attention FLOP/token",
                "activation bytes/token"):
        t.add_column(col, justify="right" if col != "layer" else "left")
    for r in info["layers"]:
        f = r["forward_flops_per_token"]
        t.add_row(r["name"], str(r["count"]), human_count(r["params"]), human_count(r["active_params"]),
                  f"{f['matmul']:.4g}", f"{f['attention']:.4g}", f"{r['activation_bytes_per_token']:,.0f}")
    print_table(console, t)
    z = Table(title=f"Model states per GPU ({info['framework']} bytes, dp {info['dp']}, no tp/pp split)")
    for stage in info["model_state_bytes_per_gpu_by_zero"]:
        z.add_column(f"ZeRO {stage}", justify="right")
    z.add_row(*(gib(v) for v in info["model_state_bytes_per_gpu_by_zero"].values()))
    print_table(console, z)


def _fp8_casts_note(plan) -> str:
    """How an fp8 plan's linears cast when it is not Transformer Engine's way (torchao's, under
    torchtitan: the profile's fp8_casts, autopar.frameworks), for the header."""
    if str(plan.precision) != "fp8":
        return ""
    from autopar.frameworks import framework_profile  # only for fp8 plans

    recipe = framework_profile(plan.framework, plan.framework_release).fp8_casts
    return "" if recipe == "te" else f" ({recipe.replace('_', ' ')} float8 casts)"


def print_estimate(console: Console, plan, est) -> None:
    console.print(f"[bold]{plan.layout()}[/] dp{est.dp} mbs {plan.mbs} · {est.num_microbatches} microbatches · "
                  f"zero {plan.zero} · recompute {plan.recompute.label(plan.framework)} · {plan.precision} · "
                  f"{plan.framework}"
                  + (" (eager, no torch.compile)" if plan.torch_compile is False else "")
                  + (" (experts one by one, no grouped GEMM)" if not plan.moe_grouped_gemm else "")
                  + _fp8_casts_note(plan))
    from autopar.validate.bands import estimate_band, estimate_band_sources

    fits = "[green]fits[/]" if est.fits else "[bold red]does NOT fit[/]"
    low, high = estimate_band(plan, est)
    console.print(f"step {seconds(est.step_time_s)}   {est.tokens_per_s:,.0f} tokens/s   "
                  f"{est.tokens_per_s_per_gpu:,.1f} tokens/s/GPU (band that held 80 % of runs on unseen sources, "
                  f"from {estimate_band_sources(plan, est)} sources: {low:,.0f}-{high:,.0f})   MFU {est.mfu:.1%}")
    console.print(f"model {est.model_tflops_per_gpu:.1f} TFLOP/s/GPU, hardware (with recompute) "
                  f"{est.hardware_tflops_per_gpu:.1f} TFLOP/s/GPU   peak memory {gib(est.peak_memory_bytes)} of "
                  f"{usable_label(est)}: {fits}")
    t = Table(title="Time per step (bottleneck pipeline rank)")
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k, v in est.time_breakdown_s.items():
        t.add_row(k.replace("_", " "), f"{v:.3f}", f"{v / est.step_time_s:.1%}")
    print_table(console, t)
    s = Table(title="Pipeline ranks")
    for col in ("rank", "layers", "fwd/mb", "bwd/mb", "memory", "weights", "grads", "optimizer", "activations"):
        s.add_column(col, justify="right")
    for row in est.stages:
        b = row.memory_breakdown_bytes
        s.add_row(str(row.rank), "+".join(map(str, row.layers)), seconds(row.fwd_s), seconds(row.bwd_s),
                  gib(row.memory_bytes), gib(b["weights"]), gib(b["gradients"]), gib(b["optimizer"]),
                  gib(b["activations"]))
    print_table(console, s)
    for note in est.notes:
        console.print(f"[dim]{note}[/]")


def usable_label(est) -> str:
    """'72.0 GiB usable (80.0 GiB HBM, 10% kept free)': what "fits" is judged against."""
    return (f"{gib(est.usable_memory_bytes)} usable ({gib(est.memory_capacity_bytes)} HBM, "
            f"{est.memory_margin:.0%} kept free)")


def _summary_row(t: Table, name: str, s: dict[str, float]) -> None:
    t.add_row(name, str(s["count"]), f"{s['mape']:.1%}", f"{s['median']:.1%}", f"{s['p90']:.1%}", f"{s['worst']:.1%}",
              f"{s.get('fits', 0)}/{s['count']}")


def _error_cell(err: float) -> str:
    style = "red" if abs(err) > 0.25 else ("yellow" if abs(err) > 0.1 else "")
    return f"[{style}]{err:+.1%}[/]" if style else f"{err:+.1%}"


def _chosen_label(c: dict) -> str:
    return f"mbs{c['mbs']} v{c['vpp']} {c['recompute']}" + (" tpo" if c["tp_comm_overlap"] else "")


def validate_rows_table(result: dict[str, Any], narrow: bool = False) -> Table:
    """Predicted vs measured per run; narrow: the run's source, GPUs and plan stacked under its id,
    measured over predicted."""
    t = Table(title=f"Predicted vs measured tokens/s/GPU ({result['split']} runs)")
    cols = (("run", "measured\npredicted", "error") if narrow else
            ("run", "source", "gpus", "layout", "chosen", "measured", "predicted", "error"))
    for col in cols:
        t.add_column(col, justify="left" if col in ("run", "source", "layout", "chosen") else "right")
    for r in result["rows"]:
        measured, predicted = (f"{r['measured_tokens_per_s_per_gpu']:,.1f}",
                               f"{r['predicted_tokens_per_s_per_gpu']:,.1f}")
        if narrow:
            t.add_row(f"{r['run_id']}\n{r['source']} · {r['gpus']} GPUs\n{r['layout']} {_chosen_label(r['chosen'])}",
                      f"{measured}\n{predicted}", _error_cell(r["error"]), end_section=True)
        else:
            t.add_row(r["run_id"], r["source"], str(r["gpus"]), r["layout"], _chosen_label(r["chosen"]),
                      measured, predicted, _error_cell(r["error"]))
    return t


def _memory_rows_table(mem: dict[str, Any], narrow: bool = False) -> Table:
    m = Table(title="Peak memory, runs that measured it (predicted for the chosen plan)")
    cols = ("run", "GiB measured\npredicted", "error") if narrow else ("run", "measured GiB", "predicted GiB", "error")
    for col in cols:
        m.add_column(col, justify="left" if col == "run" else "right")
    for r in mem["rows"]:
        gibs = (f"{r['measured_gib']:.1f}\n{r['predicted_gib']:.1f}",) if narrow else \
            (f"{r['measured_gib']:.1f}", f"{r['predicted_gib']:.1f}")
        m.add_row(r["run_id"], *gibs, f"{r['error']:+.1%}", end_section=narrow)
    return m


def print_validate(console: Console, result: dict[str, Any], rows: bool = True) -> None:
    if rows:
        print_table(console, validate_rows_table(result), validate_rows_table(result, narrow=True))
    s = Table(title=f"Error of tokens/s/GPU, {result['split']} runs")
    for col in ("group", "runs", "MAPE", "median", "P90", "worst", "fit in memory"):
        s.add_column(col, justify="left" if col == "group" else "right")
    _summary_row(s, "all", result["summary"])
    for name, summ in result["by_hardware"].items():
        _summary_row(s, f"hardware {name}", summ)
    for name, summ in result["by_source"].items():
        _summary_row(s, f"source {name}", summ)
    for name, summ in result.get("by_framework", {}).items():
        _summary_row(s, f"framework {name}", summ)
    for name, summ in result.get("by_gpu_arch", {}).items():
        _summary_row(s, f"gpu {name}", summ)
    for name, summ in result.get("by_regime", {}).items():
        _summary_row(s, f"regime {name}", summ)
    print_table(console, s)
    mem = result.get("memory")
    if mem and mem["runs"]:
        print_table(console, _memory_rows_table(mem), _memory_rows_table(mem, narrow=True))
    console.print(f"[dim]{result['method']}[/]")


def print_loso(console: Console, result: dict[str, Any]) -> None:
    """`autopar validate --leave-one-source-out`: each source scored by a fit that never saw it."""
    t = Table(title="Leave-one-source-out error of tokens/s/GPU (each source predicted by a refit without it)")
    for col in ("group", "runs", "median APE", "in band"):
        t.add_column(col, justify="left" if col == "group" else "right")
    ranked = {row["source"]: row for row in result.get("rank_accuracy", {}).get("sources", [])}
    for row in result["sources"]:
        t.add_row(f"source {row['source']}", str(row["runs"]), f"{row['median_ape']:.1f}%", "")
    for row in result["regimes"]:
        cov = row.get("band_coverage")
        t.add_row(f"regime {row['regime']}", str(row["runs"]), f"{row['median_ape']:.1f}%",
                  "" if "band_sources" not in row else
                  f"{'n/a' if cov is None else format(cov, '.0%')} ({row['band_sources']} src)")
    for row in result.get("hardware", []):
        t.add_row(f"gpu {row['gpu_arch']}", str(row["runs"]), f"{row['median_ape']:.1f}%", "")
    mem = result["memory"]
    if mem["runs"]:
        t.add_row("peak memory", str(mem["runs"]), f"{mem['median_ape']:.1f}%", "")
    print_table(console, t)
    console.print(f"median APE {result['median_ape']:.1f}%, P90 {result['p90_ape']:.1f}% (each source weighted "
                  f"equally); {result['fit_rate']:.1%} of measured runs predicted to fit")
    if result.get("band_coverage") is not None:
        console.print(f"{result['band_coverage']:.0%} of withheld runs inside the band built without their source")
    rank = result.get("rank_accuracy")
    if rank and rank["pairs"]:
        by = ", ".join(f"{s} {r['correct_share']:.0%} of {r['pairs']:,}" for s, r in ranked.items())
        console.print(f"plan pairs ranked right: {rank['correct_share']:.1%} of {rank['pairs']:,} ({by})")


def _plan_row(plan, est) -> list[str]:
    return [plan.layout(), str(est.dp), str(plan.mbs), str(plan.zero), plan.recompute.label(plan.framework),
            seconds(est.step_time_s), _with_band(plan, est), f"{est.mfu:.1%}", _memory(est), _free(est),
            f"{est.bubble_fraction:.1%}", f"{est.exposed_comm_fraction:.1%}"]


_PLAN_COLUMNS = ("layout", "dp", "mbs", "zero", "recompute", "step", "tok/s/GPU 80% band", "MFU", "memory",
                 "free", "bubble", "exposed comm")


def _memory(est) -> str:
    return f"{est.peak_memory_bytes / GiB:.1f}/{est.memory_capacity_bytes / GiB:.0f} GiB"


def _free(est) -> str:
    """Usable memory left at the predicted peak; "at limit" when the peak is within the memory
    model's error of the usable memory (autopar.search.rank.at_memory_limit)."""
    from autopar.search.rank import at_memory_limit, headroom_bytes

    room = f"{headroom_bytes(est) / GiB:.1f} GiB"
    return f"[yellow]{room} at limit[/]" if est.fits and at_memory_limit(est) else room


def _memory_narrow(est) -> str:
    """Peak/HBM over what is free, stacked (plans_table_narrow)."""
    from autopar.search.rank import at_memory_limit, headroom_bytes

    free = f"{headroom_bytes(est) / GiB:.1f} GiB free"
    return f"{_memory(est)}\n" + (f"[yellow]{free}\nat limit[/]" if est.fits and at_memory_limit(est) else free)


def _with_band(plan, est, sep: str = " ") -> str:
    """tokens/s/GPU with the leave-one-source-out error band of the plan's regime (relative; it held
    the measured value for 80 % of the runs of sources it was not built from)."""
    from autopar.validate.bands import estimate_band

    tps = est.tokens_per_s_per_gpu
    low, high = estimate_band(plan, est)
    if not high or not tps:
        return f"{tps:,.0f}"
    return f"{tps:,.0f}{sep}{low / tps - 1:+.0%}/{high / tps - 1:+.0%}"


def _plans_title(n: int, band: str) -> str:
    return (f"Best {n} distinct plans (≈ = equivalent to the fastest within the model's ±{band} error, "
            "simplest first: room in memory, then fewer virtual stages, no cp, smaller tp, less recompute; "
            "then fastest first)")


def plans_table(rows, band: str) -> Table:
    """The distinct alternatives, one column per figure."""
    t = Table(title=_plans_title(len(rows), band))
    t.add_column("#", justify="right")
    t.add_column("≈")
    for col in _PLAN_COLUMNS:
        t.add_column(col, justify="left" if col in ("layout", "recompute") else "right", no_wrap=col == "layout")
    for i, row in enumerate(rows, 1):
        t.add_row(str(i), "≈" if row.equivalent_to_best else "", *_plan_row(row.plan, row.estimate),
                  style="bold green" if i == 1 else "")
    return t


def plans_table_narrow(rows, band: str) -> Table:
    """The same rows for a narrow terminal: the plan's settings stacked in one cell, memory and
    what is free in another, bubble and exposed communication left to the chosen plan's breakdown."""
    t = Table(title=_plans_title(len(rows), band))
    for col in ("#", "plan", "step", "tok/s/GPU", "MFU", "memory"):
        t.add_column(col, justify="left" if col == "plan" else "right", no_wrap=True)
    for i, row in enumerate(rows, 1):
        p, e = row.plan, row.estimate
        settings = f"{p.layout()}\ndp{e.dp} mbs{p.mbs} zero{p.zero}\n{p.recompute.label(p.framework)}"
        t.add_row(f"{i}{' ≈' if row.equivalent_to_best else ''}", settings, seconds(e.step_time_s),
                  _with_band(p, e, "\n"), f"{e.mfu:.1%}", _memory_narrow(e),
                  style="bold green" if i == 1 else "", end_section=True)
    return t


def print_plans(console: Console, result) -> None:
    """The distinct alternatives (autopar.search.rank): ≈ marks plans equivalent to the fastest
    within the model's error, listed simplest first; the raw ranking is in `plan --json`."""
    rows = result.alternatives or [_RawRow(p, e, i == 0) for i, (p, e) in enumerate(result.plans)]
    band = f"{result.band:.0%}"
    print_table(console, plans_table(rows, band), plans_table_narrow(rows, band))
    fastest, fastest_est = result.plans[0]
    if (fastest, fastest_est) != (rows[0].plan, rows[0].estimate):
        console.print(f"fastest found: {fastest.layout()} mbs {fastest.mbs} zero {fastest.zero} recompute "
                      f"{fastest.recompute.label(fastest.framework)}, {seconds(fastest_est.step_time_s)}; rows "
                      "differing only in vpp, mbs or zero are variants of one alternative (--json lists the raw "
                      "ranking).")
    console.print(f"[dim]searched {result.candidates:,} candidates: {result.pruned:,} pruned by bounds, "
                  f"{result.scored:,} scored, {result.feasible:,} fit, {result.refined:,} refined by DP/ILP, "
                  f"in {result.time_s:.2f} s; fit = peak ≤ {usable_label(result.plans[0][1])}; free = usable "
                  f"memory left at the peak, \"at limit\" when within the memory model's error of it[/]")
    for note in getattr(result, "notes", []) or []:
        console.print(f"[yellow]{note}[/]")
    plan, est = rows[0].plan, rows[0].estimate
    console.print("\n[bold]Chosen plan[/]" + (" (the simplest of those equivalent to the fastest)"
                                               if rows[0].equivalent_to_best and plan != fastest else ""))
    print_estimate(console, plan, est)


class _RawRow:
    """A raw (plan, estimate) shown as a row when a result carries no alternatives."""

    def __init__(self, plan, estimate, equivalent_to_best: bool) -> None:
        self.plan, self.estimate, self.equivalent_to_best = plan, estimate, equivalent_to_best


def print_compare(console: Console, entries) -> None:
    """Plans side by side: one column per plan, one row per figure; rows whose values differ are
    yellow, the winner (fastest plan that fits) is starred."""
    best = min(range(len(entries)), key=lambda i: (not entries[i][2].fits, entries[i][2].step_time_s))
    t = Table(title="Plans compared (★ = winner: the fastest that fits; rows that differ in yellow)")
    t.add_column("", style="bold")
    for i, (label, _, _) in enumerate(entries):
        name = label.rsplit("/", 1)[-1] if label.endswith(".json") else label
        t.add_column(("★ " if i == best else "") + name, justify="right", overflow="fold",
                     style="bold green" if i == best else "")
    rows = [_plan_row(p, e) + [gib(e.usable_memory_bytes), "yes" if e.fits else "NO"] for _, p, e in entries]
    for j, col in enumerate(_PLAN_COLUMNS + ("usable", "fits")):
        values = [r[j] for r in rows]
        differs = len(set(values)) > 1
        t.add_row(f"[yellow]{col}[/]" if differs else col, *values)
    for col, value in _SWITCH_ROWS:  # shown only where the compared plans differ in it
        values = [value(p) for _, p, _ in entries]
        if len(set(values)) > 1:
            t.add_row(f"[yellow]{col}[/]", *values)
    print_table(console, t)


def _elementwise_kernels(plan) -> str:
    """How the plan's framework runs the elementwise ops (autopar.frameworks, elementwise)."""
    from autopar.frameworks import framework_profile  # only when two plans' kernels may differ

    kind = framework_profile(plan.framework, plan.framework_release).elementwise
    if kind == "compile":
        return "eager (no torch.compile)" if plan.torch_compile is False else "compiled"
    return "eager (Hugging Face model)" if kind == "eager" else "fused kernels"


# Plan switches that change the price without changing the layout: a row in `compare` when they differ.
_SWITCH_ROWS = (
    ("precision", lambda p: str(p.precision)),
    ("framework", lambda p: str(p.framework)),
    ("norms, RoPE, activation", _elementwise_kernels),
    ("grouped GEMM", lambda p: "on" if p.moe_grouped_gemm else "off (experts one by one)"),
    ("tp comm overlap", lambda p: "on" if p.tp_comm_overlap else "off"),
)


def _days(block: dict) -> str:
    return f"{block['days']:,.1f} days (80 % band {block['days_low']:,.1f}–{block['days_high']:,.1f})"


def print_run(console: Console, block: dict, what: str = "") -> None:
    """The whole run of one plan (autopar.cost.run): days, GPU-hours, cost, goodput and why."""
    cost = f", ${block['cost_usd']:,.0f}" if block["cost_usd"] is not None else ""
    saved = "async, blocks" if block.get("async_save") else "sync, blocks"
    console.print(f"Run{' of the ' + what if what else ''}: {human_count(block['train_tokens'])} tokens in "
                  f"{block['steps']:,} steps: {_days(block)}, goodput {block['goodput']:.1%}")
    console.print(f"  {block['gpu_hours']:,.0f} GPU-hours{cost}; interrupted every {block['mtbf_hours']:.2f} h "
                  f"({block['interruptions']:,.0f} times), {block['restart_s'] / 60:.3g} min a restart")
    console.print(f"  a {block['checkpoint_bytes'] / 1e12:.3g} TB checkpoint every "
                  f"{block['checkpoint_interval_steps']:,} "
                  f"steps ({block['checkpoint_interval_s'] / 60:.3g} min; {saved} {block['checkpoint_write_s']:.3g} s)")


def print_runs(console: Console, rows: list, title: str = "Whole run") -> None:
    """One row per plan or sweep point: days, GPU-hours, cost, goodput, interruptions (None: no plan)."""
    t = Table(title=title)
    for col in ("plan", "days", "80% band", "GPU-hours", "cost", "goodput", "interruptions"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for label, block in rows:
        if block is None:
            t.add_row(str(label), "—", "—", "—", "—", "—", "—")
            continue
        cost = f"${block['cost_usd']:,.0f}" if block["cost_usd"] is not None else "—"
        t.add_row(str(label), f"{block['days']:,.1f}", f"{block['days_low']:,.1f}–{block['days_high']:,.1f}",
                  f"{block['gpu_hours']:,.0f}", cost, f"{block['goodput']:.1%}", f"{block['interruptions']:,.0f}")
    print_table(console, t)

