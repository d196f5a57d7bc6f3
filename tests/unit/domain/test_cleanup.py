"""Cleanup at closure's pure decisions: which ends owe a cleanup, its keys, when the far side is asked
first, its backoff (never given up) and how long a claim holds; and its record on a finished run."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from longrun.domain import ActionStatus, EffectKind, RetryPolicy, RunStatus, cleanup, evolve
from longrun.domain import events as ev
from longrun.errors import EventRejected
from longrun_client.timeline import describe
from tests.unit.domain.support import History

_S = RunStatus


def _open() -> History:
    history = History()
    history.apply(ev.RunStatusChanged, to=_S.RUNNING, reason="taken")
    return history


@pytest.mark.parametrize("status", sorted(cleanup.CLEANS_UP, key=lambda s: s.value))
def test_every_end_but_terminate_owes_a_cleanup(status: RunStatus) -> None:
    before = _open().snapshot
    assert cleanup.starts(before, before.replace(status=status))


def test_terminate_skips_cleanup_and_a_move_between_open_states_or_after_the_end_owes_none() -> None:
    before = _open().snapshot
    assert not cleanup.starts(before, before.replace(status=_S.TERMINATED))
    assert not cleanup.starts(before, before.replace(status=_S.WAITING_EVENT))
    ended = before.replace(status=_S.COMPLETED)
    assert not cleanup.starts(ended, ended.replace(revision=ended.revision + 1))


def test_a_non_idempotent_step_an_earlier_attempt_may_have_carried_out_is_looked_up_first() -> None:
    write = EffectKind.NON_IDEMPOTENT_WRITE
    assert cleanup.look_first(write, ActionStatus.SUBMITTED) and cleanup.look_first(write, ActionStatus.UNKNOWN)
    assert not cleanup.look_first(write, None)
    assert not cleanup.look_first(EffectKind.IDEMPOTENT_WRITE, ActionStatus.UNKNOWN)


def test_the_backoff_grows_to_its_cap_and_never_gives_up() -> None:
    policy = RetryPolicy(initial_interval=1.0, maximum_interval=8.0, maximum_attempts=3, jitter=0.0)
    delays = [cleanup.retry_in(policy, attempt, rng=random.Random(0)) for attempt in range(1, 8)]
    assert delays == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]  # past its attempts, its longest delay
    wide = RetryPolicy(initial_interval=1.0, maximum_interval=8.0, maximum_attempts=10, jitter=0.0)
    assert [cleanup.retry_in(wide, a, rng=random.Random(0)) for a in (1, 2, 3, 4, 5, 50)] == [1, 2, 4, 8, 8, 8]
    assert cleanup.retry_in(RetryPolicy(maximum_attempts=1, jitter=0.0), 3, rng=random.Random(0)) == 1.0


def test_a_claim_holds_past_every_step_looked_up_and_sent() -> None:
    assert cleanup.hold([30.0, 5.0]) == 70.0 + cleanup.HOLD_MARGIN


def test_a_cleanup_is_recorded_on_the_finished_run_only_and_changes_nothing_else() -> None:
    history = _open()
    with pytest.raises(EventRejected):
        history.apply(ev.CleanupRecorded, step="release", outcome=cleanup.DONE, attempt=1)
    history.apply(ev.RunStatusChanged, to=_S.FAILED, reason="gave up")
    ended = history.snapshot
    after = evolve(ended, ev.CleanupRecorded(seq=ended.last_seq + 1, at=9.0, step="release",
                                             outcome=cleanup.FAILED, attempt=1, error="503"))
    assert after == ended.replace(revision=ended.revision + 1, last_seq=ended.last_seq + 1)
    assert after.status is _S.FAILED


def test_the_timeline_tells_each_cleanup_attempt_in_a_line() -> None:
    at = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)
    failed = ev.event_to_dict(ev.CleanupRecorded(seq=9, at=8.0, step="release", outcome=cleanup.FAILED, attempt=1,
                                                 error="forge unavailable"))
    done = ev.event_to_dict(ev.CleanupRecorded(seq=10, at=9.0, step="release", outcome=cleanup.DONE, attempt=2,
                                               external_id="ws-1"))
    assert describe(9, "run.cleanup", failed, True, at).endswith(
        "CLEANUP   release        FAILED (attempt 1, retried): forge unavailable")
    assert describe(10, "run.cleanup", done, True, at).endswith("CLEANUP   release        done (attempt 2): ws-1")
