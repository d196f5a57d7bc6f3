"""Tool-call timeouts kept by the timer service: which durable timers watch a call, and what one
does when it fires. Pure.

Responsibility: a call that is on record before it runs (its ``action.submitted`` committed first:
every write, and a pure or read call that declares ``heartbeat_timeout``) is watched by timers
scheduled in that commit's statement: ``start_to_close``, due ``grace`` after the call's limit, and,
if the tool declares one, ``heartbeat``, due ``grace`` after ``heartbeat_timeout`` from the last
recorded heartbeat (each recorded heartbeat moves it). The outcome's commit cancels both
(``closure.timers_to_cancel``). A live worker's own watch acts at the limit itself; the grace lets
it go first, so the timers act only for a worker that cannot (it died, froze, or its call ignores
cancellation).

Invariants:
- A timer fires for the attempt it names: the run still RUNNING under the payload's fencing token
  and the action still SUBMITTED; anything else means the attempt ended another way (``abandon``
  returns None and the timer is skipped).
- The effect follows the effect kind, as in the worker: a write's outcome is UNKNOWN and the run
  parks for the reconciler; a pure or read call is RETRYABLE and retried under its retry policy
  (a durable wait; the next attempt is charged), or FAILED once the policy says no more.
- Every event's cause or reason starts with the timer kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from longrun.domain import events as ev
from longrun.domain.action import ActionStatus, EffectKind
from longrun.domain.decisions import DecisionContext, ScheduleRetry, wait_for
from longrun.domain.retry import RetryPolicy, Rng, next_delay, retryable
from longrun.domain.run import RunStatus
from longrun.domain.snapshot import RunSnapshot
from longrun.errors import CallTimedOut

START_TO_CLOSE = "start_to_close"
HEARTBEAT = "heartbeat"
CALL_TIMERS = (START_TO_CLOSE, HEARTBEAT)
ANSWERED_ON_RETRY = frozenset({EffectKind.PURE, EffectKind.READ})
"""Effect kinds a call's lost answer is asked again for (asking again changes nothing)."""
TIMED_OUT_TYPES = tuple(cls.__name__ for cls in CallTimedOut.__mro__)
"""What a retry policy's ``non_retryable_error_types`` is matched against for a timed-out call."""


def grace(seconds: float) -> float:
    """How long past a call's limit its durable timer waits: a tenth of the limit, at least a second."""
    return max(1.0, seconds / 10)


def call_timer_key(run_id: str, logical_action: str, token: int, kind: str) -> str:
    """One timer per kind per attempt (the attempt's fencing token); the key ends with the kind."""
    return f"{run_id}:{logical_action}:{token}:{kind}"


def call_timers(run_id: str, logical_action: str, *, token: int, start_to_close: float,
                heartbeat_timeout: float | None) -> tuple[dict[str, Any], ...]:
    """The timers a call on record before it runs is watched by: key, kind, delay (from the commit,
    by the database's clock) and payload (the attempt's fencing token, the logical action, the limit)."""
    limits = [(START_TO_CLOSE, start_to_close)]
    if heartbeat_timeout is not None:
        limits.append((HEARTBEAT, heartbeat_timeout))
    return tuple({"timer_key": call_timer_key(run_id, logical_action, token, kind), "kind": kind,
                  "delay": limit + grace(limit),
                  "payload": {"fencing_token": token, "logical_action": logical_action, "limit": limit}}
                 for kind, limit in limits)


@dataclass(frozen=True, slots=True)
class Abandoned:
    """An attempt a call timer gave up on: the run's events, and the ledger row's new status and error."""

    events: tuple[ev.RunEvent, ...]
    status: ActionStatus
    error: str


def abandon(run: RunSnapshot, *, kind: str, payload: Mapping[str, Any], lease_token: int | None, seq: int,
            at: float, policy: RetryPolicy, rng: Rng, new_id: Callable[[], str]) -> Abandoned | None:
    """What the call timer ``kind`` with ``payload`` does to ``run`` (whose lease, if held, is under
    ``lease_token``); None when the attempt it names is over (the timer is skipped). Events from ``seq``."""
    name, token, limit = payload.get("logical_action"), payload.get("fencing_token"), payload.get("limit")
    record = run.action(name) if isinstance(name, str) else None
    if (run.status is not RunStatus.RUNNING or lease_token is None or lease_token != token or record is None
            or record.status is not ActionStatus.SUBMITTED or not isinstance(limit, int | float)):
        return None
    cause = f"{CallTimedOut(kind, float(limit))} (lease {token})"
    if record.effect_kind not in ANSWERED_ON_RETRY:
        return Abandoned((ev.ActionUnknown(seq=seq, at=at, logical_action=name, cause=cause),
                          ev.RunStatusChanged(seq=seq + 1, at=at, to=RunStatus.ACTION_UNKNOWN,
                                              reason=f"{name}: outcome unknown ({cause})")),
                         ActionStatus.UNKNOWN, cause)
    delay = next_delay(policy, record.attempts, rng=rng) if retryable(policy, TIMED_OUT_TYPES) else None
    if delay is None:
        failure = (f"retries exhausted after {record.attempts} attempts: {cause}" if retryable(policy, TIMED_OUT_TYPES)
                   else f"CallTimedOut is not retried: {cause}")
        return Abandoned((ev.ActionFailed(seq=seq, at=at, logical_action=name, error=failure),
                          ev.RunStatusChanged(seq=seq + 1, at=at, to=RunStatus.READY, reason=f"{kind}: {failure}")),
                         ActionStatus.FAILED, failure)
    _, wait = wait_for(ScheduleRetry(logical_action=name, delay=delay), DecisionContext(now=at, new_id=new_id, rng=rng))
    return Abandoned((ev.ActionUnavailable(seq=seq, at=at, logical_action=name, cause=cause),
                      ev.WaitStarted(seq=seq + 1, at=at, status=RunStatus.RETRY_SCHEDULED, wait=wait)),
                     ActionStatus.RETRYABLE, cause)
