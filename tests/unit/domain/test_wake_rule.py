"""The wake rule a writer reads from a run's columns (``timer_wake``, what the timer's bulk wake decides
by) against ``evolve``, on every shape a timer's wake meets: waiting with and without a timer, paused,
running, finished; the wait its own or another; a TIMER or a DEADLINE wake."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from longrun.domain import (
    RunPaused,
    RunSnapshot,
    RunStatus,
    RunTerminated,
    RunWoken,
    ScheduleRetry,
    WaitForEvent,
    WaitForUser,
    WakeReason,
    evolve,
    is_late,
    timer_wake,
)
from longrun.errors import DomainError

from .support import History
from .test_evolve import PR_HASH, running, wait

S = RunStatus


def _retrying(h: History) -> None:
    wait(h, ScheduleRetry(logical_action="pr", delay=30.0))


def _on_ci(h: History) -> None:
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/1", deadline=h.now + 60))


def _on_approval(h: History) -> None:
    wait(h, WaitForUser(approval_id="ap-1", owner="user_42", deadline=h.now + 600, approved_hash=PR_HASH,
                        summary="create the PR"))


def _paused_on_ci(h: History) -> None:
    _on_ci(h)
    h.apply(RunPaused, by="ops", reason="hold")


def _terminated_on_ci(h: History) -> None:
    _on_ci(h)
    h.apply(RunTerminated, by="ops", reason="runaway")


def _running(h: History) -> None:
    pass


def _ready(h: History) -> None:
    _retrying(h)
    h.apply(RunWoken, wait_id="w-1", reason=WakeReason.TIMER)


SHAPES: dict[str, Callable[[History], None]] = {
    "retrying": _retrying, "on-ci": _on_ci, "on-approval": _on_approval, "paused-on-ci": _paused_on_ci,
    "terminated-on-ci": _terminated_on_ci, "running": _running, "ready-after-a-wake": _ready}


def _what_evolve_does(before: RunSnapshot, wake: RunWoken) -> bool | None:
    """True: the run is READY after the wake; False: the wake is late; None: anything else (refused, or
    a paused run's wake, which readies what it resumes to)."""
    if is_late(before, wake):
        return False
    try:
        after = evolve(before, wake)
    except DomainError:
        return None
    return True if after.status is S.READY else None


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("wait_id", ["w-1", "w-other"])
@pytest.mark.parametrize("reason", [WakeReason.TIMER, WakeReason.DEADLINE])
def test_the_wake_rule_from_a_runs_columns_is_what_evolve_does(shape: str, wait_id: str,
                                                               reason: WakeReason) -> None:
    h = running()
    SHAPES[shape](h)
    before = h.snapshot
    wake = h.event(RunWoken, wait_id=wait_id, reason=reason)
    pending = None if before.wait is None else before.wait.wait_id
    has_timer = before.wait is not None and before.wait.wake_at is not None
    verdict = timer_wake(before.status, pending, has_timer, wait_id, reason)
    assert verdict == _what_evolve_does(before, wake)


def test_every_shape_meets_each_verdict() -> None:
    seen = set()
    for shape in SHAPES.values():
        h = running()
        shape(h)
        s = h.snapshot
        for wait_id in ("w-1", "w-other"):
            for reason in (WakeReason.TIMER, WakeReason.DEADLINE):
                has_timer = s.wait is not None and s.wait.wake_at is not None
                seen.add(timer_wake(s.status, None if s.wait is None else s.wait.wait_id, has_timer, wait_id, reason))
    assert seen == {True, False, None}
