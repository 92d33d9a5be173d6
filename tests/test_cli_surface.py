"""The CLI surface is frozen in tests/cli_surface.json: every command, its arguments and options,
and the keys of its --json output at the listed paths. A rename, a removal or an addition fails
here until the data file says so: extend cli_surface.json in the same change that adds an option or
a key (`python tests/test_cli_surface.py` prints the current surface in the file's format).

Paths: "" is the top-level object, "a.b" a nested object, "a[]" the first element of a list."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from autopar.cli import app

SURFACE_FILE = Path(__file__).with_name("cli_surface.json")
SMALL = ["llama3-8b", "-c", "dgx-h100", "-n", "8"]
PLAN = ["--global-batch", "16", "--seq-len", "2048"]


def _invocations(tmp: Path) -> dict[str, list[str]]:
    """One cheap --json run of every command whose output is frozen (profile takes a minute: options only)."""
    plan_file = tmp / "plan.json"
    return {
        "models": ["models"],
        "clusters": ["clusters"],
        "inspect": ["inspect", "llama3-8b"],
        "estimate": ["estimate", *SMALL, *PLAN, "--tp", "2", "--pp", "2", "--train-tokens", "1T"],
        "plan": ["plan", *SMALL, *PLAN, "--top", "2", "--out", str(plan_file), "-q", "--train-tokens", "1T"],
        "compare": ["compare", str(plan_file), "--plan", "tp=2,pp=2"],
        "explain": ["explain", str(plan_file)],
        "sweep": ["sweep", "llama3-8b", "-c", "dgx-h100", "-n", "8,16", "-b", "16,32", "-s", "2048", "-q",
                  "--train-tokens", "1T"],
        "export": ["export", str(plan_file)],
        "validate": ["validate", "--source", "narayanan21"],
        "calibrate": ["calibrate", "--derive-as", "surface-test", "--derive-gpus", "H200", "--base", "h100",
                      "--reason", "test", "--out", str(tmp / "cost.json")],
    }


def command_surface() -> dict[str, dict[str, list[str]]]:
    """{command: {"arguments": [...], "options": [...]}} from the Typer app itself."""
    group = typer.main.get_command(app)
    out = {}
    for name, cmd in sorted(group.commands.items()):
        # typer 0.29 vendors click: tell parameters apart by their kind, not by click's classes.
        args = [p.name for p in cmd.params if p.param_type_name == "argument"]
        opts = sorted(o for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts))
        out[name] = {"arguments": args, "options": opts}
    return out


def keys_at(data: Any, path: str) -> list[str]:
    """Sorted keys of the object at `path` in `data` (see the module docstring)."""
    node = data
    for part in filter(None, path.split(".")):
        if part.endswith("[]"):
            node = node[part[:-2]][0]
        else:
            node = node[part]
    return sorted(node)


def json_outputs(tmp: Path) -> dict[str, Any]:
    runner = CliRunner()
    out = {}
    for name, argv in _invocations(tmp).items():
        result = runner.invoke(app, [*argv, "--json"])
        assert result.exit_code == 0, (name, result.output[-2000:])
        out[name] = json.loads(result.stdout)
    return out


@pytest.fixture(scope="module")
def frozen() -> dict[str, Any]:
    return json.loads(SURFACE_FILE.read_text(encoding="utf-8"))


def test_commands_and_options_are_the_frozen_ones(frozen):
    assert command_surface() == frozen["commands"]


def test_json_keys_are_the_frozen_ones(frozen, tmp_path):
    outputs = json_outputs(tmp_path)
    assert set(outputs) == set(frozen["json_keys"])
    for name, paths in frozen["json_keys"].items():
        for path, keys in paths.items():
            assert keys_at(outputs[name], path) == keys, f"{name} --json at {path!r}"


def test_a_renamed_option_would_fail(frozen):
    # The check is not vacuous: the frozen file names real options of real commands.
    surface = command_surface()
    assert "--memory-margin" in surface["compare"]["options"] and "--framework" in surface["plan"]["options"]
    assert frozen["commands"]["estimate"]["options"] == surface["estimate"]["options"]
    assert "usable_memory_bytes" in frozen["json_keys"]["estimate"][""]


def _current(tmp: Path, frozen_paths: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    outputs = json_outputs(tmp)
    return {"commands": command_surface(),
            "json_keys": {name: {path: keys_at(outputs[name], path) for path in paths}
                          for name, paths in frozen_paths.items()}}


def dump(surface: dict[str, Any]) -> str:
    """The file's layout: one line per command and per (command, path)."""
    j = lambda x: json.dumps(x, ensure_ascii=False)  # noqa: E731
    lines = ["{", f' "_about": {j(surface["_about"])},', ' "commands": {']
    cmds = surface["commands"]
    lines += [f"  {j(k)}: {j(v)}" + ("," if i < len(cmds) - 1 else "") for i, (k, v) in enumerate(cmds.items())]
    lines += [" },", ' "json_keys": {']
    keys = surface["json_keys"]
    for i, (name, paths) in enumerate(keys.items()):
        lines.append(f"  {j(name)}: {{")
        lines += [f"   {j(p)}: {j(v)}" + ("," if k < len(paths) - 1 else "") for k, (p, v) in enumerate(paths.items())]
        lines.append("  }" + ("," if i < len(keys) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # print the current surface for the paths the file lists
    import tempfile

    saved = json.loads(SURFACE_FILE.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as d:
        sys.stdout.write(dump({"_about": saved["_about"], **_current(Path(d), saved["json_keys"])}))
