"""The `autopar` process builds only the command it runs (autopar.cli.lazy_command; issue 15:
start-up), and answers exactly as the group Typer builds with every command."""

import json
import subprocess
import sys

import pytest
import typer.main
import typer.testing
from typer.testing import CliRunner

from autopar import cli

ARGVS = [
    [], ["--help"], ["plan", "--help"], ["estimate", "--help"], ["models"], ["models", "--json"],
    ["clusters", "--json"], ["plann", "llama3-8b"], ["nope"], ["plan", "llama3-8b"],
    ["plan", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--tp", "2"],
    ["plan", "llama3-8b", "-c", "dgx-h100", "-n", "0", "-b", "8"],
    ["plan", "llama3-8b", "-c", "dgx-h999", "-n", "8", "-b", "8"],
    ["estimate", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--tp", "2", "--json"],
    ["inspect", "mixtral-8x7b", "--json"],
]


@pytest.fixture
def answer(monkeypatch):
    """Output, error and exit code of one run of a Click command (Typer's runner, told not to make
    the command from a typer.Typer itself)."""
    monkeypatch.setattr(typer.testing, "_get_command", lambda command: command)

    def run(command, argv):
        result = CliRunner().invoke(command, argv, prog_name="autopar")
        return result.stdout, result.stderr, result.exit_code

    return run


@pytest.mark.parametrize("argv", ARGVS, ids=" ".join)
def test_lazy_group_answers_as_typers_group(argv, answer):
    assert answer(cli.lazy_command(), argv) == answer(typer.main.get_command(cli.app), argv)


def test_lazy_group_lists_the_commands_in_order_and_builds_only_what_is_run(answer):
    eager, lazy = typer.main.get_command(cli.app), cli.lazy_command()
    assert list(lazy.commands) == list(eager.commands)
    assert not any(isinstance(c, typer.core.TyperCommand) for c in lazy.commands._entries.values())
    assert answer(lazy, ["models", "--json"])[2] == 0
    built = [n for n, c in lazy.commands._entries.items() if isinstance(c, typer.core.TyperCommand)]
    assert built == ["models"]


def test_plan_process_builds_one_command():
    """In a real `autopar plan` process, Typer builds the plan command's parameters and no other's."""
    argv = ["plan", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "--fix", "tp=2,pp=1,mbs=1", "--json",
            "--quiet"]
    probe = (f"import sys, json\nsys.argv = ['autopar', *{argv!r}]\nimport typer.main\n"
             "built = []\nmake = typer.main.get_command_from_info\n"
             "typer.main.get_command_from_info = lambda info, **kw: built.append(info.callback.__name__) or make(info, **kw)\n"
             "import autopar.cli\ntry:\n    autopar.cli.main()\nexcept SystemExit:\n    pass\n"
             "print(json.dumps(built))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    *plan_json, last = out.splitlines()
    assert json.loads("\n".join(plan_json))["plans"]
    assert json.loads(last) == ["plan"]
