"""Shipped data is built without Pydantic's validators (autopar.schema.plain; issue 15: start-up):
the same objects as validation gives, the same errors where the data is bad, and a `plan` that
builds no boundary schema but the plan's own."""

import importlib
import json
import shutil
import subprocess
import sys

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from autopar import hardware
from autopar.cost import params
from autopar.schema import plain
from autopar.schema.cost_model import CostModelFile
from autopar.schema.hardware import ClusterProfile
from autopar.schema.model import ModelSpec, MoESpec


def assert_same(a, b, where="") -> None:
    """a equals b with the same type at every level (validated and plain objects alike: an int is
    not a float, a list not a tuple), the same fields set and the same field order."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, where
        assert list(a.__dict__) == list(b.__dict__), where
        assert (a.__pydantic_extra__, a.__pydantic_private__) == (b.__pydantic_extra__, b.__pydantic_private__)
        for key in a.__dict__:
            assert_same(a.__dict__[key], b.__dict__[key], f"{where}.{key}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("name", params.list_cost_models())
def test_shipped_cost_models_build_plainly_as_validated(name):
    raw = json.loads((params.data_dir("cost_models") / f"{name}.json").read_text(encoding="utf-8"))
    assert_same(plain.plain(CostModelFile, raw), CostModelFile.model_validate(raw), name)
    assert_same(params.read_cost_model_file(params.data_dir("cost_models") / f"{name}.json"),
                CostModelFile.model_validate(raw), name)


@pytest.mark.parametrize("name", hardware.list_clusters())
def test_shipped_profiles_build_plainly_as_validated(name):
    raw = yaml.safe_load(hardware._shipped_path(name).read_text(encoding="utf-8"))
    assert_same(plain.plain(ClusterProfile, raw), ClusterProfile.model_validate(raw), name)
    assert_same(hardware.load_profile(name), ClusterProfile.model_validate(raw), name)


def test_presets_build_plainly_as_validated(monkeypatch):
    """Every preset (and the shared Llama 3.1 rope scaling) equals the one Pydantic validates."""
    from autopar.model import presets

    built = {n: presets.preset(n) for n in presets.PRESET_NAMES}
    monkeypatch.setattr(plain, "build", lambda cls, fields: cls.model_validate(fields))
    try:
        validated = importlib.reload(presets)
        for name, spec in built.items():
            assert_same(spec, validated.preset(name), name)
    finally:
        monkeypatch.undo()
        importlib.reload(presets)


def test_profile_catalog_is_current():
    """The stored parses of the shipped profiles (read instead of the YAML) are those of the files now."""
    stored = json.loads(hardware.PROFILE_CATALOG_PATH.read_text(encoding="utf-8"))
    assert stored == hardware.parsed_profiles(), (
        "autopar/profile_catalog.json is stale (a shipped profile changed): run `python -m autopar.hardware` "
        "and commit it")
    for name in hardware.list_clusters():
        path = hardware._shipped_path(name)
        text = path.read_text(encoding="utf-8")
        assert hardware._parsed_copy(path, text) == yaml.safe_load(text) is not None, name


def test_a_changed_profile_text_is_parsed_not_read_from_the_catalog(tmp_path):
    path = hardware._shipped_path("dgx-h100")
    text = path.read_text(encoding="utf-8")
    edited = text.replace("hbm_gib: 80", "hbm_gib: 94")
    assert edited != text
    assert hardware._parsed_copy(path, edited) is None
    (tmp_path / "dgx-h100.yaml").write_text(edited, encoding="utf-8")
    assert hardware._read_yaml(tmp_path / "dgx-h100.yaml", fast=True)["gpu"]["hbm_gib"] == 94


def _errors(cls, data):
    with pytest.raises(ValidationError) as err:
        cls.model_validate(data)
    return err.value.errors(include_url=False)


@pytest.mark.parametrize("change", [
    {"hbm_gib": 0}, {"hbm_gib": float("nan")}, {"hbm_gib": True}, {"hbm_gib": "80"}, {"name": "  "},
    {"hbm_gibs": 80}, {"peak_tflops": {"bf16": 989, "fp16": 989, "tf32": -1}}, {"peak_tflops": [989]},
])
def test_bad_data_goes_to_pydantic_and_its_error(change):
    """What plain cannot accept it hands to Pydantic: the ValidationError is the one validation raises."""
    raw = yaml.safe_load(hardware._shipped_path("dgx-h100").read_text(encoding="utf-8"))
    raw["gpu"] = {**raw["gpu"], **change}
    with pytest.raises(plain.NotPlain):
        plain.plain(ClusterProfile, raw)
    with pytest.raises(ValidationError) as err:
        plain.build(ClusterProfile, raw)
    assert err.value.errors(include_url=False) == _errors(ClusterProfile, raw)


def test_missing_keys_and_failed_checks_go_to_pydantic():
    raw = yaml.safe_load(hardware._shipped_path("dgx-h100").read_text(encoding="utf-8"))
    del raw["network"]
    with pytest.raises(plain.NotPlain):
        plain.plain(ClusterProfile, raw)
    moe = {"num_experts": 8, "top_k": 9, "expert_ffn_hidden_size": 64}  # an after-validator refuses it
    with pytest.raises(plain.NotPlain):
        plain.plain(MoESpec, moe)
    with pytest.raises(ValidationError, match="exceeds moe.num_experts"):
        plain.build(MoESpec, moe)
    spec = {"name": "x", "num_layers": 2, "hidden_size": 100, "num_attention_heads": 3, "ffn_hidden_size": 8,
            "vocab_size": 10}
    with pytest.raises(ValidationError, match="not divisible by num_attention_heads"):
        plain.build(ModelSpec, spec)


def test_user_files_are_validated_by_pydantic(tmp_path, monkeypatch):
    """Only shipped files take the plain path; a user's copy of one is validated as before."""
    used = []
    monkeypatch.setattr(hardware, "build", lambda cls, raw: used.append(cls) or plain.build(cls, raw))
    monkeypatch.setattr(params, "build", lambda cls, raw: used.append(cls) or plain.build(cls, raw))
    copy = tmp_path / "mine.yaml"
    shutil.copy(hardware._shipped_path("dgx-h100"), copy)
    cm = tmp_path / "mine.json"
    shutil.copy(params.data_dir("cost_models") / "h100.json", cm)
    assert hardware.load_profile(str(copy)) == hardware.load_profile("dgx-h100")
    assert params.read_cost_model_file(cm) == params.read_cost_model_file(params.data_dir("cost_models") / "h100.json")
    assert used == [ClusterProfile, CostModelFile]


