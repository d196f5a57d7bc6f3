"""Round trips: snapshots and every event type survive JSON exactly, and bad input is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longrun.domain import (
    EVENT_TYPES,
    FrozenMap,
    RunEvent,
    RunSnapshot,
    Usage,
    event_from_dict,
    event_to_dict,
    freeze,
    thaw,
)
from longrun.errors import UnknownSchemaVersion

from .support import History, json_objects, json_values, strategy_for

SETTINGS = settings(max_examples=60, deadline=None, database=None)
snapshots = strategy_for(RunSnapshot)
events = st.sampled_from(sorted(EVENT_TYPES.values(), key=lambda c: c.type)).flatmap(strategy_for)


def _via_json(data: object) -> object:
    return json.loads(json.dumps(data))


@SETTINGS
@given(snapshots)
def test_snapshot_to_dict_and_from_dict_are_inverses(snapshot: RunSnapshot) -> None:
    plain = _via_json(snapshot.to_dict())
    assert isinstance(plain, dict)
    restored = RunSnapshot.from_dict(plain)
    assert restored == snapshot
    assert restored.to_dict() == plain


@SETTINGS
@given(events)
def test_every_event_type_round_trips_through_json(event: RunEvent) -> None:
    plain = _via_json(event_to_dict(event))
    assert isinstance(plain, dict)
    assert plain["type"] == event.type
    restored = event_from_dict(plain)
    assert restored == event
    assert event_to_dict(restored) == plain


@SETTINGS
@given(json_values)
def test_freeze_and_thaw_are_inverses_on_json(value: object) -> None:
    frozen = freeze(value)
    assert thaw(frozen) == value
    assert hash(frozen) == hash(freeze(_via_json(value)))


@SETTINGS
@given(json_objects)
def test_a_frozen_map_equals_the_mapping_it_was_built_from(obj: dict[str, object]) -> None:
    assert FrozenMap(obj) == obj
    assert FrozenMap(obj) == FrozenMap(dict(reversed(list(obj.items()))))


def test_a_snapshot_with_an_unknown_schema_version_is_refused_not_guessed() -> None:
    plain = History().snapshot.to_dict() | {"schema_version": 99}
    with pytest.raises(UnknownSchemaVersion):
        RunSnapshot.from_dict(plain)


def test_unknown_fields_and_wrong_types_are_refused() -> None:
    plain = History().snapshot.to_dict()
    with pytest.raises(ValueError, match="unknown field"):
        RunSnapshot.from_dict(plain | {"colour": "blue"})
    with pytest.raises(TypeError, match="revision"):
        RunSnapshot.from_dict(plain | {"revision": "1"})
    with pytest.raises(TypeError, match="revision"):
        RunSnapshot.from_dict(plain | {"revision": True})


def test_an_unknown_event_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown run event type"):
        event_from_dict({"type": "run.exploded", "seq": 1, "at": 0.0})


def test_frozen_values_are_immutable_and_hashable() -> None:
    snapshot = History(budget=Usage(1, 1, 1.0)).snapshot
    assert hash(snapshot) == hash(RunSnapshot.from_dict(snapshot.to_dict()))
    with pytest.raises(TypeError):
        snapshot.goal["goal"] = "something else"  # type: ignore[index]
