"""Firing schedules (``domain.schedules``): each due time's run is created through admission
(``app.scheduler.admit.create_run``, as a run.create from the bus would be) in the transaction that
records the time and moves the schedule's next due time on (the timer service's
``services.timer.schedules``). Nothing is published for the create: the run's announcement and wakeup
go through the outbox with that transaction, so a timer service killed at any point either committed
the run and the move, or neither (the time is fired again, and its idempotency key finds the run if
one was made).

A due time the overlap policy refuses (skip, or buffer one with one already waiting) is recorded as
skipped with admission's reason, and admission's ``run.rejected`` names its idempotency key, which names
the time. A backfill creates the runs of a past range the same way; its runs take no overlap key
(the range's runs are all asked for) and a time that has its run already keeps it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from longrun import metrics
from longrun.app.scheduler.admit import create_run
from longrun.authoring import ConcurrencyKey, Registry
from longrun.cadence import Schedule, backfill_times, idempotency_key
from longrun.domain.schedules import overlap_key, plan_firing
from longrun.envelope import Envelope, decode
from longrun.ports.schedules import ScheduleRecords
from longrun.ports.stores import RunTransaction

logger = logging.getLogger(__name__)

PER_ROUND = 20
"""Due times of one schedule fired in one transaction; a longer backlog goes on in the next."""
PRODUCER = "timer"
BACKFILL_REACH = timedelta(days=3660)


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission needs to create runs: the kinds known and the platform's settings."""

    kinds: Registry
    partitions: int
    slots: int
    max_input_bytes: int


def create_envelope(schedule: Schedule, due: datetime, producer: str, occurred_at: float) -> Envelope:
    """The run.create for ``due``: the schedule's run, its idempotency key naming the time, and labels
    naming the schedule and the time."""
    key = idempotency_key(schedule.schedule_id, due)
    payload = {**schedule.run, "idempotency_key": key,
               "labels": {**schedule.run.get("labels", {}), "schedule": schedule.schedule_id,
                          "scheduled_at": due.astimezone(UTC).isoformat(timespec="milliseconds")}}
    return decode(json.dumps({
        "event_id": key, "type": "run.create", "schema_version": 4, "producer": producer,
        "tenant_id": schedule.tenant_id, "correlation_id": key,
        "occurred_at": datetime.fromtimestamp(occurred_at, UTC).isoformat(), "payload": payload}).encode())


def _overlap(schedule: Schedule) -> ConcurrencyKey | None:
    held = overlap_key(schedule.schedule_id, schedule.overlap)
    if held is None:
        return None
    name = held.key
    return ConcurrencyKey(lambda _: name, limit=1, policy=held.policy, max_waiting=held.max_waiting)


async def create_for(tx: RunTransaction, records: ScheduleRecords, schedule: Schedule, due: datetime,
                     admission: Admission, *, backfill: bool = False,
                     clock: Callable[[], float] = time.time) -> str:
    """Create (or find) the run of ``due`` and record what the time did; returns ``created``, ``found``
    (made before: a firing repeated after a crash, or a backfill over a time fired) or ``skipped``."""
    answered = await create_run(tx, create_envelope(schedule, due, PRODUCER, clock()),
                                kinds=admission.kinds, partitions=admission.partitions, slots=admission.slots,
                                max_input_bytes=admission.max_input_bytes, clock=clock,
                                overlap=None if backfill else _overlap(schedule))
    outcome = answered.outcome
    if outcome.get("rejected"):
        await records.record(schedule.schedule_id, due, "skipped",
                             reason=f"{outcome['code']}: {outcome['reason']}", backfill=backfill)
        logger.info("schedule %s: %s skipped (%s)", schedule.schedule_id, due.isoformat(), outcome["reason"])
        metrics.SCHEDULE_FIRES.labels("skipped").inc()
        return "skipped"
    await records.record(schedule.schedule_id, due, "created", run_id=outcome["run_id"], backfill=backfill)
    if not outcome["created"]:
        return "found"
    metrics.SCHEDULE_FIRES.labels("created").inc()
    return "created"


async def fire(tx: RunTransaction, records: ScheduleRecords, schedule: Schedule, now: datetime,
               admission: Admission, *, clock: Callable[[], float] = time.time,
               per_round: int = PER_ROUND) -> datetime:
    """Fire what of ``schedule`` is due at ``now`` (recording a range older than its catch-up window as
    missed); returns its next due time, which the caller stores in the same transaction."""
    firing = plan_firing(schedule.cadence, schedule.next_due_at, now, schedule.window(now), per_round)
    if firing.missed is not None:
        await records.record(schedule.schedule_id, firing.missed.first, "missed", through=firing.missed.last,
                             reason=f"older than the catch-up window ({schedule.catch_up:g}s)")
        logger.warning("schedule %s: due times %s to %s missed (older than the catch-up window)",
                       schedule.schedule_id, firing.missed.first.isoformat(), firing.missed.last.isoformat())
        metrics.SCHEDULE_FIRES.labels("missed").inc()
    for due in firing.due:
        await create_for(tx, records, schedule, due, admission, clock=clock)
    return firing.next_due


@dataclass(frozen=True, slots=True)
class Backfilled:
    created: int
    times: int


async def backfill(tx: RunTransaction, records: ScheduleRecords, schedule: Schedule, start: datetime,
                   end: datetime, admission: Admission, *, clock: Callable[[], float] = time.time) -> Backfilled:
    """Create the runs of the due times in ``[start, end)``; ValueError for a range that is empty,
    reaches past now, or holds more than ``cadence.BACKFILL_MOST`` times."""
    now = await records.now()
    if end > now:
        raise ValueError(f"a backfill covers the past: its end ({end.isoformat()}) is after now ({now.isoformat()})")
    if start < now - BACKFILL_REACH:
        raise ValueError(f"a backfill starts at most {BACKFILL_REACH.days} days ago, not {start.isoformat()}")
    created = 0
    for due in (times := backfill_times(schedule.cadence, start, end)):
        created += await create_for(tx, records, schedule, due, admission, backfill=True, clock=clock) == "created"
    return Backfilled(created, len(times))
