"""Patch points in the domain: ``ctx.patched`` answers, ``run.patch_taken`` folds, snapshots keep them."""

from __future__ import annotations

import json

import pytest

from longrun.domain import (
    DecisionContext,
    PatchTaken,
    RunSnapshot,
    RunStatus,
    RunStatusChanged,
    event_from_dict,
    event_to_dict,
    fold,
    violations,
)
from longrun.errors import EventRejected, IllegalTransition

from .support import VERSIONS, History

PATCH = "fix-ci-retry"


def running() -> History:
    h = History()
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    return h


def context(patches: frozenset[str] | None = None) -> DecisionContext:
    return DecisionContext(now=0.0, new_id=lambda: "id", rng=None, patches=patches)  # type: ignore[arg-type]


def test_live_every_patch_is_taken_and_reported_once_in_the_order_asked() -> None:
    ctx = context()
    assert [ctx.patched(PATCH), ctx.patched("other"), ctx.patched(PATCH)] == [True, True, True]
    assert ctx.taken == [PATCH, "other"]


def test_replaying_only_the_patches_the_history_took_are_taken() -> None:
    before_the_patch, after_it = context(frozenset()), context(frozenset({PATCH}))
    assert not before_the_patch.patched(PATCH) and before_the_patch.taken == []
    assert after_it.patched(PATCH) and not after_it.patched("other") and after_it.taken == [PATCH]


def test_a_patch_taken_folds_into_the_snapshot_in_order() -> None:
    h = running()
    h.apply(PatchTaken, patch=PATCH, workflow_version=VERSIONS.workflow)
    h.apply(PatchTaken, patch="other", workflow_version=VERSIONS.workflow)
    assert h.snapshot.patches == (PATCH, "other")
    assert h.snapshot.revision == 4 and violations(h.snapshot) == ()
    assert fold(h.events) == h.snapshot


def test_a_patch_is_taken_once() -> None:
    h = running()
    h.apply(PatchTaken, patch=PATCH, workflow_version="1")
    with pytest.raises(EventRejected, match="duplicate patch"):
        h.apply(PatchTaken, patch=PATCH, workflow_version="1")


def test_only_a_worker_deciding_takes_a_patch() -> None:
    with pytest.raises(EventRejected, match="only a worker's decision takes a patch"):
        History().apply(PatchTaken, patch=PATCH, workflow_version="1")  # READY: nobody is deciding
    h = running()
    h.apply(RunStatusChanged, to=RunStatus.FAILED, reason="gave up")
    with pytest.raises(IllegalTransition):
        h.apply(PatchTaken, patch=PATCH, workflow_version="1")


def test_the_event_and_a_snapshot_with_patches_round_trip_through_json() -> None:
    h = running()
    event = h.event(PatchTaken, patch=PATCH, workflow_version="1")
    plain = json.loads(json.dumps(event_to_dict(event)))
    assert plain == {"type": "run.patch_taken", "seq": 3, "at": 3.0, "patch": PATCH, "workflow_version": "1"}
    assert event_from_dict(plain) == event
    h.apply(PatchTaken, patch=PATCH, workflow_version="1")
    stored = json.loads(json.dumps(h.snapshot.to_dict()))
    assert stored["patches"] == [PATCH]
    assert RunSnapshot.from_dict(stored) == h.snapshot


def test_a_snapshot_stored_before_patches_existed_loads_with_none_taken() -> None:
    h = running()
    # as schema 3 stored it: no patches, and the permissions list nothing ever set
    schema_3 = {k: v for k, v in h.snapshot.to_dict().items()
                if k not in ("patches", "timeouts", "deadline_passed", "failure")} | {
        "schema_version": 3, "permissions": []}
    loaded = RunSnapshot.from_dict(schema_3)
    assert loaded.patches == ()
    assert loaded == h.snapshot.replace(permissions=None)
