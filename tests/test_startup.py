"""Start-up stays light (issue 15): heavy libraries are imported only by the commands that use them."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from autopar import catalog

HEAVY = ("ortools", "matplotlib", "torch", "pandas")


def _imported_after(code: str) -> set[str]:
    """Module names in sys.modules (and their top-level packages) after running `code` in a fresh interpreter."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    names = set(json.loads(out.splitlines()[-1]))
    return names | {m.split(".")[0] for m in names}


def test_importing_the_cli_imports_no_heavy_library():
    loaded = _imported_after("import autopar.cli")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
    assert "numpy" not in loaded and "autopar.api" not in loaded  # the cost model waits for a command


def _imported_by_command(argv: list[str]) -> set[str]:
    return _imported_after(f"import sys\nsys.argv = ['autopar', *{argv!r}]\nimport autopar.cli\n"
                           "try:\n    autopar.cli.main()\nexcept SystemExit:\n    pass")


def test_help_and_models_import_no_heavy_library():
    """Nor Pydantic: Typer's Pydantic converters are replaced where exact (autopar.cli_coercion)."""
    for argv in (["--help"], ["models"], ["models", "--json"], ["plan", "--help"]):
        loaded = _imported_by_command(argv)
        assert not loaded & {*HEAVY, "numpy", "pydantic"}, (argv, loaded & {*HEAVY, "numpy", "pydantic"})


def test_search_does_not_import_or_tools():
    """The plan command's search solves the recompute program stage by stage (exact, see ilp.py);
    OR-Tools is only imported when the CP-SAT cross-check is asked for."""
    loaded = _imported_after("from autopar.search import search\n"
                             "search('llama3-8b', 'dgx-h100', 16, 4096, 32, refine=True)")
    assert "ortools" not in loaded and "matplotlib" not in loaded


