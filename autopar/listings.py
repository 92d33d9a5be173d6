"""The listings of the library surface, models() and clusters(), in a module of their own: `autopar
models` and `autopar clusters` answer from the preset catalogue and the cluster profiles without
importing the cost model (issue 15: start-up). autopar.api re-exports them."""

from __future__ import annotations

from typing import Any


def models() -> list[dict[str, Any]]:
    """Every preset with its size (from the preset catalogue, autopar.catalog)."""
    from autopar.catalog import model_rows

    return model_rows()


def clusters() -> list[dict[str, Any]]:
    """Every shipped cluster profile with its headline numbers (autopar.hardware.cluster_rows)."""
    from autopar.hardware import cluster_rows

    return cluster_rows()
