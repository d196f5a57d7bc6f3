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
    cls = type(value)
    if cls in _PLAIN:
        return value
    encode = _ENCODERS.get(cls)
    if encode is None:
        encode = _ENCODERS[cls] = _encoder(cls)
    return encode(value)


_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_ENCODERS: dict[type, typing.Callable[[typing.Any], object]] = {}
"""How each type encodes, decided once per type: every snapshot write encodes hundreds of values."""


def _encoder(cls: type) -> typing.Callable[[typing.Any], object]:
    if issubclass(cls, enum.Enum):
        return lambda value: value.value
    if dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))
        return lambda value: {name: to_plain(getattr(value, name)) for name in names}
    if issubclass(cls, Mapping):
        return lambda value: {key: to_plain(item) for key, item in value.items()}
    if issubclass(cls, list | tuple):
        return lambda value: [to_plain(item) for item in value]
    return lambda value: value


def from_plain(cls: type[T], data: object) -> T:
    """Decode plain JSON data into ``cls``; raises TypeError/ValueError on any mismatch."""
    return typing.cast(T, _decoder(cls)(data, cls.__name__))


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


_Decoder: typing.TypeAlias = typing.Callable[[object, str], object]


@functools.cache
def _decoder(tp: object) -> _Decoder:  # noqa: C901, PLR0911 - one branch per shape
    """How values of ``tp`` decode, worked out once per type rather than on every value."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return _union_decoder(typing.get_args(tp))
    if origin is tuple:
        return _tuple_decoder(typing.get_args(tp)[0])
    if tp is object:
        return lambda raw, path: freeze(raw)
    if tp is FrozenMap:
        return _frozen_map_decoder
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda raw, path: tp(raw)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)
    if tp is float:
        return _float_decoder
    if tp is int:
        return _int_decoder
    if tp is str or tp is bool:
        return _instance_decoder(typing.cast(type, tp))
    return lambda raw, path: _mismatch(tp, raw, path)


def _mismatch(tp: object, raw: object, path: str) -> typing.NoReturn:
    raise TypeError(f"{path}: expected {tp}, got {type(raw).__name__}")


def _union_decoder(args: tuple[object, ...]) -> _Decoder:
    optional = type(None) in args
    inner = tuple(arg for arg in args if arg is not type(None))

    def decode(raw: object, path: str) -> object:
        if raw is None and optional:
            return None
        (only,) = inner
        return _decoder(only)(raw, path)

    return decode


def _tuple_decoder(item_tp: object) -> _Decoder:
    def decode(raw: object, path: str) -> object:
        if not isinstance(raw, list | tuple):
            raise TypeError(f"{path}: expected a list, got {type(raw).__name__}")
        item = _decoder(item_tp)
        return tuple(item(value, f"{path}[{i}]") for i, value in enumerate(raw))

    return decode


def _frozen_map_decoder(raw: object, path: str) -> object:
    if not isinstance(raw, Mapping):
        raise TypeError(f"{path}: expected an object, got {type(raw).__name__}")
    return FrozenMap(raw)


def _float_decoder(raw: object, path: str) -> object:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    _mismatch(float, raw, path)


def _int_decoder(raw: object, path: str) -> object:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    _mismatch(int, raw, path)


def _instance_decoder(tp: type) -> _Decoder:
    def decode(raw: object, path: str) -> object:
        if isinstance(raw, tp):
            return raw
        _mismatch(tp, raw, path)

    return decode


def _dataclass_decoder(cls: type) -> _Decoder:
    # Field decoders are resolved on first use, so a dataclass may refer to itself.
    resolved: list[tuple[frozenset[str], tuple[tuple[str, _Decoder, bool], ...]]] = []

    def decode(raw: object, path: str) -> object:
        if not isinstance(raw, Mapping):
            raise TypeError(f"{path}: expected an object, got {type(raw).__name__}")
        if not resolved:
            specs = _field_specs(cls)
            resolved.append((frozenset(name for name, _, _ in specs),
                             tuple((name, _decoder(hint), required) for name, hint, required in specs)))
        names, fields = resolved[0]
        unknown = set(raw) - names
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {sorted(unknown)}")
        kwargs: dict[str, object] = {}
        for name, decode_field, required in fields:
            if name in raw:
                kwargs[name] = decode_field(raw[name], f"{path}.{name}")
            elif required:
                raise ValueError(f"{path}: missing field {name!r}")
        return cls(**kwargs)

    return decode
