"""Cluster profiles: every shipped YAML validates and names its sources; sizing, errors and unit
conversion are checked against hand-worked datasheet numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autopar.data import data_dir
from autopar.errors import InputFileError, SchemaError, UnknownClusterError
from autopar.hardware import Cluster, list_clusters, load_cluster, load_profile
from autopar.schema.hardware import ClusterProfile

SHIPPED_FILES = sorted(p for p in data_dir("hardware_profiles").iterdir() if p.suffix in (".yaml", ".yml"))
REQUIRED_PROFILES = {"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h800", "dgx-h200", "dgx-b200", "vtrain-a100"}


def _profile_dict(name: str = "dgx-h100") -> dict:
    """A shipped profile as a plain dict, to mutate into bad files."""
    return yaml.safe_load((data_dir("hardware_profiles") / f"{name}.yaml").read_text())


def _write(tmp_path: Path, data: object, name: str = "custom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


# --- every shipped file -----------------------------------------------------------------------


def test_required_profiles_are_shipped():
    assert REQUIRED_PROFILES <= set(list_clusters())


def test_list_clusters_is_sorted_stems():
    assert list_clusters() == sorted(p.stem for p in SHIPPED_FILES)


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.stem)
def test_shipped_profile_validates_and_names_sources(path: Path):
    profile = ClusterProfile.model_validate(yaml.safe_load(path.read_text()))
    assert profile.name == path.stem
    assert profile.sources and all(s.strip() for s in profile.sources)


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.stem)
def test_shipped_profile_loads_by_name_and_by_path(path: Path):
    assert load_profile(path.stem) == load_profile(str(path))
    cluster = load_cluster(path.stem)
    assert cluster.num_nodes == 1 and cluster.num_gpus == cluster.gpus_per_node


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.stem)
def test_shipped_profile_numbers_are_consistent(path: Path):
    """Dense peaks keep the tensor-core ratios every NVIDIA datacenter GPU since A100 has (and AMD's
    CDNA 3 and 4; CDNA 4 has no TF32 matrix format at all)."""
    cluster = load_cluster(path.stem)
    peaks = cluster.peak_flops_by_dtype
    assert peaks["fp16"] == peaks["bf16"]
    if "tf32" in peaks:
        assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.03)
    if "fp8" in peaks:
        assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.01)
    # NVLink per direction is faster than one GPU's share of the scale-out fabric.
    assert cluster.intra_node_bytes_per_s > cluster.inter_node_bytes_per_s_per_gpu


# --- unit conversion: hand-worked datasheet values --------------------------------------------


def test_dgx_h100_in_base_units():
    c = load_cluster("dgx-h100")
    assert c.peak_flops("bf16") == 989e12  # H100 SXM dense BF16
    assert c.peak_flops("fp8") == 1979e12  # H100 SXM dense FP8
    assert c.hbm_bytes == 80 * 1024**3
    assert c.hbm_bytes_per_s == 3350e9
    assert c.intra_node_bytes_per_s == 450e9  # 900 GB/s bidirectional / 2
    assert c.nic_bytes_per_s == 400e9 / 8
    assert c.inter_node_bytes_per_s_per_gpu == 8 * (400e9 / 8) / 8  # 8 NICs x 400 Gb/s over 8 GPUs
    assert c.intra_node_latency_s == pytest.approx(2e-6)
    assert c.inter_node_latency_s == pytest.approx(5e-6)
    assert c.topology == "rail-optimized-fat-tree"


def test_a100_has_no_fp8_and_says_which_dtypes_exist():
    c = load_cluster("dgx-a100-80gb")
    assert set(c.peak_flops_by_dtype) == {"bf16", "fp16", "tf32"}
    assert c.peak_flops("bf16") == 312e12
    assert c.peak_flops("tf32") == 156e12
    with pytest.raises(SchemaError, match="bf16, fp16, tf32"):
        c.peak_flops("fp8")


def test_h800_differs_from_h100_only_in_nvlink():
    h100, h800 = load_cluster("dgx-h100"), load_cluster("hgx-h800")
    assert h800.peak_flops_by_dtype == h100.peak_flops_by_dtype
    assert h800.hbm_bytes == h100.hbm_bytes
    assert h800.intra_node_bytes_per_s == 200e9  # 400 GB/s bidirectional / 2
    assert h800.inter_node_bytes_per_s_per_gpu == h100.inter_node_bytes_per_s_per_gpu


def test_vtrain_cluster_has_800_gbit_per_node():
    c = load_cluster("vtrain-a100")
    assert c.nics_per_node * c.nic_bytes_per_s == 800e9 / 8
    assert c.inter_node_bytes_per_s_per_gpu == 800e9 / 8 / 8
    assert c.gpus_per_node == 8


def test_oversubscription_divides_per_gpu_bandwidth(tmp_path: Path):
    data = _profile_dict()
    data["network"]["oversubscription"] = 2.0
    c = load_cluster(str(_write(tmp_path, data)))
    assert c.inter_node_bytes_per_s_per_gpu == 400e9 / 8 / 2


# --- sizing -----------------------------------------------------------------------------------


def test_whole_nodes():
    c = load_cluster("dgx-h100", gpus=16)
    assert (c.num_gpus, c.num_nodes, c.gpus_per_node, c.gpus_in_node) == (16, 2, 8, 8)


def test_default_is_one_node():
    c = load_cluster("dgx-h100")
    assert (c.num_gpus, c.num_nodes) == (8, 1)


def test_partial_single_node():
    c = load_cluster("dgx-h100", gpus=4)
    assert (c.num_gpus, c.num_nodes, c.gpus_per_node, c.gpus_in_node) == (4, 1, 8, 4)


def test_gpus_that_do_not_fill_nodes_are_rejected_with_neighbours():
    with pytest.raises(SchemaError) as err:
        load_cluster("dgx-h100", gpus=12)
    assert str(err.value) == (
        "--gpus 12 does not fill whole nodes of 8 GPUs (dgx-h100); use a multiple of 8 such as 8 or 16"
    )


@pytest.mark.parametrize("gpus", [0, -8])
def test_non_positive_gpus_are_rejected(gpus: int):
    with pytest.raises(SchemaError, match=f"--gpus {gpus}"):
        load_cluster("dgx-h100", gpus=gpus)


def test_cluster_is_frozen():
    c = load_cluster("dgx-h100")
    assert isinstance(c, Cluster)
    with pytest.raises(AttributeError):
        c.num_gpus = 16  # type: ignore[misc]


# --- errors -----------------------------------------------------------------------------------


def test_unknown_name_suggests_closest():
    with pytest.raises(UnknownClusterError) as err:
        load_cluster("dgx-h10")
    message = str(err.value)
    assert "dgx-h100" in message and "autopar clusters" in message
    assert "\n" not in message


def test_unknown_name_without_close_match_still_points_to_listing():
    with pytest.raises(UnknownClusterError, match="autopar clusters"):
        load_profile("zzzzzz")


def test_unknown_key_is_a_schema_error_naming_the_key(tmp_path: Path):
    data = _profile_dict()
    data["gpu"]["hbm_gb"] = 80
    with pytest.raises(SchemaError) as err:
        load_profile(str(_write(tmp_path, data)))
    message = str(err.value)
    assert "gpu.hbm_gb" in message and "rename it to 'hbm_gib'" in message
    assert "\n" not in message


def test_unknown_top_level_key(tmp_path: Path):
    data = _profile_dict()
    data["nvlink"] = {"gb_per_s": 450}
    with pytest.raises(SchemaError, match="'nvlink'"):
        load_profile(str(_write(tmp_path, data)))


def test_bad_value_names_field_and_value(tmp_path: Path):
    data = _profile_dict()
    data["network"]["nic_gbit_per_s"] = -400
    with pytest.raises(SchemaError) as err:
        load_profile(str(_write(tmp_path, data)))
    message = str(err.value)
    assert "network.nic_gbit_per_s" in message and "-400" in message and "\n" not in message


def test_bad_topology_lists_choices(tmp_path: Path):
    data = _profile_dict()
    data["network"]["topology"] = "dragonfly"
    with pytest.raises(SchemaError, match="rail-optimized-fat-tree"):
        load_profile(str(_write(tmp_path, data)))


def test_oversubscription_below_one_is_rejected(tmp_path: Path):
    data = _profile_dict()
    data["network"]["oversubscription"] = 0.5
    with pytest.raises(SchemaError, match="network.oversubscription"):
        load_profile(str(_write(tmp_path, data)))


@pytest.mark.parametrize("sources", [[], [""], None])
def test_sources_are_required(tmp_path: Path, sources):
    data = _profile_dict()
    if sources is None:
        del data["sources"]
    else:
        data["sources"] = sources
    with pytest.raises(SchemaError, match="sources"):
        load_profile(str(_write(tmp_path, data)))


def test_missing_section_is_named(tmp_path: Path):
    data = _profile_dict()
    del data["network"]
    with pytest.raises(SchemaError, match="missing required key 'network'"):
        load_profile(str(_write(tmp_path, data)))


def test_many_errors_stay_on_one_line(tmp_path: Path):
    data = {"name": "x", "gpu": {"junk": 1}, "node": 3}
    with pytest.raises(SchemaError) as err:
        load_profile(str(_write(tmp_path, data)))
    assert "\n" not in str(err.value) and "more)" in str(err.value)


def test_malformed_yaml_is_input_file_error(tmp_path: Path):
    path = _write(tmp_path, "name: dgx\ngpu: [unclosed\n  node: {\n")
    with pytest.raises(InputFileError, match="not valid YAML"):
        load_profile(str(path))


def test_non_mapping_yaml_is_schema_error(tmp_path: Path):
    with pytest.raises(SchemaError, match="mapping"):
        load_profile(str(_write(tmp_path, "- just\n- a list\n")))


def test_missing_file_is_input_file_error(tmp_path: Path):
    with pytest.raises(InputFileError, match="does not exist"):
        load_profile(str(tmp_path / "nope.yaml"))


def test_directory_is_input_file_error(tmp_path: Path):
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(InputFileError):
        load_profile(str(folder))


def test_custom_file_round_trips(tmp_path: Path):
    data = _profile_dict("dgx-b200")
    data["name"] = "my-b200"
    c = load_cluster(str(_write(tmp_path, data, "my.yml")), gpus=64)
    assert (c.name, c.num_nodes, c.peak_flops("bf16")) == ("my-b200", 8, 2250e12)


def test_cluster_is_hashable_for_caching():
    a, b = load_cluster("dgx-h100", gpus=16), load_cluster("dgx-h100", gpus=16)
    assert a == b and hash(a) == hash(b)
    assert a != load_cluster("dgx-h100", gpus=8)


def test_integer_like_gpu_counts_are_accepted():
    numpy = pytest.importorskip("numpy")
    c = load_cluster("dgx-h100", gpus=numpy.int64(16))
    assert (c.num_gpus, c.num_nodes) == (16, 2) and type(c.num_gpus) is int


@pytest.mark.parametrize("gpus", [True, 8.0, "8"])
def test_non_integer_gpu_counts_are_rejected(gpus):
    with pytest.raises(SchemaError, match="positive whole number"):
        load_cluster("dgx-h100", gpus=gpus)
