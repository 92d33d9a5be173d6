"""Cluster profiles at run time: load a YAML profile, size it to a GPU count, convert to base units.

`load_profile` reads and validates a file (shipped name or path); `load_cluster` turns it into a
`Cluster` in bytes, bytes/s, FLOP/s and seconds, the only form the cost model reads. Every
failure is a one-line domain error naming the fix; no pydantic or YAML exception escapes.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autopar.data import data_dir
from autopar.errors import InputFileError, SchemaError, UnknownClusterError
from autopar.io import YamlKeyError, read_text_file
from autopar.limits import MAX_GPUS, check_name, clip, clip_repr
from autopar.schema.hardware import ClusterProfile
from autopar.schema.plain import build
from autopar.units import GB, GBIT, GiB, TFLOPS, US

_PROFILE_DIR_NAME = "hardware_profiles"
_YAML_SUFFIXES = (".yaml", ".yml")
# autopar/profile_catalog.json: each shipped profile's YAML parsed, keyed by file name, with the
# SHA-256 of the text it was parsed from. A shipped profile whose text has that hash is read from
# it, so `plan` does not import PyYAML (~20 ms, issue 15); any other text is parsed. Regenerate
# with `python -m autopar.hardware` (tests/test_plain_schema.py fails while it is stale).
PROFILE_CATALOG_PATH = Path(__file__).resolve().parent / "profile_catalog.json"
_FIX_BY_FIELD = {"sources": "list the datasheet, user guide or paper each number comes from"}


@dataclass(frozen=True, slots=True)
class Cluster:
    """A sized cluster in base units (bytes, bytes/s, FLOP/s, s); the cost model's only view of hardware.

    `gpus_per_node` is the host's GPU count (a DGX server, an NVL72 compute tray of 4). Whole hosts
    are used, so num_gpus == num_nodes * gpus_per_node, except for a single partial node (num_nodes
    == 1 and num_gpus < gpus_per_node); `gpus_in_node` gives the GPUs actually used per node.

    `scale_up_gpus` is the part of one scale-up domain (NVLink / Infinity Fabric) the job's ranks
    fill in rank order, the span every process group is placed on (autopar.cost.comm.group_span):
    the host where the profile states no domain (bit-for-bit the old model), else the largest whole
    number of hosts up to the domain that divides the job (512 GPUs on 72-GPU NVL72 racks: 64 per
    rack, the equal segments a scheduler hands out, SLURM --segment). `scale_up_domain_gpus` is the
    domain itself (72), `scale_up_fabric` "switch" or "mesh" with `scale_up_links` links per GPU.
    """

    name: str
    gpu_name: str
    num_gpus: int
    num_nodes: int
    gpus_per_node: int
    peak_flops_by_dtype: dict[str, float] = field(hash=False)  # "bf16", "fp16", "tf32", "fp8" where supported
    hbm_bytes: float
    hbm_bytes_per_s: float
    intra_node_bytes_per_s: float  # NVLink, per GPU per direction
    intra_node_latency_s: float
    nics_per_node: int
    nic_bytes_per_s: float  # one NIC
    inter_node_latency_s: float
    oversubscription: float  # 1 = non-blocking
    topology: str
    scale_up_gpus: int = 0  # 0: gpus_per_node (a Cluster built by hand)
    scale_up_domain_gpus: int = 0
    scale_up_fabric: str = "switch"
    scale_up_links: int = 0  # mesh: point-to-point links per GPU, intra_node_bytes_per_s their sum
    vendor: str = "nvidia"
    precisions: tuple[str, ...] = ()  # GEMM formats besides bf16 (fp8, mxfp8, nvfp4, mxfp4); () = fp8 if a peak
    # The profile's own cost model (a measured one, `autopar profile --distributed`), as a path;
    # None: the shipped one for the GPU. Not hashed: the cost terms read CostParams, never this.
    cost_model: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.scale_up_gpus:
            object.__setattr__(self, "scale_up_gpus", self.gpus_per_node)
        if not self.scale_up_domain_gpus:
            object.__setattr__(self, "scale_up_domain_gpus", self.scale_up_gpus)
        if not self.precisions and "fp8" in self.peak_flops_by_dtype:
            object.__setattr__(self, "precisions", ("fp8",))

    def supports(self, precision: str) -> bool:
        """Whether the GPU's tensor cores run GEMMs in `precision` (bf16 everywhere)."""
        return str(precision) == "bf16" or str(precision) in self.precisions

    def mesh_link_share(self, ranks: int) -> float:
        """Fraction of the per-GPU scale-up bandwidth a group of `ranks` GPUs inside one domain
        uses: 1 on a switch; (ranks − 1)/links on a full mesh, whose GPUs reach each peer over one
        link of their own (AMD Instinct platform: 7 xGMI links per GPU to its 7 peers)."""
        if self.scale_up_fabric != "mesh" or not self.scale_up_links or ranks <= 1:
            return 1.0
        return min(ranks - 1, self.scale_up_links) / self.scale_up_links

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s of one GPU in `dtype`; SchemaError naming the supported dtypes if absent."""
        try:
            return self.peak_flops_by_dtype[dtype]
        except KeyError:
            supported = ", ".join(sorted(self.peak_flops_by_dtype))
            raise SchemaError(
                f"{self.gpu_name} ({self.name}) has no {dtype!r} peak; use one of {supported}"
            ) from None

    @property
    def inter_node_bytes_per_s_per_gpu(self) -> float:
        """Scale-out bandwidth one GPU gets when all GPUs of a node send at once, after oversubscription."""
        return self.nics_per_node * self.nic_bytes_per_s / self.gpus_per_node / self.oversubscription

    @property
    def gpus_in_node(self) -> int:
        """GPUs this cluster uses in each node: gpus_per_node, or fewer for one partial node."""
        return min(self.num_gpus, self.gpus_per_node)


def list_clusters() -> list[str]:
    """Names of the shipped cluster profiles, sorted (the file stems in hardware_profiles/)."""
    folder = data_dir(_PROFILE_DIR_NAME)
    return sorted(p.stem for p in folder.iterdir() if p.suffix in _YAML_SUFFIXES and p.is_file())


def cluster_rows() -> list[dict[str, Any]]:
    """Every shipped cluster profile with its headline numbers (what `autopar clusters` lists):
    `scale_up_domain_gpus` and `scale_up` (fabric, its name, links) state the NVLink / Infinity
    Fabric domain apart from the host (`gpus_per_node`)."""
    out = []
    for name in list_clusters():
        prof = load_profile(name)
        up = prof.scale_up
        out.append({"name": name, "gpu": prof.gpu.name, "gpus_per_node": prof.node.gpus_per_node,
                    "scale_up_domain_gpus": up.domain_gpus if up else prof.node.gpus_per_node,
                    "scale_up": {"fabric": up.fabric if up else "switch", "name": up.name if up else None,
                                 "links_per_gpu": up.links_per_gpu if up else None},
                    "vendor": prof.gpu.vendor, "precisions": ["bf16", *_low_precision(prof)],
                    "bf16_tflops": prof.gpu.peak_tflops.bf16, "hbm_gib": prof.gpu.hbm_gib,
                    "nvlink_gb_per_s": prof.node.intra_node_gb_per_s,
                    "network": f"{prof.network.nics_per_node}x{prof.network.nic_gbit_per_s:g} Gb/s",
                    "description": prof.description})
    return out


def _low_precision(profile: ClusterProfile) -> list[str]:
    """The profile's low-precision GEMM formats: as listed, else fp8 where it gives an fp8 peak."""
    gpu = profile.gpu
    if gpu.low_precision is not None:
        return list(gpu.low_precision)
    return ["fp8"] if gpu.peak_tflops.fp8 is not None else []


