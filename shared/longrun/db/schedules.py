"""Schedules (``domain.schedules``) in PostgreSQL: the rows operators manage, the due ones the timer
service claims (``FOR UPDATE SKIP LOCKED``: replicas share them, a schedule being fired is left to the
replica firing it) and what each due time did (``schedule_fires``, once per time)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.cadence import Cadence, Schedule
from longrun.domain.schedules import Overlap

FIRES_SHOWN = 50
"""The latest due times a schedule's view shows."""


_COLUMNS = ("schedule_id, tenant_id, run, cron, every_seconds, anchor, overlap, catch_up_seconds, paused, "
            "next_due_at, created_by, created_at")


def _schedule(row: Any) -> Schedule:
    return Schedule(row.schedule_id, row.tenant_id, dict(row.run), Cadence(row.anchor, row.cron, row.every_seconds),
                    Overlap(row.overlap), row.catch_up_seconds, row.paused, row.next_due_at, row.created_by,
                    row.created_at)


async def insert(conn: AsyncConnection, schedule: Schedule) -> None:
    await conn.execute(text(
        "INSERT INTO schedules (schedule_id, tenant_id, run, cron, every_seconds, anchor, overlap, "
        "catch_up_seconds, paused, next_due_at, created_by) VALUES (:id, :tenant, CAST(:run AS jsonb), :cron, "
        ":every, :anchor, :overlap, :catch_up, false, :next_due, :by)"),
        {"id": schedule.schedule_id, "tenant": schedule.tenant_id, "run": json.dumps(schedule.run),
         "cron": schedule.cadence.cron, "every": schedule.cadence.every, "anchor": schedule.cadence.anchor,
         "overlap": schedule.overlap.value, "catch_up": schedule.catch_up, "next_due": schedule.next_due_at,
         "by": schedule.created_by})


async def get(conn: AsyncConnection, schedule_id: str, *, lock: bool = False) -> Schedule | None:
    row = (await conn.execute(text(f"SELECT {_COLUMNS} FROM schedules WHERE schedule_id = :id"
                                   + (" FOR UPDATE" if lock else "")), {"id": schedule_id})).one_or_none()
    return None if row is None else _schedule(row)


async def listed(conn: AsyncConnection, tenants: list[str] | None, tenant: str | None) -> list[Schedule]:
    """The schedules of ``tenant`` (or of every tenant), among ``tenants`` (None: every tenant)."""
    rows = (await conn.execute(text(
        f"SELECT {_COLUMNS} FROM schedules WHERE (CAST(:tenant AS text) IS NULL OR tenant_id = :tenant) "
        "AND (CAST(:tenants AS text[]) IS NULL OR tenant_id = ANY(CAST(:tenants AS text[]))) "
        "ORDER BY tenant_id, schedule_id"), {"tenant": tenant, "tenants": tenants})).all()
    return [_schedule(r) for r in rows]


@dataclass(frozen=True, slots=True)
class Claimed:
    schedule: Schedule
    now: datetime
    """The transaction's time: what is due is judged by it."""


async def claim_due(conn: AsyncConnection, besides: list[str] | None = None) -> Claimed | None:
    """The most overdue schedule but ``besides``, locked for this transaction; None when none is due (or
    every due one is being fired by another replica)."""
    row = (await conn.execute(text(
        f"SELECT {_COLUMNS}, now() AS now FROM schedules WHERE NOT paused AND next_due_at <= now() "
        "AND schedule_id <> ALL(CAST(:besides AS text[])) "
        "ORDER BY next_due_at LIMIT 1 FOR UPDATE SKIP LOCKED"), {"besides": besides or []})).one_or_none()
    return None if row is None else Claimed(_schedule(row), row.now)


async def advance(conn: AsyncConnection, schedule_id: str, next_due: datetime) -> None:
    await conn.execute(text("UPDATE schedules SET next_due_at = :next WHERE schedule_id = :id"),
                       {"id": schedule_id, "next": next_due})


async def set_paused(conn: AsyncConnection, schedule_id: str, paused: bool, next_due: datetime | None) -> None:
    await conn.execute(text("UPDATE schedules SET paused = :paused, next_due_at = COALESCE(:next, next_due_at), "
                            "updated_at = now() WHERE schedule_id = :id"),
                       {"id": schedule_id, "paused": paused, "next": next_due})


async def delete(conn: AsyncConnection, schedule_id: str) -> None:
    await conn.execute(text("DELETE FROM schedules WHERE schedule_id = :id"), {"id": schedule_id})


async def record(conn: AsyncConnection, schedule_id: str, due: datetime, outcome: str, *, run_id: str | None = None,
                 reason: str | None = None, through: datetime | None = None, backfill: bool = False) -> None:
    """What ``due`` did; a due time recorded already keeps its first record (a backfill over it finds the
    run made then)."""
    await conn.execute(text(
        "INSERT INTO schedule_fires (schedule_id, due_at, outcome, run_id, reason, through, backfill) "
        "VALUES (:id, :due, :outcome, :run_id, :reason, :through, :backfill) ON CONFLICT DO NOTHING"),
        {"id": schedule_id, "due": due, "outcome": outcome, "run_id": run_id, "reason": reason,
         "through": through, "backfill": backfill})


async def fires(conn: AsyncConnection, schedule_id: str, limit: int = FIRES_SHOWN) -> list[dict[str, Any]]:
    """The latest due times' records, newest first."""
    rows = (await conn.execute(text(
        "SELECT due_at, outcome, run_id, reason, through, backfill FROM schedule_fires WHERE schedule_id = :id "
        "ORDER BY due_at DESC LIMIT :limit"), {"id": schedule_id, "limit": limit})).all()
    return [{"due_at": r.due_at.isoformat(), "outcome": r.outcome, "run_id": r.run_id, "reason": r.reason,
             "through": None if r.through is None else r.through.isoformat(), "backfill": r.backfill} for r in rows]


async def now(conn: AsyncConnection) -> datetime:
    moment: datetime = (await conn.execute(text("SELECT now()"))).scalar_one()
    return moment


class PgScheduleRecords:
    """``ports.schedules.ScheduleRecords`` in the transaction of ``conn``."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def record(self, schedule_id: str, due: datetime, outcome: str, *, run_id: str | None = None,
                     reason: str | None = None, through: datetime | None = None, backfill: bool = False) -> None:
        await record(self.conn, schedule_id, due, outcome, run_id=run_id, reason=reason, through=through,
                     backfill=backfill)

    async def now(self) -> datetime:
        return await now(self.conn)
