"""The preset catalogue (`autopar models`) without building a graph or a Pydantic schema.

It lives outside autopar.model on purpose: importing that package builds the Pydantic schemas.
`model_catalog.json` beside this file holds each preset's row (name, parameters, layers, hidden size,
MoE, source) together with a fingerprint: the SHA-256 of the source files the rows derive from
(the presets, the graph builder, the layer graph and the ModelSpec schema). When the fingerprint
matches, the rows are read as they are; when any of those files changed, every row is rebuilt
from the graphs, so a stale file costs time, never a wrong number. Regenerate it with
`python -m autopar.catalog` (tests/test_startup.py fails while it is stale).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
CATALOG_PATH = _HERE / "model_catalog.json"
# The files every row is computed from; a change to any of them invalidates catalog.json.
SOURCES = tuple(_HERE / p for p in (
    "model/presets.py", "model/build.py", "model/graph.py", "model/mixers.py", "schema/model.py", "schema/plain.py"))


def fingerprint() -> str:
    """SHA-256 over the bytes of SOURCES, in order."""
    h = hashlib.sha256()
    for path in SOURCES:
        h.update(path.read_bytes())
    return h.hexdigest()


def computed_rows() -> list[dict[str, Any]]:
    """Every preset's row, from its built graph (the slow, authoritative path)."""
    from autopar.model import PRESET_NAMES, load_model

    out = []
    for name in PRESET_NAMES:
        g = load_model(name)
        out.append({"name": name, "total_params": g.total_params, "active_params": g.active_params,
                    "layers": g.spec.num_layers, "hidden_size": g.spec.hidden_size,
                    "moe": g.spec.moe is not None, "source": g.spec.source})
    return out


def model_rows() -> list[dict[str, Any]]:
    """The rows from catalog.json when it is current, else computed."""
    try:
        data = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
        if data.get("fingerprint") == fingerprint():
            return data["models"]
    except (OSError, ValueError, KeyError):
        pass
    return computed_rows()


def write_catalog() -> None:
    CATALOG_PATH.write_text(json.dumps({"fingerprint": fingerprint(), "models": computed_rows()}, indent=1) + "\n",
                            encoding="utf-8")


if __name__ == "__main__":
    write_catalog()
    print(f"wrote {CATALOG_PATH}")
