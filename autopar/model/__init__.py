"""Model graphs from presets, Hugging Face config.json files and YAML layer-graph files."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from autopar.errors import InputFileError, SchemaError, UnknownModelError
from autopar.model.build import build_graph
from autopar.model.graph import Activation, Gemm, Layer, ModelGraph
from autopar.model.hf_config import SUPPORTED_MODEL_TYPES, config_name, spec_from_hf_config
from autopar.model.presets import PRESET_NAMES, preset
from autopar.schema import one_line
from autopar.schema.model import ModelSpec

__all__ = [
    "Activation", "Gemm", "Layer", "ModelGraph", "ModelSpec", "PRESET_NAMES", "SUPPORTED_MODEL_TYPES",
    "build_graph", "load_model", "load_spec",
]

_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def _read_mapping(path: Path) -> dict:
    """Parse a JSON or YAML file into a dict, with one-line errors for every failure."""
    if not path.is_file():
        raise InputFileError(f"model file {path} does not exist; check the path or use a preset (autopar models)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read model file {path} ({exc.__class__.__name__}); check its permissions and encoding")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        where = getattr(exc, "lineno", None) or getattr(getattr(exc, "problem_mark", None), "line", None)
        raise InputFileError(f"model file {path} is malformed {'JSON' if path.suffix == '.json' else 'YAML'}"
                             f"{f' near line {where}' if where else ''}; fix its syntax")
    if not isinstance(data, dict):
        raise InputFileError(f"model file {path} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def _spec_from_file(path: Path) -> ModelSpec:
    data = _read_mapping(path)
    try:
        if "model_type" in data:
            return spec_from_hf_config(data, name=config_name(data))
        data.setdefault("name", path.stem)
        return ModelSpec(**data)
    except ValidationError as exc:
        raise SchemaError(one_line(exc, f"model file {path}"))


def load_spec(name_or_path: str) -> ModelSpec:
    """A preset name, a Hugging Face config.json, or a YAML/JSON ModelSpec file."""
    if name_or_path in PRESET_NAMES:
        return preset(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() in _FILE_SUFFIXES or path.exists():
        if path.is_dir() and (path / "config.json").is_file():
            path = path / "config.json"
        return _spec_from_file(path)
    close = difflib.get_close_matches(name_or_path.lower(), PRESET_NAMES, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(f"unknown model {name_or_path!r}; {hint}run `autopar models` for presets, "
                            "or pass a config.json or YAML path")


@lru_cache(maxsize=64)
def load_model(name_or_path: str) -> ModelGraph:
    """The layer graph of a preset or model file (cached: graphs are immutable)."""
    return build_graph(load_spec(name_or_path))