def segment_gpus(host_gpus: int, domain_gpus: int, num_gpus: int) -> int:
    """GPUs of one scale-up domain a job of `num_gpus` fills: the largest multiple of the host up
    to the domain that divides the job (equal segments of whole hosts per domain, as SLURM's
    --segment hands them out), the job itself when it is smaller than the domain."""
    if num_gpus <= domain_gpus:
        return num_gpus if num_gpus % host_gpus == 0 else host_gpus
    return max(d for d in range(host_gpus, domain_gpus + 1, host_gpus) if num_gpus % d == 0)


def load_profile(name_or_path: str) -> ClusterProfile:
    """Read and validate a cluster profile: a shipped name (see list_clusters) or a path to a YAML file."""
    path = _resolve(name_or_path)
    shipped = path.parent == data_dir(_PROFILE_DIR_NAME)
    return _validate(_read_yaml(path, fast=shipped), path, shipped)


def load_cluster(name_or_path: str, gpus: int | None = None) -> Cluster:
    """Load a profile and size it to `gpus` GPUs (None = one full node), in base units."""
    profile = load_profile(name_or_path)
    num_gpus, num_nodes = _size(profile, profile.node.gpus_per_node if gpus is None else gpus)
    cluster = cluster_from_profile(profile, num_gpus, num_nodes)
    if profile.cost_model is None:
        return cluster
    import dataclasses

    path = _resolve(name_or_path).parent / Path(profile.cost_model).expanduser()
    return dataclasses.replace(cluster, cost_model=str(path))


