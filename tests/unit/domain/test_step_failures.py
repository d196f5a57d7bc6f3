"""A step whose run kind's code raised (``run.step_failed``): counted in the snapshot, parked on a retry
timer or with a person, and forgotten by the next step that writes anything."""

from __future__ import annotations

import pytest

from longrun.domain import (
    RunSnapshot,
    RunStatus,
    RunStatusChanged,
    RunWoken,
    ScheduleRetry,
    StepFailed,
    StepFailure,
    WaitForEvent,
    WakeReason,
    fold,
    wait_for,
)
from longrun.errors import DomainError

from .support import History
from .test_evolve import ctx, running, wait

S = RunStatus


def _fail(h: History, attempt: int, *, retry_in: float | None = 5.0, phase: str = "decide") -> RunSnapshot:
    retry = None
    if retry_in is not None:
        _, retry = wait_for(ScheduleRetry(logical_action=phase, delay=retry_in), ctx(h, f"retry-{attempt}"))
    return h.apply(StepFailed, phase=phase, error_type="KeyError", message="'steps'", attempt=attempt, retry=retry)


def _woken_and_taken(h: History) -> None:
    assert h.snapshot.wait is not None
    h.apply(RunWoken, wait_id=h.snapshot.wait.wait_id, reason=WakeReason.TIMER)
    h.apply(RunStatusChanged, to=S.RUNNING, reason="taken")


def test_a_failed_step_waits_on_its_retry_timer_with_the_error_on_record() -> None:
    h = running()
    decided_at = h.now
    after = _fail(h, 1)
    assert after.status is S.RETRY_SCHEDULED
    assert after.wait is not None and after.wait.wake_at == decided_at + 5.0
    assert after.failure == StepFailure("decide", "KeyError", "'steps'", 1, h.now)


def test_failures_in_a_row_count_up_and_the_last_gives_the_run_to_a_person() -> None:
    h = running()
    _fail(h, 1)
    _woken_and_taken(h)
    _fail(h, 2)
    _woken_and_taken(h)
    given_up = _fail(h, 3, retry_in=None, phase="accept")
    assert given_up.status is S.NEEDS_ATTENTION and given_up.wait is None
    assert given_up.failure is not None and (given_up.failure.attempt, given_up.failure.phase) == (3, "accept")
    assert fold(h.events) == given_up


def test_a_count_that_does_not_follow_the_one_on_record_is_refused() -> None:
    h = running()
    _fail(h, 1)
    _woken_and_taken(h)
    for wrong in (1, 3):
        with pytest.raises(DomainError, match=f"attempt {wrong} does not follow the 1"):
            _fail(h, wrong)


def test_only_a_workers_step_fails() -> None:
    h = History()
    with pytest.raises(DomainError, match="only a worker's step fails; the run is READY"):
        _fail(h, 1)


def test_the_next_step_written_resets_the_count_and_neither_the_wake_nor_the_take_does() -> None:
    h = running()
    _fail(h, 1)
    h.apply(RunWoken, wait_id="retry-1", reason=WakeReason.TIMER)
    assert h.snapshot.failure is not None  # woken: the step has not run yet
    h.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    assert h.snapshot.failure is not None  # taken: decide has not answered yet
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/1", deadline=h.now + 60))
    assert h.snapshot.failure is None
    assert fold(h.events).failure is None


def test_an_operators_retry_of_a_run_given_up_starts_a_new_count() -> None:
    h = running()
    _fail(h, 1, retry_in=None)
    h.apply(RunStatusChanged, to=S.READY, reason="retried by alice")
    assert h.snapshot.failure is None and h.snapshot.status is S.READY
    h.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    assert _fail(h, 1).failure is not None
