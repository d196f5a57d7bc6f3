"""Frozen JSON values and the dataclass <-> plain-dict conversion every domain type uses.

Responsibility: let frozen domain dataclasses hold JSON payloads (goal, evidence, fact
values, tool arguments) immutably, and turn any domain dataclass into a JSON-compatible
dict and back, driven by its type hints so no type needs hand-written codec code.

Invariants:
- ``from_plain(type(x), to_plain(x)) == x`` for every domain dataclass ``x``, and the
  dict survives ``json.dumps``/``json.loads`` unchanged.
- A ``FrozenMap`` has string keys and frozen values (None, bool, int, float, str, tuple,
  FrozenMap): it is hashable and equal to any mapping with equal items.
- Decoding is strict: unknown keys and wrongly typed values raise rather than being
  guessed, because a snapshot that decodes "almost" is a silently different run.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Iterable, Iterator, Mapping

JsonValue: typing.TypeAlias = object
"""A frozen JSON value; fields annotated with it are decoded with ``freeze``."""

T = typing.TypeVar("T")


class FrozenMap(Mapping[str, object]):
    """An immutable JSON object: compares by value, hashes, keeps keys sorted."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[str, object] | Iterable[tuple[str, object]] = ()) -> None:
        data = dict(items)
        for key in data:
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be str, got {type(key).__name__}")
        self._data = {key: freeze(data[key]) for key in sorted(data)}

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        """Equal to any mapping with the same JSON content (lists and tuples alike)."""
        if not isinstance(other, Mapping):
            return NotImplemented
        try:
            frozen = other if isinstance(other, FrozenMap) else FrozenMap(other)
        except TypeError:
            return False
        return self._data == frozen._data

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({thaw(self)!r})"


def freeze(value: object) -> object:
    """Deep-copy a JSON value into its immutable form (dict -> FrozenMap, list -> tuple)."""
    if value is None or isinstance(value, str | bool | int | float | FrozenMap):
        return value
    if isinstance(value, Mapping):
        return FrozenMap(value)
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def thaw(value: object) -> object:
    """Inverse of ``freeze``: plain dicts and lists, ready for ``json.dumps``."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(item) for item in value]
    return value


def to_plain(value: object) -> object:
    """Encode a domain value (dataclass, enum, tuple, frozen JSON) as plain JSON data."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(item) for item in value]
    return value


def from_plain(cls: type[T], data: object) -> T:
    """Decode plain JSON data into ``cls``; raises TypeError/ValueError on any mismatch."""
    return typing.cast(T, _decode(cls, data, cls.__name__))


@functools.cache
def _field_specs(cls: type) -> tuple[tuple[str, object, bool], ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


def _decode(tp: object, raw: object, path: str) -> object:  # noqa: C901, PLR0911 - one branch per shape
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if raw is None and type(None) in args:
            return None
        (inner,) = (arg for arg in args if arg is not type(None))
        return _decode(inner, raw, path)
    if origin is tuple:
        if not isinstance(raw, list | tuple):
            raise TypeError(f"{path}: expected a list, got {type(raw).__name__}")
        item_tp = typing.get_args(tp)[0]
        return tuple(_decode(item_tp, item, f"{path}[{i}]") for i, item in enumerate(raw))
    if tp is object:
        return freeze(raw)
    if tp is FrozenMap:
        if not isinstance(raw, Mapping):
            raise TypeError(f"{path}: expected an object, got {type(raw).__name__}")
        return FrozenMap(raw)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(raw)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, raw, path)
    if tp is float and isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    if tp is int and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if tp in (str, bool) and isinstance(raw, typing.cast(type, tp)):
        return raw
    raise TypeError(f"{path}: expected {tp}, got {type(raw).__name__}")


def _decode_dataclass(cls: type, raw: object, path: str) -> object:
    if not isinstance(raw, Mapping):
        raise TypeError(f"{path}: expected an object, got {type(raw).__name__}")
    specs = _field_specs(cls)
    unknown = set(raw) - {name for name, _, _ in specs}
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {sorted(unknown)}")
    kwargs: dict[str, object] = {}
    for name, hint, required in specs:
        if name in raw:
            kwargs[name] = _decode(hint, raw[name], f"{path}.{name}")
        elif required:
            raise ValueError(f"{path}: missing field {name!r}")
    return cls(**kwargs)
