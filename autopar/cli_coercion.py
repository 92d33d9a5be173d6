"""Option values converted without Pydantic: the start-up half of `autopar models` (issue 15).

Typer >= 0.2x converts every command-line value through a Pydantic TypeAdapter built on first use
(`typer._adapters`), and importing Pydantic plus building one adapter costs about 0.2 s: more than
the rest of `autopar models`. autopar's options are all of five kinds: str, int and float (with
min/max), bool, and list[str]. For those, `FastCoercion` converts the values Pydantic's lax mode
accepts in the obvious way (a Python int or an ASCII digit string for int; a number or a plain
decimal string for float; a str; a bool; a tuple of str) to the same value and type, and hands
everything else, including every value out of range, to Typer's own Pydantic adapter. So a value
is either converted exactly as Pydantic would convert it, or by Pydantic itself: every error
message stays Typer's (tests/test_cli_coercion.py checks both halves against the adapter).

`FastParams` (mixed into autopar's Typer group and command classes) installs the converter on the
parameters Click processes. A parameter of any other kind keeps Typer's conversion; a Typer without `get_runtime_param`
(older than 0.2x, which converts through Click types and never imports Pydantic) is left alone.
"""

from __future__ import annotations

import math
from typing import Any

# Longest digit string taken on the fast path: far above every option's max, far below
# int()'s 4300-digit limit; a longer one goes to Pydantic (which rejects it as out of range).
MAX_FAST_DIGITS = 18
_MISS = object()  # sentinel: "not on the fast path, ask Typer's Pydantic adapter"


def _fast_int(value: Any) -> Any:
    if type(value) is int:
        return value
    if type(value) is str and 0 < len(value) <= MAX_FAST_DIGITS and value.isascii() and value.isdigit():
        return int(value)
    return _MISS


def _is_plain_decimal(text: str) -> bool:
    """digits, optionally '.', optionally digits, at least one digit: '8', '0.1', '.5', '2.'."""
    whole, _, frac = text.partition(".")
    digits = whole + frac
    return (0 < len(text) <= MAX_FAST_DIGITS and text.isascii() and digits.isdigit()
            and (frac == "" or frac.isdigit()) and (whole == "" or whole.isdigit()))


def _fast_float(value: Any) -> Any:
    if type(value) in (int, float):
        out = float(value)
    elif type(value) is str and _is_plain_decimal(value):
        out = float(value)
    else:
        return _MISS
    return out if math.isfinite(out) else _MISS


def _fast_str(value: Any) -> Any:
    return value if type(value) is str else _MISS


def _fast_bool(value: Any) -> Any:
    return value if type(value) is bool else _MISS


def _fast_str_list(value: Any) -> Any:
    if type(value) in (tuple, list) and all(type(v) is str for v in value):
        return list(value)
    return _MISS


_SCALAR = {int: _fast_int, float: _fast_float, str: _fast_str, bool: _fast_bool}


def fast_converter(descriptor: Any, multiple: bool) -> Any:
    """The fast converter of a Typer parameter's type descriptor, or None when it is not one of
    the five kinds (then Typer converts it)."""
    info = descriptor.parameter_info
    if (descriptor.file_annotation is not None or getattr(info, "parser", None) is not None
            or getattr(info, "clamp", False) or getattr(info, "click_type", None) is not None
            or descriptor.is_path or descriptor.is_choice):
        return None
    annotation = descriptor.annotation
    if multiple:
        return _fast_str_list if annotation == list[str] else None
    convert = _SCALAR.get(annotation) if isinstance(annotation, type) else None
    if convert is None:
        return None
    lo, hi = info.min, info.max
    if annotation in (str, bool):
        return convert if lo is None and hi is None else None
    if lo is None and hi is None:
        return convert

    def ranged(value: Any) -> Any:
        out = convert(value)
        if out is _MISS or (lo is not None and out < lo) or (hi is not None and out > hi):
            return _MISS  # Pydantic words the error
        return out

    return ranged


class FastCoercion:
    """A Typer runtime parameter (the object `get_runtime_param` returns): the fast converter,
    else Typer's own Pydantic-backed one, built on first need."""

    def __init__(self, descriptor: Any, convert: Any) -> None:
        self._descriptor, self._convert, self._slow = descriptor, convert, None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:  # as Typer's RuntimeParam.coerce
            return () if multi else None
        out = self._convert(value)
        if out is not _MISS:
            return out
        return self.slow().coerce(value, param=param, ctx=ctx)

    def slow(self) -> Any:
        if self._slow is None:
            from typer._coercion import build_runtime_param

            self._slow = build_runtime_param(self._descriptor)
        return self._slow


def install(params: list[Any]) -> list[Any]:
    """Give each Typer parameter in `params` the fast converter where one applies; `params` back.
    Leaves alone a parameter whose converter is built, or one of a Typer that does not convert
    through Pydantic."""
    for param in params:
        if not hasattr(param, "get_runtime_param") or getattr(param, "_runtime_param", _MISS) is not None:
            continue
        convert = fast_converter(param.type_descriptor, param.multiple or param.nargs == -1)
        if convert is not None:
            param._runtime_param = FastCoercion(param.type_descriptor, convert)
    return params


class FastParams:
    """Mixin for a Click command or group: the parameters Click processes (the help option, made
    per context, included) get the fast converter. Changes no option, help text or message."""

    def get_params(self, ctx: Any) -> list[Any]:
        return install(super().get_params(ctx))  # type: ignore[misc]
