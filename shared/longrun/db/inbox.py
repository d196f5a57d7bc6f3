"""Inbox dedup: one row per handled message, written in the handler's transaction.

``claim`` inserts the row first (``ON CONFLICT DO NOTHING``): a duplicate either finds
the committed row and gets its recorded outcome, or waits on the first delivery's
uncommitted row and then finds it. Downstream consumers reuse these two functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import inboxes


# Built once per inbox table, so executing them hits SQLAlchemy's compiled cache.
_CLAIM = {service: insert(table).on_conflict_do_nothing().returning(table.c.message_id)
          for service, table in inboxes.items()}
_OUTCOME = {service: select(table.c.outcome).where(table.c.message_id == bindparam("id"))
            for service, table in inboxes.items()}
_RECORD_OUTCOME = {service: update(table).where(table.c.message_id == bindparam("id"))
                   .values(outcome=bindparam("outcome", type_=table.c.outcome.type))
                   for service, table in inboxes.items()}


@dataclass(frozen=True, slots=True)
class Claimed:
    message_id: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    message_id: str
    outcome: dict[str, Any]


async def claim(conn: AsyncConnection, service: str, *, message_id: str, message_type: str,
                run_id: str | None) -> Claimed | Duplicate:
    inserted = await conn.execute(_CLAIM[service], {"message_id": message_id, "message_type": message_type,
                                                    "run_id": run_id, "outcome": {}})
    if inserted.first() is not None:
        return Claimed(message_id)
    outcome = (await conn.execute(_OUTCOME[service], {"id": message_id})).scalar_one()
    return Duplicate(message_id, outcome)


async def record_outcome(conn: AsyncConnection, service: str, *, message_id: str,
                         outcome: dict[str, Any]) -> None:
    await conn.execute(_RECORD_OUTCOME[service], {"id": message_id, "outcome": outcome})
