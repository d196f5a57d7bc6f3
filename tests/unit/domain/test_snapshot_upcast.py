"""Snapshot schemas 1 -> 2 -> ... -> 9 -> 10: pure upcasters pinned by golden files, applied on every read.

``golden/snapshot.v1.json`` is the snapshot the schema-1 code stored for a run waiting for
approval (recorded from a real run, see ``tests/fault/fixtures``); ``snapshot.v1-as-v2.json``
is what it must become under schema 2 (``snapshot.v2.json`` is that same file),
``snapshot.v2-as-v3.json`` under schema 3 (``snapshot.v3.json``), ``snapshot.v3-as-v4.json``
under schema 4 (``snapshot.v4.json``), ``snapshot.v4-as-v5.json`` under schema 5
(``snapshot.v5.json``), ``snapshot.v5-as-v6.json`` under schema 6 (``snapshot.v6.json``) and
``snapshot.v6-as-v7.json`` under schema 7, ``snapshot.v7-as-v8.json`` under schema 8 (``snapshot.v8.json``)
, ``snapshot.v8-as-v9.json`` under schema 9 (``snapshot.v9.json``) and ``snapshot.v9-as-v10.json``
under schema 10. The fault matrix resumes that very run under this code.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from longrun.domain import (
    SNAPSHOT_SCHEMA_VERSION,
    SNAPSHOT_UPCASTERS,
    FrozenMap,
    RunSnapshot,
    RunStatus,
    RunTimeouts,
    event_from_dict,
    fold,
    upcast_snapshot_v1_v2,
    upcast_snapshot_v2_v3,
    upcast_snapshot_v3_v4,
    upcast_snapshot_v4_v5,
    upcast_snapshot_v5_v6,
    upcast_snapshot_v6_v7,
    upcast_snapshot_v7_v8,
    upcast_snapshot_v8_v9,
    upcast_snapshot_v9_v10,
)
from longrun.errors import UnknownSchemaVersion

GOLDEN = Path(__file__).parent.parent / "golden"
RECORDED_RUN = Path(__file__).parents[2] / "fault" / "fixtures" / "run_waiting_for_approval.snapshot-v1.json"


def _golden(name: str) -> dict[str, object]:
    return json.loads((GOLDEN / name).read_text())


def test_a_schema_1_snapshot_upcasts_to_schema_2_exactly_as_recorded() -> None:
    assert upcast_snapshot_v1_v2(_golden("snapshot.v1.json")) == _golden("snapshot.v1-as-v2.json")


def test_a_schema_2_snapshot_upcasts_to_schema_3_exactly_as_recorded() -> None:
    assert _golden("snapshot.v2.json") == _golden("snapshot.v1-as-v2.json")
    assert upcast_snapshot_v2_v3(_golden("snapshot.v2.json")) == _golden("snapshot.v2-as-v3.json")


def test_a_schema_3_snapshot_upcasts_to_schema_4_exactly_as_recorded() -> None:
    assert _golden("snapshot.v3.json") == _golden("snapshot.v2-as-v3.json")
    assert upcast_snapshot_v3_v4(_golden("snapshot.v3.json")) == _golden("snapshot.v3-as-v4.json")


def test_a_schema_4_snapshot_upcasts_to_schema_5_exactly_as_recorded() -> None:
    assert _golden("snapshot.v4.json") == _golden("snapshot.v3-as-v4.json")
    assert upcast_snapshot_v4_v5(_golden("snapshot.v4.json")) == _golden("snapshot.v4-as-v5.json")


def test_a_schema_4_open_question_accepts_any_answer_and_its_wait_waits_on_no_question() -> None:
    older = _golden("snapshot.v4.json") | {"open_questions": [{"question_id": "q", "text": "which?"}]}
    upcast = upcast_snapshot_v4_v5(older)
    assert upcast["open_questions"] == [{"question_id": "q", "text": "which?", "answer_schema": {}}]
    assert upcast["wait"]["question_id"] is None  # type: ignore[index]
    assert upcast_snapshot_v4_v5(older | {"wait": None})["wait"] is None


def test_a_schema_5_snapshot_upcasts_to_schema_6_exactly_as_recorded() -> None:
    assert _golden("snapshot.v5.json") == _golden("snapshot.v4-as-v5.json")
    assert upcast_snapshot_v5_v6(_golden("snapshot.v5.json")) == _golden("snapshot.v5-as-v6.json")


def test_a_schema_6_snapshot_upcasts_to_schema_7_exactly_as_recorded() -> None:
    assert _golden("snapshot.v6.json") == _golden("snapshot.v5-as-v6.json")
    assert upcast_snapshot_v6_v7(_golden("snapshot.v6.json")) == _golden("snapshot.v6-as-v7.json")


def test_a_schema_7_wait_upcasts_to_one_no_webhook_ends_unless_the_migration_named_its_provider() -> None:
    older = _golden("snapshot.v7.json")
    assert upcast_snapshot_v7_v8(older) == _golden("snapshot.v7-as-v8.json")
    assert upcast_snapshot_v7_v8(older | {"wait": None})["wait"] is None
    migrated = older | {"wait": {**older["wait"], "provider": "forge"}}  # type: ignore[dict-item]
    assert upcast_snapshot_v7_v8(migrated)["wait"]["provider"] == "forge"  # type: ignore[index]


def test_a_schema_8_snapshot_upcasts_to_schema_9_with_no_failed_step_on_record() -> None:
    assert _golden("snapshot.v8.json") == _golden("snapshot.v7-as-v8.json")
    assert upcast_snapshot_v8_v9(_golden("snapshot.v8.json")) == _golden("snapshot.v8-as-v9.json")


def test_a_schema_9_snapshot_upcasts_to_schema_10_with_no_reminders_escalation_or_validity() -> None:
    assert _golden("snapshot.v9.json") == _golden("snapshot.v8-as-v9.json")
    assert upcast_snapshot_v9_v10(_golden("snapshot.v9.json")) == _golden("snapshot.v9-as-v10.json")
    assert upcast_snapshot_v9_v10(_golden("snapshot.v9.json") | {"wait": None})["wait"] is None
    with pytest.raises(ValueError):
        upcast_snapshot_v9_v10(_golden("snapshot.v8.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v9_v10(_golden("snapshot.v9-as-v10.json") | {"schema_version": 9})


@pytest.mark.parametrize(("upcaster", "golden"), [(upcast_snapshot_v1_v2, "snapshot.v1.json"),
                                                   (upcast_snapshot_v2_v3, "snapshot.v2.json"),
                                                   (upcast_snapshot_v3_v4, "snapshot.v3.json"),
                                                   (upcast_snapshot_v4_v5, "snapshot.v4.json"),
                                                   (upcast_snapshot_v5_v6, "snapshot.v5.json"),
                                                   (upcast_snapshot_v6_v7, "snapshot.v6.json"),
                                                   (upcast_snapshot_v7_v8, "snapshot.v6-as-v7.json"),
                                                   (upcast_snapshot_v8_v9, "snapshot.v8.json"),
                                                   (upcast_snapshot_v9_v10, "snapshot.v9.json")])
def test_the_upcasters_are_pure(upcaster, golden: str) -> None:  # type: ignore[no-untyped-def]
    older = _golden(golden)
    before = copy.deepcopy(older)
    first, second = upcaster(older), upcaster(older)
    assert older == before
    assert first == second and first is not second


def test_reading_a_schema_1_snapshot_gives_the_schema_10_run_and_writes_schema_10() -> None:
    run = RunSnapshot.from_dict(_golden("snapshot.v1.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v1-as-v2.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v2-as-v3.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v3-as-v4.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v4-as-v5.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v5-as-v6.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v6-as-v7.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v7-as-v8.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v8-as-v9.json"))
    assert run == RunSnapshot.from_dict(_golden("snapshot.v9-as-v10.json"))
    assert run.status is RunStatus.WAITING_USER and run.labels == FrozenMap() and run.correlation_id is None
    assert run.patches == () and run.open_questions == ()
    assert run.permissions is None  # created before scopes: not restricted
    assert run.timeouts == RunTimeouts() and not run.deadline_passed  # no limits; not cancelling for a deadline
    assert run.wait is not None and run.wait.approval_id is not None and run.wait.question_id is None
    assert run.wait.provider is None and run.failure is None
    assert run.wait.reminders == () and run.wait.escalate_to is None and run.wait.valid_for is None
    written = json.loads(json.dumps(run.to_dict()))
    assert written["schema_version"] == SNAPSHOT_SCHEMA_VERSION == 10
    assert written == _golden("snapshot.v9-as-v10.json")


def test_the_history_written_by_schema_1_folds_into_the_upcast_snapshot() -> None:
    # The snapshot stays a projection of its events across the upgrade.
    recorded = json.loads(RECORDED_RUN.read_text())
    history = [event_from_dict(row["data"]) for row in recorded["run_events"]]
    assert fold(history) == RunSnapshot.from_dict(recorded["runs"][0]["snapshot"])


@pytest.mark.parametrize("version", [0, 11, 99, None, "1", True])
def test_a_version_this_code_does_not_know_is_refused_not_guessed(version: object) -> None:
    with pytest.raises(UnknownSchemaVersion) as refused:
        RunSnapshot.from_dict(_golden("snapshot.v1.json") | {"schema_version": version})
    assert refused.value.known == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_the_upcaster_refuses_what_is_not_schema_1() -> None:
    with pytest.raises(ValueError):
        upcast_snapshot_v1_v2(_golden("snapshot.v1-as-v2.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v1_v2(_golden("snapshot.v1.json") | {"labels": {"team": "payments"}})
    with pytest.raises(ValueError):
        upcast_snapshot_v2_v3(_golden("snapshot.v1.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v2_v3(_golden("snapshot.v2.json") | {"correlation_id": "c"})
    with pytest.raises(ValueError):
        upcast_snapshot_v3_v4(_golden("snapshot.v2.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v3_v4(_golden("snapshot.v3.json") | {"patches": ["fix-ci-retry"]})
    with pytest.raises(ValueError):
        upcast_snapshot_v4_v5(_golden("snapshot.v3.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v4_v5(_golden("snapshot.v4.json") | {"wait": {"wait_id": "w", "question_id": "q"}})
    with pytest.raises(ValueError):
        upcast_snapshot_v5_v6(_golden("snapshot.v4.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v5_v6(_golden("snapshot.v5.json") | {"permissions": ["repo:payments"]})
    with pytest.raises(ValueError):
        upcast_snapshot_v6_v7(_golden("snapshot.v5.json"))
    with pytest.raises(ValueError):
        upcast_snapshot_v6_v7(_golden("snapshot.v6.json") | {"timeouts": {"schedule_to_start": 60}})


def test_every_older_schema_has_an_upcaster_and_a_golden_file() -> None:
    assert sorted(SNAPSHOT_UPCASTERS) == list(range(1, SNAPSHOT_SCHEMA_VERSION))
    for version in SNAPSHOT_UPCASTERS:
        assert (GOLDEN / f"snapshot.v{version}.json").exists()