def _plan_in_process(argv: list[str]) -> tuple[str, set[str]]:
    """(stdout, module names loaded) of `autopar plan ...` run by autopar.cli.main() in a fresh
    interpreter; fails unless the command exits 0."""
    probe = (f"import sys, json\nsys.argv = ['autopar', 'plan', *{argv!r}]\nimport autopar.cli\n"
             "try:\n    autopar.cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             "print('\\n' + json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    text, _, modules = out.rstrip("\n").rpartition("\n")
    names = set(json.loads(modules))
    return text, names | {m.split(".")[0] for m in names}


def test_plan_imports_no_numpy():
    """A whole `autopar plan` (search, DP partition, stagewise recompute program, report) runs on
    plain Python: importing NumPy alone would cost it ~0.12 s of start-up (issue 15). Dense with
    JSON output; MoE (pp pinned to 2, so the DP partitions and the search stays short) as Rich tables."""
    text, loaded = _plan_in_process(["llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
                                     "--global-batch", "128", "--json", "--quiet"])
    data = json.loads(text)
    assert data["plans"] and data["search"]["refined"] > 0  # the DP / recompute program ran
    assert not loaded & {*HEAVY, "numpy", "scipy"}, loaded & {*HEAVY, "numpy", "scipy"}
    # Nor a Pydantic validator: its plugin discovery imports importlib.metadata and scans every
    # installed distribution (~40 ms); the search builds plans with ParallelPlan.trusted.
    assert not loaded & {"pydantic.plugin._loader", "importlib.metadata"}
    text, loaded = _plan_in_process(["mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "32", "--seq-len", "4096",
                                     "--global-batch", "256", "--fix", "tp=2,pp=2", "--quiet"])
    words = " ".join(text.split())  # the 80-column report wraps lines wherever the timing's digits put them
    assert "Chosen plan" in words and "refined by DP/ILP" in words
    assert not loaded & {*HEAVY, "numpy", "scipy"}, loaded & {*HEAVY, "numpy", "scipy"}


def test_model_catalog_is_current_and_equals_the_graphs():
    """The shipped catalogue (what `autopar models` prints) is fresh and equals the built graphs."""
    data = json.loads(catalog.CATALOG_PATH.read_text())
    assert data["fingerprint"] == catalog.fingerprint(), (
        "the preset catalogue is stale (presets, graph or ModelSpec changed): run `python -m autopar.catalog` "
        "and commit autopar/model_catalog.json")
    assert data["models"] == catalog.computed_rows()


def test_models_command_lists_every_preset_with_its_size():
    from autopar.cli import app
    from autopar.model import PRESET_NAMES, load_model

    result = CliRunner().invoke(app, ["models", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)["models"]
    assert [r["name"] for r in rows] == list(PRESET_NAMES)
    g = load_model("deepseek-v3")
    row = next(r for r in rows if r["name"] == "deepseek-v3")
    assert (row["total_params"], row["active_params"]) == (g.total_params, g.active_params)
    assert 6.7e11 < row["total_params"] < 6.9e11  # DeepSeek-V3: 671B + 14B MTP (arXiv 2412.19437)


def test_cli_process_env_defaults_keep_what_the_user_set(monkeypatch):
    """main() turns off Pydantic's plugin scan and OpenBLAS's spare threads, unless the user chose;
    `profile` hands torch back every BLAS thread."""
    from autopar import cli

    monkeypatch.setattr(cli, "_ENV_SET_HERE", set())
    monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS", raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    cli._set_process_env_defaults()
    import os

    assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == "__all__"
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"  # the user's
    cli._drop_process_env_default("OPENBLAS_NUM_THREADS")
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"  # not ours to drop
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    cli._set_process_env_defaults()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    cli._drop_process_env_default("OPENBLAS_NUM_THREADS")
    assert "OPENBLAS_NUM_THREADS" not in os.environ


def test_cost_model_for_gpu_validates_only_the_file_that_covers_it(monkeypatch):
    """Each shipped cluster's GPU gets the first shipped cost model naming it (brute force: validate
    every file), and only that file is validated."""
    from autopar.cost import params
    from autopar.hardware import list_clusters, load_profile

    validate = params.read_cost_model_file
    files = {n: validate(params.data_dir("cost_models") / f"{n}.json") for n in params.list_cost_models()}
    read: list[str] = []
    monkeypatch.setattr(params, "read_cost_model_file", lambda path: read.append(path.stem) or validate(path))
    try:
        for cluster in list_clusters():
            gpu = load_profile(cluster).gpu.name
            expected = next(n for n, f in files.items() if gpu in f.gpus)
            params.load_cost_model.cache_clear()
            read.clear()
            f, p = params.cost_model_for_gpu(gpu)
            assert (f, read) == (files[expected], [expected]), cluster
            assert p == params.params_from_file(files[expected])
    finally:
        params.load_cost_model.cache_clear()


def test_shipped_profiles_parse_alike_with_libyaml():
    """Shipped cluster profiles are read with libyaml's parser (when PyYAML has it): the same data as
    the pure-Python SafeLoader gives."""
    import yaml

    from autopar import hardware

    names = hardware.list_clusters()
    assert names
    for name in names:
        path = hardware._shipped_path(name)
        text = path.read_text(encoding="utf-8")
        assert hardware._read_yaml(path, fast=True) == yaml.safe_load(text) == hardware._read_yaml(path), name


def test_clusters_imports_neither_the_cost_model_nor_numpy():
    loaded = _imported_by_command(["clusters", "--json"])
    assert not loaded & {*HEAVY, "numpy", "autopar.api", "autopar.cost"}, loaded & {*HEAVY, "numpy", "autopar.api"}


def test_option_values_are_read_without_typers_pydantic_adapters():
    """A command given int, float, str and flag options converts them all on autopar's fast path."""
    loaded = _imported_by_command(["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--tp", "2",
                                   "--memory-margin", "0.2", "--recompute", "full", "--sp", "--json"])
    assert "autopar.api" in loaded and "typer._adapters" not in loaded


def test_program_exits_with_the_commands_status_without_teardown():
    """`autopar` (console script and `python -m autopar`) runs `cli.entry`: the command's output and
    exit status, then os._exit, skipping the interpreter's teardown (~0.1 s after a search): an
    atexit handler does not run, yet everything printed arrives."""
    probe = ("import atexit, sys\natexit.register(lambda: print('TEARDOWN'))\n"
             "sys.argv = ['autopar', 'models', '--json']\nimport autopar.cli\nautopar.cli.entry()")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and "TEARDOWN" not in done.stdout
    assert json.loads(done.stdout)  # flushed whole before the exit
    bad = subprocess.run([sys.executable, "-m", "autopar", "plan", "no-such-model", "--cluster", "dgx-h100", "--gpus",
                          "8", "--global-batch", "8"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown model") and not bad.stdout
    msg = subprocess.run([sys.executable, "-c", "import sys, autopar.cli\n"
                          "autopar.cli.main = lambda: sys.exit('stop here')\nautopar.cli.entry()"],
                         capture_output=True, text=True)
    assert msg.returncode == 1 and msg.stderr == "stop here\n"
