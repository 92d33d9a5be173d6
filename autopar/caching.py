"""Caching: `cached_property` without the lock, and the memo tables' one seam (CHECK_KEYS, below).

`cached_property` without the lock: Python 3.11's functools.cached_property takes an RLock on
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


# ---------------------------------------------------------------------------------------------
# The memo tables' one seam. A table of values computed from a plan is keyed by a key function of
# the plan (and of inputs derived from it); a kept value is right only if the computation reads
# nothing of the plan that the key leaves out. With CHECK_KEYS on (tests/test_caching.py turns it
# on around searches and estimates of every framework), every miss of every such table runs its
# key and its computation once more on a recording plan (fields_read) and raises StaleKeyError
# naming the fields the computation reads and the key does not: a cost term that starts reading a
# new plan field fails there, instead of being served a value computed for another plan. Inside the
# recorded runs (RECORDING) every table computes afresh instead of looking up: a nested table's key
# would record every field it names, not the ones its value is read for.

CHECK_KEYS = False
RECORDING = False  # inside check_key's recorded runs: tables compute afresh, reading through the recorder


class StaleKeyError(AssertionError):
    """A memo table whose key leaves out a plan field its computation reads."""


class Recorder:
    """A plan that records the names of the fields read from it. Properties and methods of the plan's
    class run on the recorder (their reads are recorded as the fields they read); a copy with some
    fields replaced (Draft._replace, model_copy(update=...)) records the other fields' reads."""

    __slots__ = ("_obj", "_reads", "_own")

    def __init__(self, obj: Any, reads: set[str], own: frozenset[str] = frozenset()) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_own", own)  # fields the copy was given: not reads of the original

    def _read(self, name: str) -> None:
        if name not in self._own:
            self._reads.add(name)

    def record(self, names) -> None:
        """Record reads of `names` (an object derived from this plan reports what it read of it)."""
        for name in names:
            self._read(name)

    def __getattr__(self, name: str) -> Any:
        obj = self._obj
        if name == "__dict__":
            for field in obj.__dict__:
                self._read(field)
            return obj.__dict__
        if name in ("_replace", "model_copy") and hasattr(obj, name):
            return self._copier(name)
        attr = getattr(type(obj), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if callable(attr) and getattr(attr, "__module__", "").startswith("autopar"):
            return attr.__get__(self)  # the plan's own method, reading through the recorder
        self._read(name)
        return getattr(obj, name)

    def _copier(self, name: str) -> Callable[..., Any]:
        def copy(**changes: Any) -> Any:
            fields = changes.get("update", changes) if name == "model_copy" else changes
            made = getattr(self._obj, name)(**changes)
            return Recorder(made, self._reads, self._own | frozenset(fields))
        return copy

    def __getitem__(self, index: Any) -> Any:  # a Draft read by position
        names = type(self._obj)._fields
        for name in (names[index] if isinstance(index, slice) else (names[index],)):
            self._read(name)
        return self._obj[index]

    def __iter__(self):
        for name in type(self._obj)._fields:
            self._read(name)
        return iter(self._obj)

    def __len__(self) -> int:
        return len(self._obj)


class RecordingView:
    """An object derived from a recorded plan (`value`, e.g. its Layout) whose attribute reads are
    recorded as the plan fields each attribute derives from (`reads`: attribute -> plan fields);
    its class's properties and methods run on the view, so what they read is recorded too."""

    __slots__ = ("_value", "_plan", "_reads")

    def __init__(self, value: Any, plan: Recorder, reads: dict[str, tuple[str, ...]]) -> None:
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str) -> Any:
        if name in self._reads:
            self._plan.record(self._reads[name])
            return getattr(self._value, name)
        attr = getattr(type(self._value), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if isinstance(attr, cached_property):
            return attr.func(self)  # computed afresh on the view: a cached value would hide its reads
        if callable(attr):
            return attr.__get__(self)
        raise AttributeError(f"{type(self._value).__name__}.{name} is neither declared in its reads nor derived")


def fields_read(fn: Callable[[Any], Any], plan: Any) -> frozenset[str]:
    """The plan fields `fn(plan)` reads (through properties and the plan's own methods too)."""
    reads: set[str] = set()
    fn(Recorder(plan, reads))
    return frozenset(reads)


def check_key(table: str, key: Callable[[Any], Any], compute: Callable[[Any], Any], plan: Any) -> None:
    """StaleKeyError when `compute(plan)` reads a field `key(plan)` does not (CHECK_KEYS mode). The
    recorded runs check no table themselves (each table is checked at its own misses)."""
    global CHECK_KEYS, RECORDING
    was = CHECK_KEYS, RECORDING
    CHECK_KEYS, RECORDING = False, True
    try:
        missing = fields_read(compute, plan) - fields_read(key, plan)
    finally:
        CHECK_KEYS, RECORDING = was
    if missing:
        raise StaleKeyError(f"memo table {table}: its computation reads {', '.join(sorted(missing))} of the plan, "
                            "which its key leaves out; add them to the key")
