"""Quarantine rows: a message that must not be retried, kept whole with its reason."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Row, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun_client.storable import storable, storable_json

from longrun.db.schema import delivery_failures, quarantine


async def put(conn: AsyncConnection, *, owner: str, queue: str, body: bytes, headers: dict[str, Any],
              message_id: str | None, error_code: str, reason: str, attempts: int,
              first_failure_at: datetime | None = None, last_failure_at: datetime | None = None) -> int:
    """Keep a message whatever it holds: the body as it came, the text around it made storable (a
    quarantined message may be one because of a U+0000 in it). Failure times not given are now."""
    message_type, schema_version = _peek(body)
    first = first_failure_at if first_failure_at is not None else func.now()
    last = last_failure_at if last_failure_at is not None else func.now()
    row = await conn.execute(insert(quarantine).values(
        owner=storable(owner), queue=storable(queue),
        message_id=None if message_id is None else storable(message_id),
        message_type=None if message_type is None else storable(message_type), schema_version=schema_version,
        error_code=storable(error_code), reason=storable(reason), body=body, headers=storable_json(headers),
        attempts=attempts, first_failure_at=first, last_failure_at=last,
    ).returning(quarantine.c.id))
    return int(row.scalar_one())


def _peek(body: bytes) -> tuple[str | None, int | None]:
    """Best effort: what the message claims to be, for listing; never trusted."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    type_ = data.get("type") if isinstance(data.get("type"), str) else None
    version = data.get("schema_version")
    # The column is an integer: a claim beyond it is no version worth listing.
    return type_, version if isinstance(version, int) and -2**31 <= version < 2**31 else None


async def record_failure(conn: AsyncConnection, *, service: str, message_id: str, error: str) -> tuple[int, datetime]:
    """Count a failed handling attempt outside the handler's (rolled back) transaction."""
    row = await conn.execute(
        pg_insert(delivery_failures)
        .values(service=service, message_id=message_id, attempts=1, last_error=error)
        .on_conflict_do_update(
            index_elements=["service", "message_id"],
            set_={"attempts": delivery_failures.c.attempts + 1, "last_error": error,
                  "last_failure_at": func.now()})
        .returning(delivery_failures.c.attempts, delivery_failures.c.first_failure_at)
    )
    attempts, first = row.one()
    return int(attempts), first


async def list_entries(conn: AsyncConnection, *, include_replayed: bool = False) -> list[dict[str, Any]]:
    query = select(quarantine).order_by(quarantine.c.id)
    if not include_replayed:
        query = query.where(quarantine.c.replayed_at.is_(None))
    return [dict(r._mapping) for r in await conn.execute(query)]


async def entry(conn: AsyncConnection, entry_id: int) -> Row | None:  # type: ignore[type-arg]
    """One entry, with the database's time as ``now`` (None: no such entry)."""
    return (await conn.execute(select(quarantine, func.now().label("now"))
                               .where(quarantine.c.id == entry_id))).first()


async def dead_wakeups(conn: AsyncConnection, run_id: str) -> int:
    """How many of ``run_id``'s wakeups the quarantine holds."""
    return int((await conn.execute(
        select(func.count()).select_from(quarantine)
        .where(quarantine.c.message_type == "run.wakeup",
               quarantine.c.headers["cloudEvents:subject"].astext == run_id))).scalar_one())


async def mark_replayed(conn: AsyncConnection, entry_id: int, *, by: str) -> None:
    await conn.execute(update(quarantine).where(quarantine.c.id == entry_id)
                       .values(replayed_at=func.now(), replayed_by=by))
