"""When the runs' leases run out, by the database's clock (the reconciler's lease sweep sleeps until then)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_NEXT_EXPIRY = text("SELECT extract(epoch FROM min(lease_until) - now()) FROM runs WHERE lease_owner IS NOT NULL")


async def seconds_until_one_expires(conn: AsyncConnection) -> float | None:
    """Seconds until the earliest held lease runs out; <= 0 when one has, None when none is held."""
    seconds = (await conn.execute(_NEXT_EXPIRY)).scalar()
    return None if seconds is None else float(seconds)
