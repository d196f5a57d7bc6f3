"""Run-level timeouts: the per-run limits, the queue stint, and the business deadline's cancel protocol."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longrun.domain import (
    ActionPrepared,
    ActionSubmitted,
    ActionUnknown,
    CancelRequested,
    DeadlinePassed,
    EffectKind,
    RunPaused,
    RunStatus,
    RunStatusChanged,
    RunTimeouts,
    RunWoken,
    Wait,
    WaitStarted,
    WakeReason,
    cancel_end,
    effective_start_to_close,
    on_business_deadline,
    queue_stint_starts,
)
from longrun.domain.timeouts import DEADLINE_REASON, resolve
from longrun.errors import EventRejected, IllegalTransition

from .support import History

S = RunStatus
CAPPED = RunTimeouts(schedule_to_start=60.0, start_to_close=30.0)


def test_a_run_cap_shortens_a_tool_call_and_never_lengthens_it() -> None:
    run = History(timeouts=CAPPED).snapshot
    assert effective_start_to_close(120.0, run) == 30.0
    assert effective_start_to_close(10.0, run) == 10.0  # a producer's longer cap does not lengthen the tool's
    assert effective_start_to_close(45.0, History().snapshot) == 45.0  # no cap: the tool's own
    with pytest.raises(ValueError, match="tool_seconds"):
        effective_start_to_close(0.0, run)


@given(tool=st.floats(0.001, 1e6), cap=st.none() | st.floats(0.001, 1e6))
def test_the_effective_limit_is_never_above_the_tools_nor_the_runs(tool: float, cap: float | None) -> None:
    run = History(timeouts=RunTimeouts(start_to_close=cap)).snapshot
    limit = effective_start_to_close(tool, run)
    assert limit <= tool and (cap is None or limit <= cap) and limit in (tool, cap)


def test_the_producers_timeouts_win_and_the_kinds_fill_in() -> None:
    kind = RunTimeouts(schedule_to_start=300.0, start_to_close=60.0)
    assert resolve(None, kind) == kind
    assert resolve(RunTimeouts(start_to_close=5.0), kind) == RunTimeouts(schedule_to_start=300.0, start_to_close=5.0)
    assert resolve(RunTimeouts(schedule_to_start=1.0), RunTimeouts()) == RunTimeouts(schedule_to_start=1.0)


@pytest.mark.parametrize("bad", [0, -1.0, True])
def test_a_timeout_is_positive_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="RunTimeouts.schedule_to_start must be a positive number"):
        RunTimeouts(schedule_to_start=bad)  # type: ignore[arg-type]


def test_a_queue_stint_starts_when_a_run_with_the_setting_becomes_ready() -> None:
    h = History(timeouts=CAPPED)
    created = h.snapshot
    assert queue_stint_starts(None, created)  # queued at creation
    running = h.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    assert not queue_stint_starts(created, running)
    waiting = h.apply(WaitStarted, status=S.WAITING_EVENT,
                      wait=Wait(wait_id="w", kind="ci", deadline=100.0, correlation_key="ci/1"))
    woken = h.apply(RunWoken, wait_id="w", reason=WakeReason.EVENT, correlation_key="ci/1")
    assert queue_stint_starts(waiting, woken)  # woken: queued again, a new stint
    assert not queue_stint_starts(woken, woken.replace(revision=woken.revision + 1))  # still the same stint
    without = History().snapshot
    assert not queue_stint_starts(None, without)  # no setting: nothing to time


def _with_submitted_write(h: History) -> None:
    h.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    h.apply(ActionPrepared, logical_action="pr", tool="forge.open_pr", tool_version="1",
            effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, idempotency_key="k-pr", request_hash="h")
    h.apply(ActionSubmitted, logical_action="pr")


def test_the_deadline_sends_an_open_run_cancelling_for_it_and_it_ends_timed_out() -> None:
    h = History(deadline=50.0)
    _with_submitted_write(h)
    assert on_business_deadline(h.snapshot).cancel
    cancelling = h.apply(DeadlinePassed, reason=DEADLINE_REASON)
    assert cancelling.status is S.CANCELLING and cancelling.cancel_requested and cancelling.deadline_passed
    assert cancel_end(cancelling) == (S.TIMED_OUT, f"{DEADLINE_REASON}; every action settled")
    # the submitted call is settled first: nothing ends while it is in doubt
    h.apply(ActionUnknown, logical_action="pr", cause="cancelled while submitted")
    with pytest.raises(EventRejected, match="in doubt: pr"):
        h.apply(RunStatusChanged, to=S.TIMED_OUT, reason=cancel_end(h.snapshot)[1])


def test_a_run_cancelling_for_its_deadline_cannot_end_cancelled_nor_be_cancelled_again() -> None:
    h = History(deadline=50.0)
    h.apply(DeadlinePassed, reason=DEADLINE_REASON)
    with pytest.raises(IllegalTransition, match="CANCELLING -> CANCELLED: the run is cancelling for its business "
                                                "deadline: it ends TIMED_OUT"):
        h.apply(RunStatusChanged, to=S.CANCELLED, reason="cancelled")
    with pytest.raises(IllegalTransition, match="CANCELLING -> CANCELLING: the run is already cancelling for its "
                                                "business deadline"):
        h.apply(CancelRequested, by="ops", reason="stop it")
    ended = h.apply(RunStatusChanged, to=S.TIMED_OUT, reason=cancel_end(h.snapshot)[1])
    assert ended.status is S.TIMED_OUT and ended.terminal_reason.startswith("business_deadline:")


def test_an_operators_cancel_ends_cancelled_and_the_deadline_leaves_it_so() -> None:
    h = History(deadline=50.0)
    h.apply(CancelRequested, by="ops", reason="not needed")
    assert not on_business_deadline(h.snapshot).cancel
    with pytest.raises(EventRejected, match="already cancelling"):
        h.apply(DeadlinePassed, reason=DEADLINE_REASON)
    with pytest.raises(IllegalTransition, match="CANCELLING -> TIMED_OUT"):
        h.apply(RunStatusChanged, to=S.TIMED_OUT, reason="timed out")
    assert cancel_end(h.snapshot)[0] is S.CANCELLED


def test_the_deadline_lifts_a_pause_and_leaves_a_finished_run_alone() -> None:
    h = History(deadline=50.0)
    h.apply(RunPaused, by="ops", reason="hold")
    assert h.apply(DeadlinePassed, reason=DEADLINE_REASON).status is S.CANCELLING
    done = History()
    done.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    done.apply(RunStatusChanged, to=S.FAILED, reason="gave up")
    verdict = on_business_deadline(done.snapshot)
    assert not verdict.cancel and verdict.why == "the run is FAILED"
    with pytest.raises(IllegalTransition, match="FAILED -> CANCELLING"):
        done.apply(DeadlinePassed, reason=DEADLINE_REASON)
    with pytest.raises(ValueError, match="only a CANCELLING run"):
        cancel_end(done.snapshot)
