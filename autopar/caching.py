"""`cached_property` without the lock: Python 3.11's functools.cached_property takes an RLock on
every first read of every instance (Python 3.12 removed it: "What's New in Python 3.12",
functools), which doubles the cost of the ~2·10^4 first reads a MoE search makes of its Layouts
and tables. autopar is single-threaded. The value is computed once per instance and kept in its
__dict__, as functools does (so frozen dataclasses work: their __setattr__ is never called)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class cached_property(Generic[T]):  # noqa: N801 (the functools name, a drop-in replacement)
    __slots__ = ("func", "attrname", "__doc__")

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.attrname = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.attrname = name

    def __get__(self, instance: Any, owner: type | None = None) -> T:
        if instance is None:
            return self  # type: ignore[return-value]
        value = instance.__dict__[self.attrname] = self.func(instance)
        return value