def cluster_from_profile(profile: ClusterProfile, num_gpus: int, num_nodes: int) -> Cluster:
    """Convert a validated profile to base units; the only place file units become bytes and seconds."""
    gpu, node, net, up = profile.gpu, profile.node, profile.network, profile.scale_up
    peaks = {dtype: tflops * TFLOPS for dtype in type(gpu.peak_tflops).model_fields
             if (tflops := getattr(gpu.peak_tflops, dtype)) is not None}
    scale_up = node.gpus_per_node if up is None else segment_gpus(node.gpus_per_node, up.domain_gpus, num_gpus)
    return Cluster(
        name=profile.name,
        gpu_name=gpu.name,
        num_gpus=num_gpus,
        num_nodes=num_nodes,
        gpus_per_node=node.gpus_per_node,
        peak_flops_by_dtype=peaks,
        hbm_bytes=gpu.hbm_gib * GiB,
        hbm_bytes_per_s=gpu.hbm_gb_per_s * GB,
        intra_node_bytes_per_s=node.intra_node_gb_per_s * GB,
        intra_node_latency_s=node.intra_node_latency_us * US,
        nics_per_node=net.nics_per_node,
        nic_bytes_per_s=net.nic_gbit_per_s * GBIT,
        inter_node_latency_s=net.latency_us * US,
        oversubscription=net.oversubscription,
        topology=net.topology,
        scale_up_gpus=scale_up,
        scale_up_domain_gpus=node.gpus_per_node if up is None else up.domain_gpus,
        scale_up_fabric="switch" if up is None else up.fabric,
        scale_up_links=(up.links_per_gpu or 0) if up is not None else 0,
        vendor=gpu.vendor,
        precisions=tuple(_low_precision(profile)),
    )


def _size(profile: ClusterProfile, requested: int) -> tuple[int, int]:
    """(GPUs, nodes) for a requested GPU count: whole nodes, or one partial node below a node's size."""
    per_node = profile.node.gpus_per_node
    try:
        gpus = -1 if isinstance(requested, bool) else operator.index(requested)
    except TypeError:
        gpus = -1
    if gpus < 1:
        raise SchemaError(f"--gpus {clip_repr(requested)} is not a positive whole number; use e.g. --gpus {per_node}")
    if gpus > MAX_GPUS:
        raise SchemaError(f"--gpus {clip(gpus)} is over autopar's limit of {MAX_GPUS:,} GPUs; use fewer")
    if gpus <= per_node:
        return gpus, 1
    if gpus % per_node:
        lower = gpus // per_node * per_node
        raise SchemaError(
            f"--gpus {gpus} does not fill whole nodes of {per_node} GPUs ({profile.name}); "
            f"use a multiple of {per_node} such as {lower} or {lower + per_node}"
        )
    return gpus, gpus // per_node


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(_YAML_SUFFIXES) or "/" in name_or_path or "\\" in name_or_path


