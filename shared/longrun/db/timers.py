"""Durable timers: one row per timer key; firing and marking happen in one transaction.

Because the run event, the wakeup's outbox row and ``fired_at`` commit together, a
crash between "fire" and "mark" rolls both back: each timer key fires exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import timers


@dataclass(frozen=True, slots=True)
class DueTimer:
    timer_key: str
    run_id: str
    kind: str
    wake_at: datetime
    payload: dict[str, Any]


async def schedule(conn: AsyncConnection, *, timer_key: str, run_id: str, kind: str, delay: float,
                   payload: dict[str, Any]) -> None:
    """Due ``delay`` seconds from now by the database's clock: the timer service compares with
    ``now()`` there, so a writer whose own clock is off cannot move a timer."""
    await conn.execute(insert(timers).values(
        timer_key=timer_key, run_id=run_id, kind=kind, wake_at=func.now() + timedelta(seconds=delay),
        payload=payload).on_conflict_do_nothing(index_elements=["timer_key"]))


async def due(conn: AsyncConnection, *, limit: int) -> list[DueTimer]:
    """Due, unfired timers, earliest first; rows another timer replica holds are skipped."""
    rows = await conn.execute(
        select(timers.c.timer_key, timers.c.run_id, timers.c.kind, timers.c.wake_at, timers.c.payload)
        .where(timers.c.fired_at.is_(None), timers.c.wake_at <= func.now())
        .order_by(timers.c.wake_at).limit(limit).with_for_update(skip_locked=True))
    return [DueTimer(*r) for r in rows]


async def mark_fired(conn: AsyncConnection, timer_keys: list[str]) -> None:
    if timer_keys:
        # clock_timestamp, not now(): the transaction may have started a while ago.
        await conn.execute(update(timers).where(timers.c.timer_key.in_(timer_keys))
                           .values(fired_at=func.clock_timestamp()))


async def next_wake_at(conn: AsyncConnection) -> datetime | None:
    return (await conn.execute(select(func.min(timers.c.wake_at)).where(timers.c.fired_at.is_(None)))).scalar()
