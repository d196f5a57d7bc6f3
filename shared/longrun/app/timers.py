"""The timer service's use case: turn due timers into run events, exactly once per timer key.

``fire_due`` claims a batch of due timers (``FOR UPDATE SKIP LOCKED``, so timer replicas
share the work without blocking each other) and, in the SAME transaction, appends each
timer's event to its run under the run's row lock, writes the run's wakeup and broadcast
outbox rows, and marks the timers fired. A crash anywhere before the commit rolls all of
it back and the timers fire again later; after the commit they are never claimed again.

What each timer kind does (the kind names the timer; the payload identifies what it is for):

- ``retry_backoff``, ``sleep``, ``wait_deadline`` (payload ``{"wait_id", "reason"}``, written
  by ``effects.schedule_wait_timers``): ``RunWoken(wait_id, reason=TIMER | DEADLINE)``. The
  pending wait ends, the run becomes READY and a worker is woken; its ``decide`` reads
  ``state.last_wake.reason`` to tell a deadline from an answer. While PAUSED the wake only
  changes what the run resumes to, so no worker is woken.
- ``business_deadline`` (payload ``{}``): an open run ends TIMED_OUT through
  ``RunStatusChanged``; its lease, if a worker holds one, is released so that worker's next
  write is refused.
- ``schedule_to_start`` (payload ``{"revision"}``: the run's revision when it was queued):
  a run still READY at that exact revision was never started by a worker; it ends
  TIMED_OUT.
- ``start_to_close`` (payload ``{"fencing_token"}``: the attempt's lease): a run still
  RUNNING under that token has overrun its attempt; the attempt is abandoned (RUNNING ->
  READY, lease released, so the stuck worker is fenced out) and a worker is woken to retry
  the step. ``heartbeat`` (same payload) does the same, but only once that lease has also
  expired by database time (the worker stopped renewing it).

Every status change this module makes carries the timer kind as the prefix of its
``reason`` (``"business_deadline: ..."``), so history says which timeout moved the run.

Stale timers never raise and are always marked fired:
- a wake for a wait that is no longer pending (ended by a webhook, approval or another
  timer, or the run finished) is what the domain calls *late*: ``runs.append`` stores the
  ``RunWoken`` with ``applied = false`` and the run does not change (no wakeup, no broadcast);
- a run-level timer whose run has moved on (finished, or no longer in the queue stint or
  attempt its payload names) is skipped: no event is written, because the domain would
  refuse a status change on a finished run and the timeout no longer describes the run;
- a timer the domain refuses outright (``DomainError``, e.g. a TIMER wake for a wait with
  no timer) is skipped and logged as a warning.
A timer that fails for any other reason (e.g. a snapshot from a newer schema during a
rollout) fails its batch, which is then fired again with one savepoint per timer: that
timer is rolled back, logged and left unfired to be tried again, and the rest still fire.

Lateness (``fired_at - wake_at``, both database time) is logged per timer at DEBUG and as
the batch maximum at INFO.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from enum import Enum

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun import faults
from longrun.app import effects
from longrun.db import outbox, runs, timers
from longrun.db.errors import is_transient
from longrun.db.runs import StoredRun
from longrun.db.timers import DueTimer
from longrun.domain import TERMINAL, RunStatus, WakeReason
from longrun.domain import events as ev
from longrun.errors import DomainError

logger = logging.getLogger(__name__)

WAIT_TIMERS = frozenset({"retry_backoff", "sleep", "wait_deadline"})
ATTEMPT_TIMERS = frozenset({"start_to_close", "heartbeat"})


class Outcome(str, Enum):
    APPLIED = "applied"
    """The event changed the run."""
    LATE = "late"
    """The event was stored as late; the run did not change."""
    SKIPPED = "skipped"
    """No event: the timer no longer describes the run, or the domain refused it."""
    FAILED = "failed"
    """Rolled back and left unfired; it is claimed again in a later batch."""


async def fire_due(engine: AsyncEngine, *, batch: int, clock: Callable[[], float],
                   producer: str = "timer") -> int:
    """Fire up to ``batch`` due timers in one transaction; returns how many were marked fired."""
    try:
        return await _fire_batch(engine, batch=batch, clock=clock, producer=producer, isolate=False)
    except Exception as e:
        if is_transient(e):
            raise
        # Savepoints cost two statements per timer, so they are paid only once a batch broke:
        # then the batch runs again timer by timer and only the broken timer waits.
        logger.warning("timer batch failed (%r); firing it again with one savepoint per timer", e)
        return await _fire_batch(engine, batch=batch, clock=clock, producer=producer, isolate=True)


async def _fire_batch(engine: AsyncEngine, *, batch: int, clock: Callable[[], float], producer: str,
                      isolate: bool) -> int:
    async with engine.begin() as conn:
        due = await timers.due(conn, limit=batch)
        if not due:
            return 0
        # Transaction time: exactly the fired_at that mark_fired stores.
        fired_at: datetime = (await conn.execute(select(func.now()))).scalar_one()
        # Runs are locked in run_id order so two replicas whose batches share runs cannot
        # deadlock; a run's own timers stay in wake_at order (a wake before its deadline).
        ordered = sorted(due, key=lambda t: (t.run_id, t.wake_at))
        if isolate:
            outcomes = {t.timer_key: await _fire_isolated(conn, t, at=clock(), now=fired_at, producer=producer)
                        for t in ordered}
        else:
            outcomes = await _fire_together(conn, ordered, at=clock(), now=fired_at, producer=producer)
        faults.crash_point("timer.after_fire_before_mark")
        marked = [key for key, outcome in outcomes.items() if outcome is not Outcome.FAILED]
        await timers.mark_fired(conn, marked)
    faults.crash_point("timer.after_commit")
    _log_batch(due, outcomes, fired_at)
    return len(marked)


async def _fire_together(conn: AsyncConnection, ordered: list[DueTimer], *, at: float, now: datetime,
                         producer: str) -> dict[str, Outcome]:
    """The whole batch in a handful of statements: one locking read, one update, one insert each."""
    current = await runs.load_many(conn, [t.run_id for t in ordered], lock=True)
    first = dict(current)
    rows: dict[str, list[tuple[ev.RunEvent, bool]]] = {}
    released: set[str] = set()
    woken_by: dict[str, str] = {}
    outcomes: dict[str, Outcome] = {}
    for timer in ordered:
        stored = current[timer.run_id]
        event = _event(timer, stored, at=at, now=now)
        if event is None:
            outcomes[timer.timer_key] = Outcome.SKIPPED
            continue
        release = isinstance(event, ev.RunStatusChanged)
        try:
            planned = runs.plan(stored, [event], release_lease=release)
        except DomainError as e:
            logger.warning("timer %s (run %s, %s) refused by the domain: %s", timer.timer_key, timer.run_id,
                           timer.kind, e)
            outcomes[timer.timer_key] = Outcome.SKIPPED
            continue
        current[timer.run_id] = planned.after
        rows.setdefault(timer.run_id, []).extend(planned.rows)
        if release:
            released.add(timer.run_id)
        applied = planned.after.snapshot.revision != stored.snapshot.revision
        if applied:
            woken_by[timer.run_id] = timer.kind
        outcomes[timer.timer_key] = Outcome.APPLIED if applied else Outcome.LATE
    plans = [runs.Planned(first[r], current[r], tuple(events), r in released) for r, events in rows.items()]
    await runs.write_many(conn, plans)
    messages = []
    for p in plans:
        if p.after.snapshot.status is RunStatus.READY and p.after.snapshot.revision != p.before.snapshot.revision:
            reason = f"timer:{woken_by[p.after.snapshot.run_id]}"
            messages.append(effects.wake_message(p.after, reason=reason, producer=producer))
        broadcast = effects.broadcast_message(p.before.snapshot, p.after, producer=producer)
        if broadcast is not None:
            messages.append(broadcast)
    await outbox.enqueue_many(conn, messages)
    await effects.notify_admission(conn, [p.after.snapshot.tenant_id for p in plans
                                          if p.after.snapshot.status in TERMINAL])
    return outcomes


async def seconds_until_next(engine: AsyncEngine) -> float | None:
    """Seconds (database clock) until the earliest unfired timer; <= 0 when one is due, None when none."""
    async with engine.connect() as conn:
        next_at = await timers.next_wake_at(conn)
        if next_at is None:
            return None
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
    return (next_at - now).total_seconds()


async def _fire_isolated(conn: AsyncConnection, timer: DueTimer, *, at: float, now: datetime,
                         producer: str) -> Outcome:
    """One timer inside a savepoint, so a timer that cannot be handled does not hold up its batch."""
    try:
        async with conn.begin_nested():
            return await _fire(conn, timer, at=at, now=now, producer=producer)
    except Exception as e:
        if is_transient(e):
            raise
        logger.exception("timer %s (run %s, %s) failed; left unfired", timer.timer_key, timer.run_id, timer.kind)
        return Outcome.FAILED


async def _fire(conn: AsyncConnection, timer: DueTimer, *, at: float, now: datetime, producer: str) -> Outcome:
    stored = await runs.load(conn, timer.run_id, lock=True)
    assert stored is not None, "timers.run_id references runs"
    event = _event(timer, stored, at=at, now=now)
    if event is None:
        return Outcome.SKIPPED
    # A run that leaves RUNNING or finishes here no longer belongs to the worker holding it.
    release = isinstance(event, ev.RunStatusChanged)
    try:
        after = await runs.append(conn, stored, [event], release_lease=release)
    except DomainError as e:
        logger.warning("timer %s (run %s, %s) refused by the domain: %s", timer.timer_key, timer.run_id,
                       timer.kind, e)
        return Outcome.SKIPPED
    if after.snapshot.revision == stored.snapshot.revision:
        return Outcome.LATE
    if after.snapshot.status is RunStatus.READY:
        await effects.wake(conn, after, reason=f"timer:{timer.kind}", producer=producer)
    await effects.broadcast(conn, stored.snapshot, after, producer=producer)
    return Outcome.APPLIED


def _event(timer: DueTimer, stored: StoredRun, *, at: float, now: datetime) -> ev.RunEvent | None:
    """The event ``timer`` stands for, or None when it no longer describes the run."""
    run = stored.snapshot
    seq = stored.seq(1)
    if timer.kind in WAIT_TIMERS:
        wait_id, reason = timer.payload.get("wait_id"), timer.payload.get("reason")
        if not isinstance(wait_id, str) or reason not in (WakeReason.TIMER.value, WakeReason.DEADLINE.value):
            logger.warning("timer %s: payload %r names no wait to wake", timer.timer_key, timer.payload)
            return None
        # Late (stored, not applied) when this wait is no longer pending: evolve decides.
        return ev.RunWoken(seq=seq, at=at, wait_id=wait_id, reason=WakeReason(reason))
    if run.status in TERMINAL:
        return None
    if timer.kind == "business_deadline":
        return ev.RunStatusChanged(seq=seq, at=at, to=RunStatus.TIMED_OUT,
                                   reason="business_deadline: the run's deadline passed")
    if timer.kind == "schedule_to_start":
        if run.status is not RunStatus.READY or run.revision != timer.payload.get("revision"):
            return None
        return ev.RunStatusChanged(seq=seq, at=at, to=RunStatus.TIMED_OUT,
                                   reason="schedule_to_start: no worker started the run in time")
    if timer.kind in ATTEMPT_TIMERS:
        token = timer.payload.get("fencing_token")
        if run.status is not RunStatus.RUNNING or stored.lease_owner is None or stored.fencing_token != token:
            return None
        if timer.kind == "start_to_close":
            why = f"start_to_close: attempt under lease {token} held by {stored.lease_owner} overran its limit"
        elif stored.lease_until is not None and stored.lease_until > now:
            return None  # the worker is still renewing its lease
        else:
            why = f"heartbeat: lease {token} held by {stored.lease_owner} expired"
        return ev.RunStatusChanged(seq=seq, at=at, to=RunStatus.READY, reason=why)
    # A kind added to TIMER_KINDS but not handled here stays unfired (and logged) until it is.
    raise ValueError(f"timer {timer.timer_key}: no handling for kind {timer.kind!r}")


def _log_batch(due: list[DueTimer], outcomes: dict[str, Outcome], fired_at: datetime) -> None:
    lateness = {t.timer_key: (fired_at - t.wake_at).total_seconds() for t in due}
    if logger.isEnabledFor(logging.DEBUG):
        for t in due:
            logger.debug("timer %s (run %s, %s): %s, lateness %.3fs", t.timer_key, t.run_id, t.kind,
                         outcomes[t.timer_key].value, lateness[t.timer_key])
    counts = Counter(o.value for o in outcomes.values())
    logger.info("fired %d timer(s) %s; lateness max %.3fs", len(due),
                " ".join(f"{k}={v}" for k, v in sorted(counts.items())), max(lateness.values()))
