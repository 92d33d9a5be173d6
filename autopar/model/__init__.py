"""Model graphs from presets, Hugging Face config.json files and YAML layer-graph files."""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from autopar.errors import InputFileError, SchemaError, UnknownModelError
from autopar.io import read_text_file
from autopar.limits import check_name, clip, clip_repr
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
    import yaml  # only model files need it (issue 15: presets load without PyYAML)

    from autopar.io import YamlKeyError, strict_yaml

    text = read_text_file(path, "model file", "check the path or use a preset (autopar models)")
    is_json = path.suffix.lower() == ".json"
    try:
        data = json.loads(text) if is_json else strict_yaml(text)
    except YamlKeyError as exc:
        raise InputFileError(f"model file {clip(path)}: {exc}")
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        where = getattr(exc, "lineno", None) or getattr(getattr(exc, "problem_mark", None), "line", None)
        raise InputFileError(f"model file {clip(path)} is malformed {'JSON' if is_json else 'YAML'}"
                             f"{f' near line {where}' if where else ''}; fix its syntax")
    except (ValueError, RecursionError):
        raise InputFileError(f"model file {clip(path)} cannot be parsed; check that it is a config.json or a YAML layer graph")
    if not isinstance(data, dict):
        raise InputFileError(f"model file {clip(path)} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


# Keys only a Hugging Face config.json has: a file with these but no model_type is a config.json
# missing its model_type, not a YAML layer graph with unknown keys.
_HF_ONLY_KEYS = ("num_hidden_layers", "intermediate_size", "architectures", "n_layer", "n_embd", "torch_dtype")


def _spec_from_file(path: Path) -> ModelSpec:
    data = _read_mapping(path)
    try:
        if "model_type" in data:
            return spec_from_hf_config(data, name=_name_of(data, path))
        if any(k in data for k in _HF_ONLY_KEYS):
            raise SchemaError(f"model file {clip(path)} looks like a Hugging Face config.json but lacks 'model_type'; "
                              f"add it (one of {', '.join(SUPPORTED_MODEL_TYPES)})")
        data.setdefault("name", path.stem)
        return ModelSpec(**data)
    except ValidationError as exc:
        raise SchemaError(one_line(exc, f"model file {clip(path)}"))


def _name_of(data: dict, path: Path) -> str:
    """The config's own name: its _name_or_path; else the model's name where the path gives one
    (a Hugging Face cache folder models--ORG--NAME gives ORG/NAME, a checkout folder Qwen2.5-7B or a
    file qwen2.5-7b.json its own name; never a snapshot hash); else its architecture. Without the
    path, every Qwen2.5 size would be called Qwen2ForCausalLM."""
    own = data.get("_name_or_path")
    if isinstance(own, str) and own.strip():
        return clip(own.strip(), 200)
    return clip(_path_name(path) or config_name(data), 200)


_HASH_LIKE = re.compile(r"[0-9a-f]{7,64}")  # a git commit or cache snapshot folder
_NOT_A_NAME = frozenset({"snapshots", "tmp", "temp", "home", "root", "work", "models", "downloads", "configs",
                         "config", "hf", "checkpoints", "model", "src", "data"})


def _path_name(path: Path) -> str | None:
    """A model name the config's path gives (see _name_of), or None."""
    try:
        path = path.resolve()
    except (OSError, RuntimeError):
        pass
    for part in reversed(path.parts):
        if part.startswith("models--") and part.count("--") >= 2:  # huggingface_hub's cache layout
            return part[len("models--"):].replace("--", "/", 1)
    if path.suffix.lower() in (".json", ".yaml", ".yml") and path.stem.lower() != "config":
        return path.stem or None
    folder = path.parent.name if path.suffix else path.name
    if not folder or _HASH_LIKE.fullmatch(folder) or folder.lower() in _NOT_A_NAME:
        return None
    return folder


def load_spec(name_or_path: str) -> ModelSpec:
    """A preset name, a Hugging Face config.json, or a YAML/JSON ModelSpec file."""
    if name_or_path in PRESET_NAMES:
        return preset(name_or_path)
    check_name(name_or_path, "model")
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() in _FILE_SUFFIXES or path.exists():
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise InputFileError(f"model {clip(path)} is a directory without a config.json; pass the config file")
            path = path / "config.json"
        return _spec_from_file(path)
    close = difflib.get_close_matches(name_or_path.lower(), PRESET_NAMES, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(f"unknown model {clip_repr(name_or_path)}; {hint}run `autopar models` for presets, "
                            "or pass a config.json or YAML path")


@lru_cache(maxsize=64)
def load_model(name_or_path: str) -> ModelGraph:
    """The layer graph of a preset or model file (cached: graphs are immutable)."""
    return build_graph(load_spec(name_or_path))