BOUNDARY = ("ModelSpec", "MoESpec", "MLASpec", "RopeScaling", "ClusterProfile", "GPUSpec", "PeakTFLOPS", "NodeSpec",
            "NetworkSpec", "CostModelFile", "Provenance", "ComputeEfficiency", "NetworkEfficiency",
            "MemoryOverheads", "AttentionKernelRate", "FrameworkEfficiency", "GemmPoint", "FitReport")


def test_plan_builds_no_boundary_schema_but_the_plans():
    """`plan --json` builds no validator at all: its search makes plans with ParallelPlan.trusted and
    dumps them with plan_json; the model, cluster and cost-model schemas stay unbuilt, and PyYAML
    unimported (the shipped profile is read from autopar/profile_catalog.json)."""
    argv = ["plan", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "32", "--seq-len", "4096",
            "--global-batch", "64", "--top", "1", "--fix", "tp=2,pp=4,ep=4,mbs=1", "--json", "--quiet"]
    probe = (f"import sys, json\nsys.argv = ['autopar', *{argv!r}]\nimport autopar.cli\n"
             "try:\n    autopar.cli.main()\nexcept SystemExit:\n    pass\n"
             "from pydantic import BaseModel\n"
             "def subclasses(c):\n    for s in c.__subclasses__():\n        yield s\n        yield from subclasses(s)\n"
             "built = sorted(c.__name__ for c in subclasses(BaseModel) if c.__module__.startswith('autopar')"
             " and c.__pydantic_complete__)\n"
             "print(json.dumps({'built': built, 'yaml': 'yaml' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    *plan_json, last = out.splitlines()
    assert json.loads("\n".join(plan_json))["plans"]  # the plan itself came out
    result = json.loads(last)
    assert result["built"] == []
    assert not result["yaml"]
    assert not set(result["built"]) & set(BOUNDARY)
