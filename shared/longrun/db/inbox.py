"""Inbox dedup: one row per handled message, written in the handler's transaction.

``claim`` inserts the row first (``ON CONFLICT DO NOTHING``): a duplicate either finds
the committed row and gets its recorded outcome, or waits on the first delivery's
uncommitted row and then finds it. Downstream consumers reuse these two functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import inboxes


@dataclass(frozen=True, slots=True)
class Claimed:
    message_id: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    message_id: str
    outcome: dict[str, Any]


async def claim(conn: AsyncConnection, service: str, *, message_id: str, message_type: str,
                run_id: str | None) -> Claimed | Duplicate:
    table = inboxes[service]
    inserted = await conn.execute(
        insert(table)
        .values(message_id=message_id, message_type=message_type, run_id=run_id, outcome={})
        .on_conflict_do_nothing()
        .returning(table.c.message_id)
    )
    if inserted.first() is not None:
        return Claimed(message_id)
    outcome = (await conn.execute(
        select(table.c.outcome).where(table.c.message_id == message_id)
    )).scalar_one()
    return Duplicate(message_id, outcome)


async def record_outcome(conn: AsyncConnection, service: str, *, message_id: str,
                         outcome: dict[str, Any]) -> None:
    table = inboxes[service]
    await conn.execute(update(table).where(table.c.message_id == message_id).values(outcome=outcome))
