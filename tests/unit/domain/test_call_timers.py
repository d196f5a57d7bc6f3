"""A tool call's durable timers, decided purely: which timers watch a call, which a transition
cancels, and what a firing timer does to the run by effect kind."""

from __future__ import annotations

import random

import pytest

from longrun.domain import ActionStatus, EffectKind, RetryPolicy, RunStatus, calls, closure
from longrun.domain import events as ev
from tests.unit.domain.support import History

POLICY = RetryPolicy(initial_interval=10, maximum_interval=10, maximum_attempts=2, jitter=0)


def _calling(effect: EffectKind) -> History:
    history = History()
    history.apply(ev.RunStatusChanged, to=RunStatus.RUNNING, reason="taken")
    history.apply(ev.ActionPrepared, logical_action="work", tool="t.work", tool_version="1", effect_kind=effect,
                  idempotency_key="k-work", request_hash="h")
    history.apply(ev.ActionSubmitted, logical_action="work")
    return history


def _abandon(history: History, kind: str = calls.START_TO_CLOSE, *, token: int = 3, lease: int | None = 3,
             policy: RetryPolicy = POLICY) -> calls.Abandoned | None:
    return calls.abandon(history.snapshot, kind=kind, payload={"fencing_token": token, "logical_action": "work",
                                                                "limit": 6.0},
                         lease_token=lease, seq=100, at=50.0, policy=policy, rng=random.Random(0),
                         new_id=lambda: "retry-1")


def test_a_call_is_watched_by_start_to_close_and_by_heartbeat_only_when_declared() -> None:
    only = calls.call_timers("run-1", "work", token=3, start_to_close=6.0, heartbeat_timeout=None)
    both = calls.call_timers("run-1", "work", token=3, start_to_close=60.0, heartbeat_timeout=2.0)
    assert [(t["kind"], t["delay"]) for t in only] == [("start_to_close", 7.0)]
    assert [(t["kind"], t["delay"]) for t in both] == [("start_to_close", 66.0), ("heartbeat", 3.0)]
    assert both[1]["timer_key"] == "run-1:work:3:heartbeat"
    assert both[1]["payload"] == {"fencing_token": 3, "logical_action": "work", "limit": 2.0}


def test_an_answer_cancels_its_call_s_timers_and_a_resubmission_cancels_none() -> None:
    history = _calling(EffectKind.IDEMPOTENT_WRITE)
    submitted = history.snapshot
    unavailable = history.apply(ev.ActionUnavailable, logical_action="work", cause="503")
    assert closure.timers_to_cancel(submitted, unavailable) == closure.Cancel(None, ("work",))
    assert not closure.Cancel(None, ("work",)).everything
    again = history.apply(ev.ActionSubmitted, logical_action="work")
    assert closure.timers_to_cancel(unavailable, again) is None
    answered = history.apply(ev.ActionConfirmed, logical_action="work")
    assert closure.timers_to_cancel(again, answered) == closure.Cancel(None, ("work",))


@pytest.mark.parametrize("effect", [EffectKind.IDEMPOTENT_WRITE, EffectKind.NON_IDEMPOTENT_WRITE])
def test_a_write_given_up_on_is_unknown_and_parks_for_the_reconciler(effect: EffectKind) -> None:
    abandoned = _abandon(_calling(effect), calls.HEARTBEAT)
    assert abandoned is not None and abandoned.status is ActionStatus.UNKNOWN
    unknown, parked = abandoned.events
    assert isinstance(unknown, ev.ActionUnknown) and unknown.cause == "heartbeat: no heartbeat within 6s (lease 3)"
    assert isinstance(parked, ev.RunStatusChanged) and parked.to is RunStatus.ACTION_UNKNOWN
    assert parked.reason.startswith("work: outcome unknown (heartbeat:") and (unknown.seq, parked.seq) == (100, 101)


def test_a_read_given_up_on_is_retried_under_its_policy_then_fails_once_attempts_are_used() -> None:
    history = _calling(EffectKind.READ)
    abandoned = _abandon(history)
    assert abandoned is not None and abandoned.status is ActionStatus.RETRYABLE
    unavailable, waiting = abandoned.events
    assert isinstance(unavailable, ev.ActionUnavailable) and unavailable.cause.startswith("start_to_close:")
    assert isinstance(waiting, ev.WaitStarted) and waiting.status is RunStatus.RETRY_SCHEDULED
    assert waiting.wait.wake_at == 60.0 and waiting.wait.wait_id == "retry-1"
    # a second attempt given up on uses the policy's last attempt: FAILED, and decide runs again
    history.apply(ev.ActionUnavailable, logical_action="work", cause="x")
    history.apply(ev.ActionSubmitted, logical_action="work")
    last = _abandon(history)
    assert last is not None and last.status is ActionStatus.FAILED
    failed, ready = last.events
    assert isinstance(failed, ev.ActionFailed) and failed.error.startswith("retries exhausted after 2 attempts")
    assert isinstance(ready, ev.RunStatusChanged) and ready.to is RunStatus.READY
    # and a policy that does not retry timeouts fails it at once
    refused = _abandon(_calling(EffectKind.PURE), policy=RetryPolicy(non_retryable_error_types=("TimeoutError",)))
    assert refused is not None and refused.status is ActionStatus.FAILED
    assert refused.error.startswith("CallTimedOut is not retried: start_to_close")


def test_a_timer_whose_attempt_is_over_does_nothing() -> None:
    history = _calling(EffectKind.IDEMPOTENT_WRITE)
    assert _abandon(history, lease=4) is None  # another worker took the run
    assert _abandon(history, lease=None) is None  # the lease was released
    history.apply(ev.ActionConfirmed, logical_action="work")
    assert _abandon(history) is None  # the call answered
    paused = _calling(EffectKind.READ)
    paused.apply(ev.RunPaused, by="ops", reason="operator")
    assert _abandon(paused) is None
