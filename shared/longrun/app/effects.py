"""Side effects that ride along with a run transition: wakeups, broadcasts and timers.

Kept in one place so every writer (worker, scheduler, timer, gateway, reconciler, operator)
wakes runs, broadcasts status changes and schedules deadlines the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.bus import topology
from longrun.db import outbox, timers
from longrun.db.runs import StoredRun
from longrun.domain import TERMINAL, RunSnapshot, RunStatus
from longrun.domain import events as ev
from longrun.envelope import DataClass, make

ADMISSION_CHANNEL = "longrun_admission"


async def wake(conn: AsyncConnection, stored: StoredRun, *, reason: str, producer: str) -> None:
    """Ask a worker to advance the run (the message names the run, the state is in PostgreSQL)."""
    run = stored.snapshot
    envelope = make("run.wakeup", {"wakeup_id": str(uuid.uuid4()), "reason": reason}, producer=producer,
                    tenant_id=run.tenant_id, run_id=run.run_id, expected_state_version=run.revision)
    await outbox.enqueue(conn, envelope, exchange=topology.work_exchange("worker"),
                         routing_key=topology.partition_key(stored.partition), partition=stored.partition)


async def broadcast(conn: AsyncConnection, before: RunSnapshot, after: StoredRun,
                    events: Sequence[ev.RunEvent], *, producer: str) -> None:
    """Status changes go to the events topic for downstream consumers; facts stay private."""
    run = after.snapshot
    if run.status is before.status:
        return
    envelope = make("run.event", {"seq": run.last_seq, "event_type": "run.status_changed",
                                  "status": run.status.value,
                                  "data": {"from": before.status.value, "stage": run.stage,
                                           "reason": run.terminal_reason or ""}},
                    producer=producer, tenant_id=run.tenant_id, run_id=run.run_id,
                    data_class=DataClass.INTERNAL)
    await outbox.enqueue(conn, envelope, exchange=topology.EVENTS_EXCHANGE,
                         routing_key=f"run.status.{run.status.value.lower()}", partition=after.partition)
    if run.status in TERMINAL:
        # A finished run frees a tenant slot: let the scheduler admit the next one now.
        await conn.execute(text("SELECT pg_notify(:c, :t)"), {"c": ADMISSION_CHANNEL, "t": run.tenant_id})


async def schedule_wait_timers(conn: AsyncConnection, run: RunSnapshot) -> None:
    """A parked run's deadline and, for retries and sleeps, its wake-up time, as durable timers."""
    wait = run.wait
    if wait is None:
        return
    if wait.wake_at is not None:
        await timers.schedule(conn, timer_key=f"{run.run_id}:{wait.wait_id}:wake", run_id=run.run_id,
                              kind="retry_backoff" if run.status is RunStatus.RETRY_SCHEDULED else "sleep",
                              wake_at=wait.wake_at, payload={"wait_id": wait.wait_id, "reason": "timer"})
    if wait.deadline is not None and wait.deadline != wait.wake_at:
        await timers.schedule(conn, timer_key=f"{run.run_id}:{wait.wait_id}:deadline", run_id=run.run_id,
                              kind="wait_deadline", wake_at=wait.deadline,
                              payload={"wait_id": wait.wait_id, "reason": "deadline"})
