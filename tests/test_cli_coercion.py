"""autopar.cli_coercion converts every option value exactly as Typer's Pydantic adapter does (issue 15:
start-up): the same value and type, or the same error. Brute-force cross-check over every parameter
of every command."""

import math

import pytest
import typer.core
import typer.main
from hypothesis import given, settings, strategies as st

from autopar import cli_coercion
from autopar.cli import app

pytestmark = pytest.mark.skipif(not hasattr(typer.core, "_TyperParameter"),
                                reason="this Typer converts through Click types, not Pydantic")

CLICK = typer.core._click if hasattr(typer.core, "_click") else typer.core.click


def _params() -> tuple[list, object]:
    group = typer.main.get_command(app)
    ctx = CLICK.Context(group)
    out = list(group.get_params(ctx))
    for cmd in group.commands.values():
        out.extend(cmd.get_params(CLICK.Context(cmd, parent=ctx)))
    return out, ctx


PARAMS, CTX = _params()
# One parameter of each kind (annotation, bounds, arity, option or argument): the conversion depends on nothing else.
KINDS = list({(repr(p.type_descriptor.annotation), p.type_descriptor.parameter_info.min,
               p.type_descriptor.parameter_info.max, p.multiple, p.nargs, type(p).__name__): p for p in PARAMS}.values())
_SLOW: dict = {}
EDGE = ["0", "1", "8", "08", "007", " 8", "8 ", "+8", "-8", "-0", "8.0", "8.5", ".5", "5.", "0.1", "0.9", "0.90",
        "0.91", "1e-1", "1E3", "1_000", "nan", "inf", "-inf", "", " ", "abc", "٣", "８", "9" * 30, "0" * 40 + "1",
        "16777216", "16777217", "1048577", 0, 1, 8, -1, 0.1, 0.95, 2.0, True, False, None, b"8", ("a", "b"), ["a"],
        (), ("a", 1)]


def _outcome(runtime, value, param, ctx):
    try:
        got = runtime.coerce(value, param=param, ctx=ctx)
    except CLICK.exceptions.BadParameter as exc:
        return "error", exc.format_message()
    return "ok", type(got), got if not (isinstance(got, float) and math.isnan(got)) else "nan"


def _check(param, value) -> None:
    from typer._coercion import build_runtime_param

    fast = cli_coercion.FastCoercion(param.type_descriptor, cli_coercion.fast_converter(
        param.type_descriptor, param.multiple or param.nargs == -1))
    if id(param) not in _SLOW:
        _SLOW[id(param)] = build_runtime_param(param.type_descriptor)  # Typer's own, Pydantic-backed
    slow = _SLOW[id(param)]
    assert _outcome(fast, value, param, CTX) == _outcome(slow, value, param, CTX), (param.name, value)


def test_every_autopar_option_has_a_fast_converter():
    """Every option and argument autopar declares is one of the five kinds, so no command imports
    Pydantic to read its options."""
    missing = [p.name for p in PARAMS
               if cli_coercion.fast_converter(p.type_descriptor, p.multiple or p.nargs == -1) is None]
    assert missing == []


def test_installed_on_every_parameter_click_processes():
    assert all(isinstance(p._runtime_param, cli_coercion.FastCoercion) for p in PARAMS)


@pytest.mark.parametrize("value", EDGE, ids=repr)
def test_fast_conversion_equals_pydantic_on_edge_values(value):
    for param in KINDS:
        _check(param, value)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789.+-_ eE", max_size=8), st.integers(-5, 2**25),
                 st.floats(allow_nan=True, allow_infinity=True)))
def test_fast_conversion_equals_pydantic_on_random_values(value):
    for param in KINDS:
        _check(param, value)


def test_fast_path_is_taken_for_ordinary_values():
    """The values a user types take the fast path (no adapter is built)."""
    ordinary = {int: "64", float: "0.1", str: "llama3-70b", bool: True}
    for p in KINDS:
        multi = p.multiple or p.nargs == -1
        conv = cli_coercion.FastCoercion(p.type_descriptor, cli_coercion.fast_converter(p.type_descriptor, multi))
        lo = p.type_descriptor.parameter_info.min
        value = ("a", "b") if multi else ordinary[p.type_descriptor.annotation] if lo is None else str(lo)
        conv.coerce(value, param=p, ctx=CTX)
        assert conv._slow is None, p.name


def test_unknown_kinds_keep_typers_converter():
    from pathlib import Path

    from typer._coercion import resolve_type_descriptor
    from typer.models import OptionInfo

    assert cli_coercion.fast_converter(resolve_type_descriptor(Path, OptionInfo()), False) is None
    assert cli_coercion.fast_converter(resolve_type_descriptor(int, OptionInfo(min=0, clamp=True)), False) is None
    assert cli_coercion.fast_converter(resolve_type_descriptor(list[int], OptionInfo()), True) is None
