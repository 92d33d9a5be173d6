"""Boundary models built from the data autopar ships without building a Pydantic validator (issue 15).

Building a model's validator costs 1-8 ms a class (`plan` built nineteen for the preset, the
cluster profile and the cost model: about 30 ms of its start-up); the classes are declared with
`defer_build=True` and `build` makes the same object in plain Python for the schema features the
shipped data uses: strict int / float / bool / str, Literal, optional, list, dict and nested
models, the Ge/Gt/Le/Lt/MinLen/MaxLen and finite-number constraints, whitespace stripping, and the
after-validators (checks). Anything else - another type or constraint, a wrong type, a value out
of range, a missing or unknown key, a failing check - goes to Pydantic, which returns the same
object or raises the same ValidationError as before. Only data autopar ships (presets, files in
cost_models/ and hardware_profiles/) takes this path; tests/test_plain_schema.py checks that every
such object equals the validated one, types included.
"""

from __future__ import annotations

import math
import types
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types as at
import pydantic.types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.types import StringConstraints, Strict

# Field(allow_inf_nan=...)'s marker; a Pydantic without it reports the constraint otherwise, and
# _holds then refuses it (Pydantic validates).
_ALLOW_INF_NAN = getattr(pydantic.types, "AllowInfNan", ())

M = TypeVar("M", bound=BaseModel)
# model_config keys that do not change what validation returns
_NEUTRAL_CONFIG = {"frozen", "extra", "defer_build", "title"}
_NONE = type(None)


class NotPlain(Exception):
    """The data, or the model, needs Pydantic's validator."""


def build(cls: type[M], data: Any) -> M:
    """`cls.model_validate(data)`: in plain Python where `plain` accepts the data, else by Pydantic
    (a ValidationError as before)."""
    try:
        return plain(cls, data)
    except NotPlain:
        return cls.model_validate(data)


def plain(cls: type[M], data: Any) -> M:
    """cls from a dict of field values, checked as the schema says; NotPlain where it cannot tell."""
    _check_model(cls)
    fields = cls.model_fields
    if type(data) is not dict or not data.keys() <= fields.keys():
        raise NotPlain(cls.__name__)
    values = {}
    for name, info in fields.items():
        if name not in data:
            if info.is_required():
                raise NotPlain(name)
            continue
        value = _value(info.annotation, data[name])
        values[name] = value if value is None else _constrained(info.metadata, value)
    obj = cls.model_construct(**values)
    for decorator in cls.__pydantic_decorators__.model_validators.values():
        try:
            getattr(obj, decorator.cls_var_name)()  # an after-validator: a check returning self
        except ValueError as exc:
            raise NotPlain(str(exc)) from None
    return obj


def _check_model(cls: type[BaseModel]) -> None:
    """NotPlain unless validation of cls is only what `plain` does: forbidden extra keys, no
    aliases, no field validators, only after-mode model validators."""
    config = cls.model_config
    decorators = cls.__pydantic_decorators__
    if (config.get("extra") != "forbid" or not config.keys() <= _NEUTRAL_CONFIG or decorators.field_validators
            or decorators.root_validators or decorators.validators
            or any(d.info.mode != "after" for d in decorators.model_validators.values())
            or any(f.alias or f.validation_alias for f in cls.model_fields.values())):
        raise NotPlain(cls.__name__)


def _value(annotation: Any, value: Any) -> Any:
    """The validated form of value under annotation (int to float for float fields; nested models
    built), or NotPlain."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *metadata = get_args(annotation)
        return _constrained(metadata, _value(base, value))
    if origin is Union or origin is types.UnionType:
        args = get_args(annotation)
        if value is None and _NONE in args:
            return None
        rest = [a for a in args if a is not _NONE]
        if len(rest) != 1:
            raise NotPlain(str(annotation))
        return _value(rest[0], value)
    if origin is Literal:
        if any(type(value) is type(choice) and value == choice for choice in get_args(annotation)):
            return value
        raise NotPlain(str(annotation))
    if origin is list and type(value) is list:
        (item,) = get_args(annotation)
        return [_value(item, v) for v in value]
    if origin is dict and type(value) is dict:
        key, item = get_args(annotation)
        if key is not str or not all(type(k) is str for k in value):
            raise NotPlain(str(annotation))
        return {k: _value(item, v) for k, v in value.items()}
    if annotation is Any:
        return value
    return _scalar(annotation, value)


def _scalar(annotation: Any, value: Any) -> Any:
    if annotation in (int, str, bool) and type(value) is annotation:
        return value
    if annotation is float and type(value) in (int, float):
        return float(value)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return value if type(value) is annotation else plain(annotation, value)
    raise NotPlain(str(annotation))


def _constrained(metadata: list[Any], value: Any) -> Any:
    """value after the metadata's transforms and checks (NotPlain on a failed check or an unknown one)."""
    for m in metadata:
        if isinstance(m, StringConstraints):
            if m.to_upper or m.to_lower or m.pattern is not None or m.ascii_only or type(value) is not str:
                raise NotPlain(repr(m))
            value = value.strip() if m.strip_whitespace else value
            if len(value) < (m.min_length or 0) or (m.max_length is not None and len(value) > m.max_length):
                raise NotPlain(repr(m))
        elif not _holds(m, value):
            raise NotPlain(repr(m))
    return value


def _holds(m: Any, value: Any) -> bool:
    """Whether value meets constraint m (False for a constraint this module does not know)."""
    if isinstance(m, Strict):
        return True  # the types above are already strict
    if isinstance(m, _ALLOW_INF_NAN):
        return m.allow_inf_nan or not isinstance(value, float) or math.isfinite(value)
    if isinstance(m, (at.Ge, at.Gt, at.Le, at.Lt)):
        if type(value) not in (int, float):
            return False
        if isinstance(m, at.Ge):
            return value >= m.ge
        if isinstance(m, at.Gt):
            return value > m.gt
        if isinstance(m, at.Le):
            return value <= m.le
        return value < m.lt
    if isinstance(m, (at.MinLen, at.MaxLen)) and isinstance(value, (str, list, dict)):
        return len(value) >= m.min_length if isinstance(m, at.MinLen) else len(value) <= m.max_length
    if isinstance(m, FieldInfo):  # Annotated[float, Strict(), Field(allow_inf_nan=False)]
        return all(_holds(x, value) for x in m.metadata)
    return False