def _resolve(name_or_path: str) -> Path:
    """Map a shipped name or a path to a file path; UnknownClusterError for an unknown name."""
    check_name(name_or_path, "cluster")
    if _looks_like_path(name_or_path):
        return Path(name_or_path).expanduser()
    names = list_clusters()
    if name_or_path in names:
        return _shipped_path(name_or_path)
    if Path(name_or_path).is_file():  # a YAML file without a suffix in the working directory
        return Path(name_or_path)
    close = difflib.get_close_matches(name_or_path, names, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UnknownClusterError(
        f"unknown cluster {clip_repr(name_or_path)}; {hint}run `autopar clusters` to list shipped profiles, "
        "or pass a path to a profile YAML file"
    )


def _shipped_path(name: str) -> Path:
    folder = data_dir(_PROFILE_DIR_NAME)
    for suffix in _YAML_SUFFIXES:
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    raise UnknownClusterError(f"cluster profile {name!r} vanished from {folder}; reinstall autopar")


def _parse_yaml(text: str, fast: bool) -> Any:
    """libyaml's parser when `fast` and PyYAML was built with it (the same data as yaml.SafeLoader,
    8x faster: tests/test_startup.py); a user's file keeps the pure-Python loader, whose error
    messages autopar quotes."""
    import yaml

    from autopar.io import strict_yaml

    if fast:
        try:
            return strict_yaml(text, fast=True)
        except yaml.YAMLError:
            pass  # the pure-Python loader words the error
    return strict_yaml(text)


def _text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _parsed_copy(path: Path, text: str) -> Any:
    """The parse of a shipped profile's text stored in PROFILE_CATALOG_PATH, or None when that file
    has none for exactly this text."""
    try:
        entry = json.loads(PROFILE_CATALOG_PATH.read_text(encoding="utf-8")).get(path.name)
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    if isinstance(entry, dict) and entry.get("sha256") == _text_sha256(text):
        return entry.get("data")
    return None


def parsed_profiles() -> dict[str, Any]:
    """PROFILE_CATALOG_PATH's content for the shipped profiles as they are now."""
    out = {}
    for name in list_clusters():
        path = _shipped_path(name)
        text = read_text_file(path, "cluster file", "reinstall autopar")  # the text _read_yaml hashes
        out[path.name] = {"sha256": _text_sha256(text), "data": _parse_yaml(text, fast=False)}
    return out


def write_parsed_profiles() -> Path:
    PROFILE_CATALOG_PATH.write_text(json.dumps(parsed_profiles(), indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    return PROFILE_CATALOG_PATH


def _read_yaml(path: Path, fast: bool = False) -> Any:
    """Parse a YAML file (`fast`, for a shipped profile: its stored parse when current, else with
    libyaml when present); InputFileError for a missing, unreadable, oversized or malformed file."""
    text = read_text_file(path, "cluster file", "check the path, or run `autopar clusters` for shipped names")
    if fast and (stored := _parsed_copy(path, text)) is not None:
        return stored
    import yaml

    try:
        return _parse_yaml(text, fast)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = clip(getattr(err, "problem", None) or "invalid YAML")
        raise InputFileError(f"cluster file {clip(path)} is not valid YAML{where} ({problem}); fix the syntax") from None
    except YamlKeyError as err:
        raise InputFileError(f"cluster file {clip(path)}: {err}") from None
    except (ValueError, RecursionError):
        raise InputFileError(f"cluster file {clip(path)} cannot be parsed; pass a cluster profile YAML") from None


def _validate(raw: Any, path: Path, shipped: bool = False) -> ClusterProfile:
    """Validate parsed YAML against ClusterProfile (a shipped profile without building Pydantic's
    validator where its data allows, autopar.schema.plain: the same object); a one-line
    SchemaError on any violation."""
    if not isinstance(raw, dict):
        raise SchemaError(
            f"{path.name}: a cluster profile must be a mapping with keys name, description, sources, gpu, node, network; "
            f"got {type(raw).__name__}"
        )
    try:
        return build(ClusterProfile, raw) if shipped else ClusterProfile.model_validate(raw)
    except ValidationError as err:
        raise SchemaError(_describe_errors(err, path)) from None


def _describe_errors(err: ValidationError, path: Path, limit: int = 3) -> str:
    """One line: file, then up to `limit` violations as 'field: problem; fix', then a count of the rest."""
    errors = err.errors(include_url=False)
    parts = [_describe_error(e) for e in errors[:limit]]
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{clip(path.name)}: " + "; ".join(parts) + more


def _describe_error(error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    key = clip(".".join(str(part) for part in loc) or "<top level>")
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        fix = f"rename it to {close[0]!r} or remove it" if close else "remove it"
        return f"unknown key {key!r}; {fix} (allowed here: {', '.join(allowed)})"
    if kind == "missing":
        return f"missing required key {key!r}; add it"
    got = error.get("input")
    got_text = "" if isinstance(got, (dict, list)) else f" (got {clip_repr(got)})"
    fix = _FIX_BY_FIELD.get(str(loc[0]) if loc else "", "fix this value")
    return f"{key}: {error['msg']}{got_text}; {fix}"


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the sub-model at `loc` inside ClusterProfile (list indices skipped)."""
    model: type[BaseModel] = ClusterProfile
    for part in loc:
        if isinstance(part, int) or part not in model.model_fields:
            continue
        annotation = model.model_fields[part].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return list(model.model_fields)


def gpu_arch(gpu_name: str) -> str:
    """ampere (A100), hopper (H100/H800/H200), blackwell (B200, B300, GB200, GB300), cdna3 (MI300X,
    MI325X), cdna4 (MI350X, MI355X), from the profile's GPU name."""
    upper = gpu_name.upper()
    if "A100" in upper:
        return "ampere"
    if "MI35" in upper:
        return "cdna4"
    if "MI3" in upper:
        return "cdna3"
    if any(tag in upper for tag in ("B200", "B100", "B300")):
        return "blackwell"
    return "hopper"


if __name__ == "__main__":
    print(f"wrote {write_parsed_profiles()}")
