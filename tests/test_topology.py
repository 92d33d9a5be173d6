"""Topology as a concept (issue 29): the scale-up domain apart from the host, the job's segment of
it, group placement on it, and the links a group really has (switch vs xGMI mesh)."""

from __future__ import annotations

import pytest

from autopar.api import load_cluster, load_model
from autopar.cost import comm
from autopar.cost.layout import Layout, layout_violations
from autopar.cost.params import load_cost_model
from autopar.errors import SchemaError
from autopar.hardware import Cluster, cluster_rows, load_profile, segment_gpus
from autopar.schema.plan import ParallelPlan


def _segment_brute(host: int, domain: int, gpus: int) -> int:
    """The largest k·host <= domain with gpus % (k·host) == 0, by trying every k from the top."""
    if gpus <= domain:
        return gpus if gpus % host == 0 else host
    for k in range(domain // host, 0, -1):
        if gpus % (k * host) == 0:
            return k * host
    raise AssertionError("a host always divides a job of whole hosts")


def test_segment_equals_brute_force():
    for host, domain in ((4, 72), (4, 36), (2, 16), (8, 8)):
        for gpus in range(host, 6000, host):
            assert segment_gpus(host, domain, gpus) == _segment_brute(host, domain, gpus), (host, domain, gpus)


def test_segments_of_the_done_when_cases():
    assert segment_gpus(4, 72, 512) == 64  # 8 racks of 64 (72 does not divide 512)
    assert segment_gpus(4, 72, 256) == 64
    assert segment_gpus(4, 72, 576) == 72  # 8 full racks
    assert segment_gpus(4, 72, 8) == 8


def test_nvl72_cluster_counts_trays_and_racks():
    c = load_cluster("gb200-nvl72", 512)
    assert (c.gpus_per_node, c.num_nodes, c.scale_up_gpus, c.scale_up_domain_gpus) == (4, 128, 64, 72)
    # one ConnectX-7 400 Gb/s per GPU: 50 GB/s per GPU of scale-out
    assert c.inter_node_bytes_per_s_per_gpu == pytest.approx(50e9)


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100-80gb", "hgx-h800", "dgx-b200", "dgx-h200"])
def test_existing_profiles_keep_one_host_as_the_domain(name):
    """A profile without scale_up: the host is the domain, through a switch (the old model)."""
    c = load_cluster(name, 64)
    assert c.scale_up_gpus == c.scale_up_domain_gpus == c.gpus_per_node == 8
    assert c.scale_up_fabric == "switch" and c.mesh_link_share(8) == 1.0 and c.mesh_link_share(2) == 1.0


def test_a_hand_built_cluster_defaults_to_its_host():
    c = load_cluster("dgx-h100", 16)
    fields = {f: getattr(c, f) for f in Cluster.__slots__ if f not in
              ("scale_up_gpus", "scale_up_domain_gpus", "scale_up_fabric", "scale_up_links", "vendor", "precisions")}
    bare = Cluster(**fields)
    assert bare == c and bare.scale_up_gpus == 8 and bare.precisions == ("fp8",)


@pytest.mark.parametrize("ranks, share", [(1, 1.0), (2, 1 / 7), (4, 3 / 7), (8, 1.0)])
def test_xgmi_mesh_group_uses_its_k_minus_one_links(ranks, share):
    c = load_cluster("mi300x", 8)
    assert c.scale_up_fabric == "mesh" and c.scale_up_links == 7
    assert c.mesh_link_share(ranks) == pytest.approx(share)


def test_mesh_bus_bandwidth_hand_worked():
    """MI300X: 7 xGMI links x 64 GB/s per direction = 448 GB/s; a tp-2 pair has one link."""
    c = load_cluster("mi300x", 8)
    _, p = load_cost_model("mi300x")
    pair = comm.group_span(2, 1, c.scale_up_gpus)
    eight = comm.group_span(8, 1, c.scale_up_gpus)
    assert comm.bus_bandwidth_bytes_per_s(pair, c, p) == pytest.approx(64e9 * p.intra_node_efficiency)
    assert comm.bus_bandwidth_bytes_per_s(eight, c, p) == pytest.approx(448e9 * p.intra_node_efficiency)
    # a ring all-reduce of 1 GB on the pair: 2(n-1)/n = 1 of the buffer over one link, plus the fixed terms
    t = comm.all_reduce_s(1e9, pair, c, p)
    expected = (c.intra_node_latency_s * comm.all_reduce_steps(2) + p.collective_overhead_s
                + 1e9 / (64e9 * p.intra_node_efficiency * 1e9 / (1e9 + p.half_message_bytes)))
    assert t == pytest.approx(expected, rel=1e-12)


def test_a_switch_gives_any_subset_the_full_rate():
    c = load_cluster("gb200-nvl72", 512)
    _, p = load_cost_model("gb200")
    rates = {k: comm.bus_bandwidth_bytes_per_s(comm.group_span(k, 1, c.scale_up_gpus), c, p) for k in (2, 8, 64)}
    assert set(rates.values()) == {900e9 * p.intra_node_efficiency}


def test_groups_stay_inside_the_rack_when_they_fit():
    graph = load_model("deepseek-v3")
    c = load_cluster("gb200-nvl72", 256)
    plan = ParallelPlan(tp=2, pp=2, ep=64, etp=1, global_batch=4096, seq_len=4096)
    layout = Layout.of(plan, c, graph)
    assert layout.ep_span == comm.GroupSpan(64, 64, 1)  # EP inside one rack's NVLink
    assert layout.tp_span == comm.GroupSpan(2, 2, 1)
    # dense dp·cp at stride tp 2: 64 // 2 = 32 ranks per rack, 64 / 32 = 2 racks
    assert layout.dp_span == comm.GroupSpan(64, 32, 2)
    # on an 8-GPU node the same ep 64 spans 8 nodes of 8
    h = Layout.of(plan, load_cluster("dgx-b200", 256), graph)
    assert h.ep_span == comm.GroupSpan(64, 8, 8)


def test_tp_is_bounded_by_the_scale_up_domain_not_the_host():
    graph = load_model("gpt3-175b")  # 96 heads, no GQA: tp 32 divides them
    tp32 = ParallelPlan(tp=32, pp=16, global_batch=512, seq_len=2048)
    assert layout_violations(tp32, load_cluster("gb200-nvl72", 512), graph) == []
    problems = layout_violations(tp32, load_cluster("dgx-b200", 512), graph)
    assert len(problems) == 1 and "tp 32 exceeds the 8 GPUs of the scale-up domain" in problems[0]
    assert "tensor parallelism must stay inside it (tp <= 8)" in problems[0]
    tp96 = ParallelPlan(tp=96, pp=1, global_batch=576, seq_len=2048)
    assert any("tp 96 exceeds the 72 GPUs of the scale-up domain" in m
               for m in layout_violations(tp96, load_cluster("gb200-nvl72", 576), graph))


def test_clusters_rows_state_the_domain():
    rows = {r["name"]: r for r in cluster_rows()}
    assert rows["gb200-nvl72"]["scale_up_domain_gpus"] == 72 and rows["gb200-nvl72"]["gpus_per_node"] == 4
    assert rows["gb200-nvl72"]["scale_up"]["fabric"] == "switch"
    assert rows["mi300x"]["scale_up_domain_gpus"] == 8
    assert rows["mi300x"]["scale_up"] == {"fabric": "mesh", "name": "AMD Infinity Fabric (xGMI), fully connected 8-GPU mesh",
                                          "links_per_gpu": 7}
    assert rows["dgx-h100"]["scale_up_domain_gpus"] == 8 and rows["dgx-h100"]["scale_up"]["fabric"] == "switch"
    assert rows["mi300x"]["vendor"] == "amd" and rows["dgx-h100"]["precisions"] == ["bf16", "fp8"]


def _profile_text(**changes) -> str:
    import yaml

    raw = yaml.safe_load(open(load_profile_path("gb200-nvl72")).read())
    for key, value in changes.items():
        section, field = key.split("__")
        raw[section][field] = value
    return yaml.safe_dump(raw)


def load_profile_path(name: str) -> str:
    from autopar.hardware import _shipped_path

    return str(_shipped_path(name))


def test_a_domain_must_be_whole_hosts(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(_profile_text(scale_up__domain_gpus=70))
    with pytest.raises(SchemaError, match="domain_gpus 70 must be a multiple of node.gpus_per_node 4"):
        load_profile(str(path))


def test_a_mesh_must_name_its_links(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(_profile_text(scale_up__fabric="mesh"))
    with pytest.raises(SchemaError, match="links_per_gpu"):
        load_profile(str(path))
