"""What a due timer does to its run, through the domain (the timer service, ``services/timer``, fires them).

``plan_batch`` turns a batch of timers and their runs (loaded and locked) into what firing them
writes: each run's events in one plan, its wakeup (none for a run it leaves queued: admission admits
that one) and broadcast, the ledger rows and retry timers of calls given up on, and each timer's
``Outcome``. It is pure but for a retry's jitter; the timer
service writes it, and the in-memory world applies it.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from longrun import logs, otel
from longrun.app import effects
from longrun.app.wait_notices import wait_notices
from longrun.authoring import Registry
from longrun.ports.runs import LedgerOutcome, Message, Planned, StoredRun, plan, wait_timers
from longrun.ports.timers import DueTimer
from longrun.domain import (
    WAKE_A_WORKER,
    TERMINAL,
    ActionRecord,
    RetryPolicy,
    Rng,
    RunSnapshot,
    RunStatus,
    WakeReason,
    calls,
    children,
    on_business_deadline,
    reminders,
)
from longrun.domain import events as ev
from longrun.errors import DomainError

logger = logging.getLogger(__name__)

WAIT_TIMERS = frozenset({"retry_backoff", "sleep", "wait_deadline"})

_RNG = random.Random()
"""A run a timer leaves in one of these has a worker's work to do: it is woken (a worker holding it
already refuses the wakeup's take and carries on)."""


class Outcome(str, Enum):
    APPLIED = "applied"
    """The event changed the run."""
    LATE = "late"
    """The event was stored as late; the run did not change."""
    SKIPPED = "skipped"
    """No event: the timer no longer describes the run, or the domain refused it."""
    FAILED = "failed"
    """Rolled back and left unfired; it is claimed again in a later batch."""


@dataclass(frozen=True, slots=True)
class Fired:
    outcomes: dict[str, Outcome]
    plans: list[Planned]
    messages: dict[str, list[Message]]
    """Per run, its outbox messages."""
    ledger: list[LedgerOutcome] = field(default_factory=list)
    """Ledger rows of calls given up on."""
    timers: list[dict[str, Any]] = field(default_factory=list)
    """Timers to schedule (``timers.schedule``'s arguments): the retries of calls given up on."""


@dataclass(frozen=True, slots=True)
class Firing:
    """What one timer does to its run: its events, whether the run's lease is released with them, and
    the ledger row of a call given up on."""

    events: list[ev.RunEvent]
    release: bool
    ledger: LedgerOutcome | None = None


def cause_of(timer: DueTimer) -> str:
    """What a broadcast caused by ``timer`` names as its cause."""
    return f"timer:{timer.timer_key}"



def plan_batch(ordered: list[DueTimer], current: dict[str, StoredRun], *, at: float, now: datetime, producer: str,
               kinds: Registry, retry: RetryPolicy, rng: Rng | None = None,
               traces: Mapping[str, str | None] | None = None) -> Fired:
    """What firing ``ordered`` (their runs as ``current``, locked) writes, through the domain: each
    run's events in one plan, its wakeup and broadcast, the ledger rows and retry timers of calls
    given up on, and each timer's outcome. Pure but for ``rng`` (a retry's jitter). ``now``: the
    database's time (leases are judged by it); ``traces``: per timer key, the traceparent the
    messages it causes carry (none without)."""
    rng = rng or _RNG
    current = dict(current)
    first = dict(current)
    rows: dict[str, list[tuple[ev.RunEvent, bool]]] = {}
    released: set[str] = set()
    woken_by: dict[str, DueTimer] = {}
    outcomes: dict[str, Outcome] = {}
    ledger: list[LedgerOutcome] = []
    for timer in ordered:
        stored = current[timer.run_id]
        firing = _firing(timer, stored, at=at, now=now, kinds=kinds, retry=retry, rng=rng)
        if firing is None:
            outcomes[timer.timer_key] = Outcome.SKIPPED
            continue
        try:
            planned = plan(stored, firing.events, release_lease=firing.release)
        except DomainError as e:
            with logs.bound(timer.run_id, stored.snapshot.tenant_id):
                logger.warning("timer %s (run %s, %s) refused by the domain: %s", timer.timer_key, timer.run_id,
                               timer.kind, e)
            outcomes[timer.timer_key] = Outcome.SKIPPED
            continue
        current[timer.run_id] = planned.after
        rows.setdefault(timer.run_id, []).extend(planned.rows)
        if firing.release:
            released.add(timer.run_id)
        if firing.ledger is not None:
            ledger.append(firing.ledger)
        applied = planned.after.snapshot.revision != stored.snapshot.revision
        if applied:
            woken_by[timer.run_id] = timer
        outcomes[timer.timer_key] = Outcome.APPLIED if applied else Outcome.LATE
    plans = [Planned(first[r], current[r], tuple(events), r in released) for r, events in rows.items()]
    messages: dict[str, list[Message]] = {}
    waits: list[dict[str, Any]] = []
    # Each run's messages carry its own timer's trace (the one that woke it, else its last).
    run_traces = {t.run_id: (traces or {}).get(t.timer_key) for t in ordered}
    run_traces.update({r: (traces or {}).get(t.timer_key) for r, t in woken_by.items()})
    for p in plans:
        with otel.passing(run_traces.get(p.after.snapshot.run_id)):
            waits += _plan_messages(p, messages, woken_by, at=at, producer=producer, kinds=kinds)
    return Fired(outcomes, plans, messages, ledger, waits)


