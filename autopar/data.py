"""Locate the data folders that ship with the package (hardware_profiles/, cost_models/).

In a wheel they live inside the package (autopar/hardware_profiles); in a source checkout or an
editable install they sit at the repository root beside autopar/.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the folder holding shipped data `name` (e.g. "hardware_profiles")."""
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"autopar data folder {name!r} is missing; reinstall autopar")
