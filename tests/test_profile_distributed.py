"""`autopar profile --distributed`: two "nodes" of two gloo processes each on 127.0.0.1, started by
two torchrun invocations (--nnodes 2 --node-rank 0/1), and the figures of the file they write;
the failure paths (one rank, unequal launches, a hung rank, no launcher) end in one line naming
the rank; the bus-bandwidth formulas, groups and fit by hand."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autopar import distributed_profile as dp
from autopar.cli import app

runner = CliRunner()


# ---- formulas and layout, by hand ------------------------------------------------------------------

def test_bus_factors_are_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather/reduce-scatter/all-to-all (n-1)/n
    assert dp.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert dp.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert dp.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert dp.bus_factor("all_to_all", 2) == pytest.approx(0.5)
    assert dp.bus_factor("send_recv", 2) == 1.0
    # 1 GiB all-reduced on 8 ranks in 10 ms: algbw 107.4 GB/s, busbw 187.9 GB/s
    assert dp.bus_bandwidth_bytes_per_s("all_reduce", 2 ** 30, 0.01, 8) == pytest.approx(2 ** 30 / 0.01 * 1.75)


def test_groups_are_node_by_node():
    assert dp.intra_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dp.inter_groups(8, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dp.send_recv_pairs(8, 4, "intra") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert dp.send_recv_pairs(12, 4, "inter") == [(0, 4), (1, 5), (2, 6), (3, 7)]  # node 2 has no partner


def test_combine_keeps_the_slowest_rank():
    a = [{"kind": "inter", "op": "all_reduce", "group_size": 2, "bytes": 1000, "time_s": 1e-3}]
    b = [{"kind": "inter", "op": "all_reduce", "group_size": 2, "bytes": 1000, "time_s": 4e-3}]
    (row,) = dp.combine([a, b])
    assert row["slowest_rank"] == 1 and row["time_s"] == 4e-3
    assert row["algbw_bytes_per_s"] == pytest.approx(250_000.0)
    assert row["busbw_bytes_per_s"] == pytest.approx(250_000.0)  # 2(n-1)/n = 1 at n = 2


def test_fit_saturation_recovers_a_curve_and_caps_at_one():
    pts = [(x, 0.8 * x / (x + 2 ** 20)) for x in (2 ** 12, 2 ** 16, 2 ** 20, 2 ** 24, 2 ** 28)]
    top, half = dp.fit_saturation(pts)
    assert top == pytest.approx(0.8) and half == 2 ** 20
    top, _ = dp.fit_saturation([(2 ** 20, 1.3), (2 ** 22, 1.4)])
    assert top == 1.0


def test_agreement_names_the_rank():
    row = {"rank": 0, "world": 3, "local_world": 2, "node_rank": 0, "args": {}, "torch": "2"}
    rows = [row, {**row, "rank": 1}, {**row, "rank": 2, "local_world": 1, "node_rank": 1}]
    with pytest.raises(dp.DistributedProfileError, match="rank 2 .node 1. runs 1 ranks per node where rank 0's node runs 2"):
        dp.check_agreement(rows)
    rows = [row | {"world": 2}, {**row, "rank": 1, "world": 2, "args": {"quick": True}}]
    with pytest.raises(dp.DistributedProfileError, match="rank 1 has other profile arguments"):
        dp.check_agreement(rows)


def test_launch_from_torchrun_and_slurm_env():
    t = dp.launch_from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                            "GROUP_RANK": "1"})
    assert (t.rank, t.world, t.local_rank, t.local_world, t.node_rank, t.nodes, t.launcher) == (5, 8, 1, 4, 1, 2, "torchrun")
    s = dp.launch_from_env({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                            "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NODEID": "1"})
    assert (s.rank, s.world, s.local_world, s.node_rank, s.nodes, s.launcher) == (9, 16, 8, 1, 2, "srun")


def test_print_launch_commands():
    r = runner.invoke(app, ["profile", "--print-launch", "torchrun", "--nodes", "4", "--gpus-per-node", "8",
                            "--out", "c.yaml"])
    assert r.exit_code == 0, r.output
    assert "torchrun --nnodes 4 --nproc-per-node 8" in r.output
    assert "-m autopar profile --distributed --out c.yaml" in r.output
    r = runner.invoke(app, ["profile", "--print-launch", "slurm", "--nodes", "2"])
    assert r.exit_code == 0, r.output
    assert "#SBATCH --nodes=2" in r.output and "#SBATCH --ntasks-per-node=8" in r.output
    assert "srun --distribution=block python -m autopar profile --distributed --out cluster.yaml" in r.output


@pytest.mark.parametrize("args, message", [
    (["--print-launch", "mpirun"], "--print-launch 'mpirun' is not one of slurm, torchrun"),
    (["--print-launch", "slurm", "--distributed"], "--distributed prints a command and runs nothing"),
    (["--nodes", "2", "--out", "x.json"], "--nodes applies only with --print-launch"),
    (["--distributed", "--out", "x.yaml", "--device", "cpu"], "--device sets the single-host benchmark"),
    (["--out", "x.json", "--timeout", "5"], "--timeout applies only with --distributed"),
])
def test_profile_option_refusals(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["profile", *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_distributed_without_a_launcher_or_with_one_rank(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "c.yaml"
    r = runner.invoke(app, ["profile", "--distributed", "--out", str(out)])
    assert r.exit_code == 2 and "no RANK/WORLD_SIZE (torchrun)" in r.output and not out.exists()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    r = runner.invoke(app, ["profile", "--distributed", "--out", str(out)])
    assert r.exit_code == 2 and "needs at least 2 ranks and this launch has 1" in r.output and not out.exists()
    assert len(r.output.strip().splitlines()) == 1


# ---- two torchrun "nodes" on 127.0.0.1 ------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(tmp_path: Path, nprocs=(2, 2), extra=(), env_extra=None, timeout_s=150):
    """Two torchrun launches (node ranks 0 and 1) of the distributed profile; their outputs."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    procs = []
    for node, n in enumerate(nprocs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "autopar", "profile", "--distributed", "--quick", "--out", str(tmp_path / "c.yaml"), *extra]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(timeout=timeout_s), p.stdout.read()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return outs


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


