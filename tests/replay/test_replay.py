"""Recorded histories replay: they fold into the snapshot that was stored, and ``decide`` under
today's code takes the decisions the worker took then.

Each ``histories/*.json`` is a finished run as it was stored (see ``replay.py``; recorded with
``python -m tests.replay.record``). Two were written before snapshot schema 2 existed: their
stored snapshots are schema 1 and are upcast on read. One was also decided by an earlier build
of its workflow under the same pinned version; where today's ``decide`` differs, the file
declares exactly how and why, and the replay demands exactly that difference and no other.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from longrun.domain import (
    SNAPSHOT_SCHEMA_VERSION,
    RunSnapshot,
    event_from_dict,
    event_to_dict,
    evolve,
    fold,
    is_late,
    to_plain,
)
from longrun.domain import events as ev
from tests.replay.replay import History, as_decided_today, derive, kinds, mismatch, replayed

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
KINDS = kinds()


def _load(path: Path) -> History:
    data = json.loads(path.read_text())
    return History(data["name"], data)


@pytest.fixture(params=HISTORIES, ids=lambda p: p.stem)
def history(request: pytest.FixtureRequest) -> History:
    return _load(request.param)


def test_there_are_histories_of_both_workloads_and_of_an_older_schema() -> None:
    loaded = [_load(p) for p in HISTORIES]
    assert {h.data["kind"] for h in loaded} >= {"steps", "dependency_upgrade"}
    versions = {h.data["snapshot_schema_version"] for h in loaded}
    assert 1 in versions, "keep a history whose stored snapshot is schema 1"
    if SNAPSHOT_SCHEMA_VERSION > 1:
        assert min(versions) < SNAPSHOT_SCHEMA_VERSION


def test_the_history_folds_into_the_snapshot_it_stored(history: History) -> None:
    # The stored snapshot is read the way the runtime reads it (an older schema is upcast).
    stored = history.snapshot
    assert fold(history.events) == stored
    assert stored.to_dict()["schema_version"] == SNAPSHOT_SCHEMA_VERSION
    # What was stored as late is exactly what the rules call late.
    state: RunSnapshot | None = None
    for event, applied in zip(history.events, history.applied, strict=True):
        assert applied is not is_late(state, event), f"seq {event.seq}: applied={applied}"
        state = evolve(state, event)


def test_an_older_snapshot_is_upcast_to_the_current_schema(history: History) -> None:
    recorded = history.data["snapshot"]
    if recorded["schema_version"] == SNAPSHOT_SCHEMA_VERSION:
        pytest.skip("recorded under the current schema")
    assert recorded["schema_version"] < SNAPSHOT_SCHEMA_VERSION
    upcast = RunSnapshot.from_dict(recorded)
    # Everything the older schema knew is kept; what it did not know takes its default. The one field
    # reshaped, ``permissions`` (schema 5: a list nothing ever set became the run's scope), is None.
    as_now = upcast.to_dict()
    unset = recorded["permissions"] == []
    reshaped = ("schema_version", "permissions") if unset else ("schema_version",)
    assert {k: v for k, v in as_now.items() if k in recorded and k not in reshaped} == {
        k: v for k, v in recorded.items() if k not in reshaped}
    if unset:
        assert as_now["permissions"] is None


def test_the_recorded_decisions_are_where_the_worker_decided_and_what_followed(history: History) -> None:
    events = history.events
    recorded = history.points
    # The decision points derived today are the recorded ones (none lost, none invented)...
    assert [(p.after_seq, p.now) for p in derive(KINDS, events)] == [(p.after_seq, p.now) for p in recorded]
    # ...and each recorded decision is what the history did next.
    assert [m for m in (mismatch(KINDS, events, p) for p in recorded) if m] == []


def test_decide_today_takes_the_recorded_decisions(history: History) -> None:
    declared = history.known_divergences
    for point, today in zip(history.points, replayed(KINDS, history), strict=True):
        then = as_decided_today(point.decision)
        differing = {k: {"recorded": then.get(k), "today": today.get(k)}
                     for k in sorted(then.keys() | today.keys()) if then.get(k) != today.get(k)}
        expected = declared.get(point.after_seq, {}).get("fields", {})
        assert differing == expected, (
            f"{history.name}: after seq {point.after_seq} the recorded decision was\n  {then}\n"
            f"today's decide returns\n  {today}")


def test_an_older_event_form_without_defaulted_fields_decodes_to_the_same_event(history: History) -> None:
    """Fields added later with a default are absent from events written before them: such events
    decode to what they meant (e.g. ``run.created`` without ``stage``, ``permissions``, ``deadline``)."""
    for event in history.events:
        defaults = {f.name: f.default for f in dataclasses.fields(event)
                    if f.default is not dataclasses.MISSING}
        data: dict[str, Any] = event_to_dict(event)
        older = {k: v for k, v in data.items() if not (k in defaults and v == to_plain(defaults[k]))}
        assert event_from_dict(older) == event


def test_the_replay_notices_a_decision_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: a workflow that decides differently at one point fails the replay."""
    history = _load(next(p for p in HISTORIES if "denied" in p.stem))
    workflow = KINDS.get("dependency_upgrade", "1").workflow
    original = workflow.decide

    def louder(state: RunSnapshot, ctx: Any) -> Any:
        decision = original(state, ctx)
        if type(decision).__name__ == "Fail":
            return dataclasses.replace(decision, reason=decision.reason.upper())
        return decision

    monkeypatch.setattr(workflow, "decide", louder)
    today = replayed(KINDS, history)
    assert [d["type"] for d in today] == [p.decision["type"] for p in history.points]
    changed = [p.after_seq for p, d in zip(history.points, today, strict=True)
               if d != as_decided_today(p.decision)]
    assert changed == [history.points[-1].after_seq]
    assert isinstance(history.events[-1], ev.RunStatusChanged)