def _plan_messages(p: Planned, messages: dict[str, list[Message]], woken_by: dict[str, DueTimer], *,
                   at: float, producer: str, kinds: Registry) -> list[dict[str, Any]]:
    """The wakeup and broadcast ``p`` sends, into ``messages``; the retry timer of a call given up on."""
    run = p.after.snapshot
    sent = messages.setdefault(run.run_id, [])
    cause = woken_by.get(run.run_id)
    if cause is None:  # every wake of the run was late: nothing moved, nothing to say
        return []
    if run.status in WAKE_A_WORKER and run.revision != p.before.snapshot.revision:
        wakeup = effects.wake_unless_queued(p.after, reason=f"timer:{cause.kind}", producer=producer,
                                            cause=cause_of(cause))
        if wakeup is not None:
            sent.append(wakeup)
    broadcast = effects.broadcast_message(p.before.snapshot, p.after, producer=producer,
                                          public=kinds.public_receipts(run.kind, run.versions.workflow),
                                          cause=cause_of(cause))
    if broadcast is not None:
        sent.append(broadcast)
    sent += wait_notices(p, producer=producer, cause=cause_of(cause))
    if cause.kind in calls.CALL_TIMERS and run.status is RunStatus.RETRY_SCHEDULED:
        return wait_timers(run, decided_at=at)  # a timed-out call's retry
    return []


def _firing(timer: DueTimer, stored: StoredRun, *, at: float, now: datetime, kinds: Registry, retry: RetryPolicy,
            rng: Rng) -> Firing | None:
    """What ``timer`` does, or None when it no longer describes the run."""
    run = stored.snapshot
    seq = stored.seq(1)
    if timer.kind in WAIT_TIMERS:
        wait_id, reason = timer.payload.get("wait_id"), timer.payload.get("reason")
        if not isinstance(wait_id, str) or reason not in (WakeReason.TIMER.value, WakeReason.DEADLINE.value):
            logger.warning("timer %s: payload %r names no wait to wake", timer.timer_key, timer.payload)
            return None
        # Late (stored, not applied) when this wait is no longer pending: evolve decides.
        return Firing([ev.RunWoken(seq=seq, at=at, wait_id=wait_id, reason=WakeReason(reason))], release=False)
    if timer.kind == children.ENDED_TIMER:
        # Late (stored, not applied) when the parent has ended: evolve decides.
        return Firing([children.ended(timer.payload, seq=seq, at=at)], release=False)
    if run.status in TERMINAL:
        return None
    if timer.kind in reminders.TIMER_KINDS:
        # Nothing when its wait ended meanwhile (its closure cancels it, but a batch may hold it already).
        noted = reminders.on_timer(run, timer.kind, timer.payload, seq=seq, at=at)
        return None if noted is None else Firing([noted], release=False)
    if timer.kind == "business_deadline":
        # The worker holding the run keeps it and carries the cancel protocol out on its next write.
        verdict = on_business_deadline(run)
        return Firing([ev.DeadlinePassed(seq=seq, at=at, reason=verdict.why)], release=False) if verdict.cancel \
            else None
    # A run that leaves RUNNING or finishes here no longer belongs to the worker holding it.
    if timer.kind == "schedule_to_start":
        if run.status is not RunStatus.READY or run.revision != timer.payload.get("revision"):
            return None
        if stored.lease_owner is not None and stored.lease_until is not None and stored.lease_until > now:
            return None  # a worker took it (its move to RUNNING is written with its first step)
        return Firing([ev.RunStatusChanged(seq=seq, at=at, to=RunStatus.TIMED_OUT,
                                           reason="schedule_to_start: no worker started the run in time")],
                      release=True)
    if timer.kind in calls.CALL_TIMERS:
        name = timer.payload.get("logical_action")
        record = run.action(name) if isinstance(name, str) else None
        abandoned = calls.abandon(run, kind=timer.kind, payload=timer.payload,
                                  lease_token=None if stored.lease_owner is None else stored.fencing_token,
                                  seq=seq, at=at, policy=_call_retry(kinds, run, record, retry), rng=rng,
                                  new_id=lambda: str(uuid.uuid4()))
        if abandoned is None or record is None:
            return None
        # The attempt is given up on: its lease goes with it, so the worker still holding it is fenced out.
        return Firing(list(abandoned.events), release=True,
                      ledger=LedgerOutcome(record.idempotency_key, abandoned.status, {"last_error": abandoned.error}))
    # A kind added to TIMER_KINDS but not handled here stays unfired (and logged) until it is.
    raise ValueError(f"timer {timer.timer_key}: no handling for kind {timer.kind!r}")


def _call_retry(kinds: Registry, run: RunSnapshot, record: ActionRecord | None, default: RetryPolicy) -> RetryPolicy:
    """The retry policy of the tool ``record`` was called with, as the worker would use it."""
    try:
        kind = kinds.get(run.kind, run.versions.workflow)
    except LookupError:
        return default
    tool = kind.tools.get(record.tool) if record is not None else None
    return tool.retry if tool is not None and tool.retry is not None else default
