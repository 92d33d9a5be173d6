"""Pydantic boundary models (files, CLI, plan JSON) and the one-line rendering of their errors."""

from __future__ import annotations

from pydantic import ValidationError

MAX_LISTED_ERRORS = 3


def one_line(err: ValidationError, what: str, limit: int = MAX_LISTED_ERRORS) -> str:
    """Render a pydantic ValidationError as one line naming the first `limit` bad fields and why
    (values echoed at most 80 characters), then how many more there are."""
    from autopar.limits import clip, clip_repr

    errors = err.errors(include_url=False)
    parts = []
    for e in errors[:limit]:
        loc = clip(".".join(str(p) for p in e["loc"]) or "value")
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown key '{loc}' (remove it or check its spelling)")
        elif e["type"] == "missing":
            parts.append(f"missing required key '{loc}'")
        else:
            msg = clip(e["msg"].removeprefix("Value error, "), 400)
            got = e.get("input")
            shown = "" if isinstance(got, (dict, list, tuple)) or not e["loc"] else f" (got {clip_repr(got)})"
            parts.append(f"'{loc}': {msg}{shown}" if e["loc"] else msg)
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{what}: " + "; ".join(parts) + more
