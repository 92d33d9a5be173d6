"""Sweeps: one best plan per point, equal to the search's own best; a point with no plan keeps its
reason and the sweep goes on; efficiency is per-GPU throughput against the first point with a plan."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from autopar.api import search_plans
from autopar.errors import SchemaError, UnknownClusterError, UnknownModelError
from autopar.report.sweep import parse_values, render_sweep, scaling_efficiency, sweep, sweep_points, swept_axis


@pytest.fixture(scope="module")
def llama8b():
    return sweep("llama3-8b", "dgx-h100", [8, 16, 32], global_batch=128, seq_len=4096)


def test_gpu_sweep_scales_total_throughput(llama8b):
    assert [p.gpus for p in llama8b] == [8, 16, 32]
    assert all(p.fits and p.reason is None for p in llama8b)
    total = [p.tokens_per_s for p in llama8b]
    assert total[0] < total[1] < total[2]
    eff = scaling_efficiency(llama8b)
    assert eff[0] == 1.0
    for p, e in zip(llama8b, eff):
        assert e == pytest.approx(p.tokens_per_s_per_gpu / llama8b[0].tokens_per_s_per_gpu)


def test_each_point_is_the_searchs_best(llama8b):
    for p in llama8b:
        plan, est = search_plans("llama3-8b", "dgx-h100", p.gpus, 4096, 128, top=1).plans[0]
        assert p.plan == plan and p.estimate.step_time_s == est.step_time_s
        assert p.plan.tp * p.plan.pp * p.plan.cp * p.estimate.dp == p.gpus


def test_a_point_without_a_plan_keeps_its_reason_and_the_sweep_goes_on():
    calls = []
    pts = sweep("llama3-70b", "dgx-h100", [8, 12, 64], global_batch=64, seq_len=4096,
                progress=lambda phase, done, total: calls.append((phase, done, total)))
    assert [p.fits for p in pts] == [False, False, True]
    assert "no plan fits" in pts[0].reason and "GiB" in pts[0].reason
    assert "whole nodes" in pts[1].reason
    assert scaling_efficiency(pts) == [None, None, 1.0]  # relative to the first point with a plan
    assert calls == [("sweep", 0, 3), ("sweep", 1, 3), ("sweep", 2, 3), ("sweep", 3, 3)]
    console = Console(record=True, width=200)
    render_sweep(console, pts)
    text = console.export_text()
    assert "no plan fits" in text and "100.0%" in text and "tp" in text


def test_fix_is_applied_at_every_point():
    pts = sweep("llama3-8b", "dgx-h100", global_batch_list=[32, 64], gpus=8, seq_len=4096, fix="tp=2,pp=2")
    assert swept_axis(pts) == "global_batch"
    assert all((p.plan.tp, p.plan.pp) == (2, 2) for p in pts)


def test_lists_are_zipped_and_checked():
    assert sweep_points([8, 16], [32, 64], None, None, None, 4096) == [(8, 32, 4096), (16, 64, 4096)]
    assert sweep_points(None, None, [2048, 4096], 8, 16, 8192) == [(8, 16, 2048), (8, 16, 4096)]
    with pytest.raises(SchemaError, match="one length"):
        sweep_points([8, 16], [32], None, None, None, 4096)
    with pytest.raises(SchemaError, match="nothing to sweep"):
        sweep_points(None, None, None, 8, 16, 4096)
    with pytest.raises(SchemaError, match="global-batch"):
        sweep_points([8, 16], None, None, None, None, 4096)


def test_parse_values():
    assert parse_values("8, 16,32", "--gpus") == [8, 16, 32]
    for bad in ("", "8,x", "0,8", "-8"):
        with pytest.raises(SchemaError, match="--gpus"):
            parse_values(bad, "--gpus")


def test_unknown_names_raise_at_once():
    with pytest.raises(UnknownModelError):
        sweep("no-such-model", "dgx-h100", [8], global_batch=32)
    with pytest.raises(UnknownClusterError):
        sweep("llama3-8b", "no-such-cluster", [8], global_batch=32)


def test_to_dict_is_json(llama8b):
    d = json.loads(json.dumps([p.to_dict() for p in llama8b]))
    assert set(d[0]) == {"model", "cluster", "gpus", "global_batch", "seq_len", "fits", "reason", "plan", "estimate",
                         "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "candidates", "feasible", "search_s"}
    assert d[2]["tokens_per_s"] == llama8b[2].tokens_per_s
