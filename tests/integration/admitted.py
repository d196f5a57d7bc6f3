"""A run written straight through ``db.runs`` (no scheduler) as admission leaves it: holding a slot.

Every run a worker took was admitted; one that is not, woken from its wait, is queued for admission
rather than woken onto a worker (``domain.slots``)."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.ports.runs import StoredRun


async def admitted(conn: AsyncConnection, stored: StoredRun) -> StoredRun:
    await conn.execute(text("UPDATE runs SET admitted_at = now() WHERE run_id = :r"), {"r": stored.snapshot.run_id})
    return replace(stored, admitted=True)