def test_two_nodes_write_a_consistent_cluster_profile(tmp_path):
    pytest.importorskip("torch")
    from autopar.cost.params import load_cost_model
    from autopar.hardware import load_cluster, load_profile
    from autopar.inputs import resolve_cost_model

    (rc0, out0), (rc1, out1) = _two_nodes(tmp_path)
    assert rc0 == 0 and rc1 == 0, out0 + out1
    assert "wrote" in out0 and "wrote" not in out1  # rank 0 alone writes
    prof = load_profile(str(tmp_path / "c.yaml"))  # through the schema
    assert prof.node.gpus_per_node == 2 and prof.cost_model == "c.cost.json"
    f, p = load_cost_model(str(tmp_path / "c.cost.json"))
    m = f.measurements["distributed"]
    assert (m["nodes"], m["ranks_per_node"], m["world"], m["library"]) == (2, 2, 4, "gloo")
    assert m["groups"]["intra"] == [[0, 1], [2, 3]] and m["groups"]["inter"] == [[0, 2], [1, 3]]
    rows = m["collectives"]
    ops = {(r["kind"], r["op"]) for r in rows}
    assert ops == {(k, o) for k in ("intra", "inter") for o in ("all_reduce", "all_gather", "all_to_all", "send_recv")}
    assert len(rows) == 8 * len(dp.message_sizes(True, True))
    for r in rows:  # every bus bandwidth is nccl-tests' formula over the recorded size, time and group
        assert r["group_size"] == 2
        assert r["algbw_bytes_per_s"] == pytest.approx(r["bytes"] / r["time_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * dp.bus_factor(r["op"], 2))
        assert r["slowest_rank"] in range(4)
    best = {k: max(r["busbw_bytes_per_s"] for r in rows if r["kind"] == k and r["op"] == "all_reduce")
            for k in ("intra", "inter")}
    assert m["summary"]["intra_busbw_bytes_per_s"] == best["intra"]
    assert m["summary"]["inter_busbw_bytes_per_s"] == best["inter"]
    # a CPU run: the link rates are the best bus bandwidths measured (the file says so)
    assert prof.node.intra_node_gb_per_s == pytest.approx(best["intra"] / 1e9, rel=1e-5)
    cluster = load_cluster(str(tmp_path / "c.yaml"), 4)
    assert cluster.inter_node_bytes_per_s_per_gpu == pytest.approx(best["inter"], rel=1e-4)
    assert prof.node.intra_node_latency_us == pytest.approx(
        min((r for r in rows if r["kind"] == "intra" and r["op"] == "send_recv"), key=lambda r: r["bytes"])["time_s"]
        * 1e6, rel=1e-3)
    assert 0 < p.intra_node_efficiency <= 1 and p.inter_node_efficiency == pytest.approx(1.0, rel=1e-4)
    assert f.provenance.method == "profiled" and "torch" in " ".join(f.provenance.sources)
    # plan --cluster c.yaml uses the measured cost model as it is
    assert cluster.cost_model == str(tmp_path / "c.cost.json")
    assert resolve_cost_model(cluster, None).intra_node_efficiency == p.intra_node_efficiency


def test_unequal_launches_name_the_rank(tmp_path):
    pytest.importorskip("torch")
    (rc0, out0), (rc1, out1) = _two_nodes(tmp_path, nprocs=(2, 1), extra=("--timeout", "30"))
    text = out0 + out1
    assert rc0 != 0 and rc1 != 0
    lines = _error_lines(out0)
    assert lines and "runs 1 ranks per node where rank 0's node runs 2" in lines[0], text
    assert not (tmp_path / "c.yaml").exists() and not (tmp_path / "c.cost.json").exists()


def test_a_hung_rank_is_named_within_the_timeout(tmp_path):
    pytest.importorskip("torch")
    (rc0, out0), (rc1, out1) = _two_nodes(tmp_path, extra=("--timeout", "6"), env_extra={dp.HANG_RANK_ENV: "1"})
    assert rc0 != 0, out0
    lines = [line for line in _error_lines(out0) if line.startswith("error: rank 0:")]
    assert lines and "rank 1 did not reach" in lines[0] and "within 6 s" in lines[0], out0 + out1
    assert not (tmp_path / "c.yaml").exists() and not (tmp_path / "c.cost.json").exists()


def test_a_dead_rank_is_named_within_the_timeout(tmp_path):
    """Rank 3 (node 1) exits before the first benchmark; rank 0 names it. The exit is injected by a
    wrapper that replaces the hang hook, so the product has no dying knob."""
    pytest.importorskip("torch")
    wrapper = tmp_path / "die.py"
    wrapper.write_text("import os, sys\nimport autopar.distributed_profile as dp\n"
                       "dp._hang_here = lambda launch: os._exit(1) if launch.rank == 3 else None\n"
                       "from autopar.cli import entry\n"
                       "sys.argv = ['autopar', *sys.argv[1:]]\nentry()\n")
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                               str(wrapper), "profile", "--distributed", "--quick", "--out", str(tmp_path / "c.yaml"),
                               "--timeout", "6"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outs = [p.communicate(timeout=150)[0] for p in procs]
    lines = [line for line in _error_lines(outs[0]) if line.startswith("error: rank 0:")]
    assert lines and "rank 3 did not reach" in lines[0], outs[0] + outs[1]
    assert not (tmp_path / "c.yaml").exists() and not (tmp_path / "c.cost.json").exists()


def test_a_profile_that_names_its_cost_model_is_planned_with_it(tmp_path):
    """plan/estimate/validate --cluster FILE read the cost model FILE names (relative to it) unless
    --cost-model is given: a network twice as efficient shortens a dp-8 step's gradient all-reduce."""
    from autopar import api
    from autopar.cost.params import load_cost_model
    from autopar.data import data_dir
    from autopar.hardware import load_cluster
    from autopar.inputs import resolve_cost_model

    base, _ = load_cost_model("h100")
    slow = base.model_copy(update={"name": "slow-net", "network": base.network.model_copy(
        update={"intra_node": base.network.intra_node / 4, "inter_node": base.network.inter_node / 4})})
    (tmp_path / "slow.cost.json").write_text(slow.model_dump_json())
    prof = yaml.safe_load((data_dir("hardware_profiles") / "dgx-h100.yaml").read_text())
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**prof, "name": "mine", "cost_model": "slow.cost.json"}))
    cluster = load_cluster(str(tmp_path / "mine.yaml"), 16)
    assert cluster.cost_model == str(tmp_path / "slow.cost.json")
    assert resolve_cost_model(cluster, None).intra_node_efficiency == pytest.approx(base.network.intra_node / 4)
    plan = api.make_plan(tp=1, global_batch=64, seq_len=4096, zero=1)
    own = api.estimate_plan("llama3-8b", str(tmp_path / "mine.yaml"), 16, plan)
    given = api.estimate_plan("llama3-8b", str(tmp_path / "mine.yaml"), 16, plan, cost_model="h100")
    shipped = api.estimate_plan("llama3-8b", "dgx-h100", 16, plan)
    assert given.step_time_s == pytest.approx(shipped.step_time_s)
    assert own.step_time_s > shipped.step_time_s


def test_one_node_measures_inside_it_and_says_the_rest_is_the_base(tmp_path):
    pytest.importorskip("torch")
    from autopar.cost.params import load_cost_model
    from autopar.hardware import load_profile

    port = _free_port()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "autopar", "profile",
                        "--distributed", "--quick", "--out", str(tmp_path / "one.yaml")], cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    prof = load_profile(str(tmp_path / "one.yaml"))
    base = load_profile("dgx-h100")
    assert prof.node.gpus_per_node == 2
    assert (prof.network.nic_gbit_per_s, prof.network.latency_us) == (base.network.nic_gbit_per_s,
                                                                      base.network.latency_us)
    assert any("not measured: one node" in s for s in prof.sources)
    f, _ = load_cost_model(str(tmp_path / "one.cost.json"))
    m = f.measurements["distributed"]
    assert m["nodes"] == 1 and m["groups"]["inter"] == [] and {r["kind"] for r in m["collectives"]} == {"intra"}
    assert f.network.inter_node == load_cost_model("h100")[0].network.inter_node
