"""Reading user files with one-line errors (missing, unreadable, malformed, not an object)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autopar.errors import InputFileError


def read_json_object(path: Path, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in `path`. `what` names the file in messages ("plan file"), `fix` says how
    to get a good one when it is missing."""
    if not path.is_file():
        raise InputFileError(f"{what} {path} does not exist; {fix}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read {what} {path} ({exc.__class__.__name__}); check its permissions")
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{what} {path} is malformed JSON near line {exc.lineno}; fix its syntax")
    if not isinstance(raw, dict):
        raise InputFileError(f"{what} {path} must hold a JSON object, not {type(raw).__name__}")
    return raw
