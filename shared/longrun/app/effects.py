"""Side effects that ride along with a run transition: wakeups, broadcasts and timers.

Kept in one place so every writer (worker, scheduler, timer, gateway, reconciler, operator)
wakes runs, broadcasts status changes and schedules deadlines the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.bus import topology
from longrun.db import outbox, timers
from longrun.db.runs import Handover, Rides, StoredRun
from longrun.domain import TERMINAL, RunSnapshot, RunStatus
from longrun.envelope import DataClass, make

ADMISSION_CHANNEL = "longrun_admission"


def wake_message(stored: StoredRun, *, reason: str, producer: str) -> outbox.Message:
    """Ask a worker to advance the run (the message names the run, the state is in PostgreSQL)."""
    run = stored.snapshot
    return wake_message_of(tenant_id=run.tenant_id, run_id=run.run_id, revision=run.revision,
                           partition=stored.partition, reason=reason, producer=producer)


def wake_message_of(*, tenant_id: str, run_id: str, revision: int, partition: int, reason: str,
                    producer: str) -> outbox.Message:
    """``wake_message`` from the run's columns, for a writer that did not read its snapshot."""
    envelope = make("run.wakeup", {"wakeup_id": str(uuid.uuid4()), "reason": reason}, producer=producer,
                    tenant_id=tenant_id, run_id=run_id, expected_state_version=revision)
    return outbox.Message(envelope, topology.work_exchange("worker"), topology.partition_key(partition), partition)


def broadcast_message(before: RunSnapshot, after: StoredRun, *, producer: str) -> outbox.Message | None:
    """Status changes go to the events topic for downstream consumers; facts stay private."""
    run = after.snapshot
    if run.status is before.status:
        return None
    envelope = make("run.event", {"seq": run.last_seq, "event_type": "run.status_changed",
                                  "status": run.status.value,
                                  "data": {"from": before.status.value, "stage": run.stage,
                                           "reason": run.terminal_reason or ""}},
                    producer=producer, tenant_id=run.tenant_id, run_id=run.run_id, data_class=DataClass.INTERNAL)
    return outbox.Message(envelope, topology.EVENTS_EXCHANGE, f"run.status.{run.status.value.lower()}",
                          after.partition)


@dataclass(frozen=True, slots=True)
class SlotHandover:
    """How a writer hands a finishing run's slot on (``runs.Handover``): the scheduler's tenant slots
    and aging, and the bus's partition count."""

    slots: int
    aging_seconds: float
    partitions: int


def broadcast_rides(before: RunSnapshot, after: StoredRun, *, producer: str,
                    handover: SlotHandover | None = None) -> Rides:
    """``broadcast`` as rows riding with the transition's own statement (``runs.write``); with
    ``handover``, a run that finishes gives its slot to the next queued run of its tenant at once
    instead of waking admission."""
    message = broadcast_message(before, after, producer=producer)
    if message is None:
        return Rides()
    run = after.snapshot
    if run.status not in TERMINAL:
        return Rides(messages=(message,))
    if handover is None:
        return Rides(messages=(message,), notices=((ADMISSION_CHANNEL, run.tenant_id),))
    template = wake_message_of(tenant_id=run.tenant_id, run_id=run.run_id, revision=0, partition=0,
                               reason="admitted", producer=producer)
    routes = {k: topology.partition_key(k) for k in range(handover.partitions)}
    return Rides(messages=(message,), handover=Handover(run.tenant_id, handover.slots, handover.aging_seconds,
                                                        template, routes, ADMISSION_CHANNEL))


async def wake(conn: AsyncConnection, stored: StoredRun, *, reason: str, producer: str) -> None:
    await outbox.enqueue_many(conn, [wake_message(stored, reason=reason, producer=producer)])


async def broadcast(conn: AsyncConnection, before: RunSnapshot, after: StoredRun, *, producer: str) -> None:
    message = broadcast_message(before, after, producer=producer)
    if message is None:
        return
    await outbox.enqueue_many(conn, [message])
    if after.snapshot.status in TERMINAL:
        await notify_admission(conn, [after.snapshot.tenant_id])


async def notify_admission(conn: AsyncConnection, tenants: Sequence[str]) -> None:
    """A finished run frees a tenant slot: let the scheduler admit the next one now."""
    for tenant in sorted(set(tenants)):
        await conn.execute(text("SELECT pg_notify(:c, :t)"), {"c": ADMISSION_CHANNEL, "t": tenant})


async def schedule_wait_timers(conn: AsyncConnection, run: RunSnapshot, *, decided_at: float) -> None:
    """A parked run's deadline and, for retries and sleeps, its wake-up time, as durable timers.

    The wait's times were computed from the deciding process's clock at ``decided_at``; only the
    delays are kept, counted from the database's clock (a worker minutes fast must not delay a retry).
    """
    wait = run.wait
    if wait is None:
        return
    if wait.wake_at is not None:
        await timers.schedule(conn, timer_key=f"{run.run_id}:{wait.wait_id}:wake", run_id=run.run_id,
                              kind="retry_backoff" if run.status is RunStatus.RETRY_SCHEDULED else "sleep",
                              delay=wait.wake_at - decided_at, payload={"wait_id": wait.wait_id, "reason": "timer"})
    if wait.deadline is not None and wait.deadline != wait.wake_at:
        await timers.schedule(conn, timer_key=f"{run.run_id}:{wait.wait_id}:deadline", run_id=run.run_id,
                              kind="wait_deadline", delay=wait.deadline - decided_at,
                              payload={"wait_id": wait.wait_id, "reason": "deadline"})
