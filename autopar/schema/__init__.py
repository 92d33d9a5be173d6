"""Pydantic boundary models (files, CLI, plan JSON) and the one-line rendering of their errors."""

from __future__ import annotations

from pydantic import ValidationError


def one_line(err: ValidationError, what: str) -> str:
    """Render a pydantic ValidationError as one line naming each bad field and why."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "value"
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown key '{loc}' (remove it or check its spelling)")
        elif e["type"] == "missing":
            parts.append(f"missing required key '{loc}'")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"'{loc}': {msg}" if e["loc"] else msg)
    return f"{what}: " + "; ".join(parts)
