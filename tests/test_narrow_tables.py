"""Tables a person reads at 80 columns (issue 32): every command's tables are whole at COLUMNS=80
and at COLUMNS=200, also when piped (CliRunner's output is not a terminal). Whole: no line wider
than COLUMNS, no "…" cutting a layout or a number, and the figures the command's --json gives
appear in the table unbroken (a layout like tp4·pp4·cp2, a step like 17.568 s)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from autopar.cli import app
from autopar.report.tables import fits_width, print_table, split_columns

runner = CliRunner()
PLAN = ["llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192", "--global-batch", "128"]
WIDTHS = (80, 200)


def _run(args: list[str], width: int) -> str:
    r = runner.invoke(app, args, env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.output
    return r.stdout


def _assert_whole(text: str, width: int) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert "…" not in text


def _json(args: list[str]) -> dict:
    r = runner.invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _step(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("narrow") / "plan.json"
    r = runner.invoke(app, ["plan", *PLAN, "--top", "3", "--quiet", "--out", str(path)])
    assert r.exit_code == 0, r.output
    return str(path)


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_table_is_whole(width):
    text = _run(["plan", *PLAN, "--top", "3", "--quiet"], width)
    _assert_whole(text, width)
    data = _json(["plan", *PLAN, "--top", "3"])
    for alt in data["alternatives"]:
        p = alt["parallel"]
        layout = f"tp{p['tp']}·pp{p['pp']}" + (f"·v{p['vpp']}" if p["vpp"] > 1 else "") + \
            (f"·cp{p['cp']}" if p["cp"] > 1 else "")
        assert layout in text
        assert _step(alt["estimate"]["step_time_s"]) in text
    if width == 80:  # the narrow layout: settings stacked under the layout, memory over what is free
        assert "GiB free" in text and "exposed comm" not in text.split("fastest found")[0]
    else:
        assert "exposed comm" in text and "free" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_table_is_whole(plan_file, width):
    args = ["compare", plan_file, "--plan", "tp=8,pp=4,vpp=5", "--plan", "tp=8,pp=8,recompute=full"]
    text = _run(args, width)
    _assert_whole(text, width)
    for entry in _json(args)["plans"]:
        assert _step(entry["estimate"]["step_time_s"]) in text
    assert "tp=8,pp=8,recompute=full" in text and "plan.json" in text  # every plan's column


@pytest.mark.parametrize("width", WIDTHS)
def test_explain_tables_are_whole(plan_file, width):
    text = _run(["explain", plan_file], width)
    _assert_whole(text, width)
    data = _json(["explain", plan_file])
    for alt in data["alternatives"]:
        if alt["step_time_s"] is not None:
            assert _step(alt["step_time_s"]) in text
    assert "cp 2→1" in text  # the OOM neighbour a user would otherwise never see


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep_table_is_whole(width):
    """A sequence-length sweep: the cp degree of every point's plan is in the table (at 80 columns
    the issue saw "tp1·pp1·c…")."""
    args = ["sweep", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192,32768",
            "--global-batch", "128"]
    text = _run(args, width)
    _assert_whole(text, width)
    for point in _json(args)["points"]:
        p = point["plan"]
        assert (f"cp{p['cp']}" in text or p["cp"] == 1) and _step(point["estimate"]["step_time_s"]) in text


@pytest.mark.parametrize("width", WIDTHS)
def test_estimate_tables_are_whole(width):
    args = ["estimate", *PLAN, "--tp", "4", "--pp", "4", "--cp", "2"]
    text = _run(args, width)
    _assert_whole(text, width)
    est = _json(args)
    assert _step(est["step_time_s"]) in text
    for stage in est["stages"]:
        assert f"{stage['memory_bytes'] / 1024**3:.1f} GiB" in text  # every rank's memory, whole


@pytest.mark.parametrize("width", WIDTHS)
def test_validate_tables_are_whole(width):
    text = _run(["validate", "--source", "narayanan21", "--source", "torchtitan-2412"], width)
    _assert_whole(text, width)
    data = _json(["validate", "--source", "narayanan21", "--source", "torchtitan-2412"])
    for row in data["rows"]:
        assert row["run_id"] in text and f"{row['predicted_tokens_per_s_per_gpu']:,.1f}" in text
        assert f"{row['error']:+.1%}" in text


def test_split_columns_repeats_the_key_and_keeps_every_cell():
    """Hand-worked: six 10-character columns, each 13 wide with its padding and border (a table of
    k is 13k + 1), cannot fit 40 columns; a part holds 3 (40), so the key column and two others:
    the five others in parts of 2, 2 and 1, each fitting, every cell there once, the key in each."""
    t = Table(title="wide")
    for i in range(6):
        t.add_column(f"col{i}".ljust(10), justify="right")
    t.add_row(*(f"{i:010d}" for i in range(6)))
    console = Console(width=40, record=True)
    assert not fits_width(console, t)
    parts = split_columns(console, t, keys=1)
    assert [len(p.columns) for p in parts] == [3, 3, 2] and all(fits_width(console, p) for p in parts)
    print_table(console, t)
    text = console.export_text()
    assert text.count("0000000000") == 3 and all(f"{i:010d}" in text for i in range(1, 6))
    assert max(len(line) for line in text.splitlines()) <= 40 and "…" not in text


def test_columns_is_honoured_when_piped():
    """COLUMNS sets the width of piped output (the console is made again for each command)."""
    wide = _run(["plan", *PLAN, "--top", "2", "--quiet"], 200)
    narrow = _run(["plan", *PLAN, "--top", "2", "--quiet"], 80)
    assert max(map(len, wide.splitlines())) > 120 >= 80 >= max(map(len, narrow.splitlines()))


@pytest.mark.parametrize("width", WIDTHS)
def test_listings_and_inspect_are_whole(width):
    """models, clusters and inspect: every name whole on one line (Rich alone cut a wrapping column
    below its longest word: "dgx-a100…", "gpus/n" over "ode")."""
    clusters = _run(["clusters"], width)
    models = _run(["models"], width)
    for text in (clusters, models, _run(["inspect", "llama3-70b"], width)):
        _assert_whole(text, width)
    for row in _json(["clusters"])["clusters"]:
        assert row["name"] in clusters and f"{row['hbm_gib']:g} GiB" in clusters
    for row in _json(["models"])["models"]:
        assert row["name"] in models
    assert "gpus/node" in clusters
