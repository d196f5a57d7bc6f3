"""The far sides' token buckets (``ports.rate_limits.RateLimits``) on PostgreSQL.

Every change locks the buckets' rows (in the order of their keys, so two calls charged in the same
buckets never deadlock), reads the database's clock, applies ``domain.rate_limit`` and writes the
result in one transaction: every worker's reservations queue in one line per bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.domain import rate_limit as buckets
from longrun.domain.rate_limit import Bucket, Charge, RateLimit

_NOW = text("SELECT extract(epoch FROM clock_timestamp()) AS now")
_COLUMNS = "bucket, level, extract(epoch FROM at) AS at, coalesce(extract(epoch FROM hold_until), 0) AS hold_until"
_LOCK = text(f"SELECT {_COLUMNS} FROM rate_limit_buckets WHERE bucket = ANY(:keys) ORDER BY bucket FOR UPDATE")
_HELD = text(f"SELECT {_COLUMNS}, extract(epoch FROM clock_timestamp()) AS now FROM rate_limit_buckets "
             "WHERE bucket = ANY(:keys)")
_CREATE = text("INSERT INTO rate_limit_buckets (bucket, level, at, rate, burst) "
               "VALUES (:bucket, :level, to_timestamp(:at), :rate, :level) ON CONFLICT DO NOTHING")
_SAVE = text("UPDATE rate_limit_buckets SET level = :level, at = to_timestamp(:at), rate = :rate, burst = :burst, "
             "hold_until = to_timestamp(nullif(:hold_until, 0)) WHERE bucket = :bucket")


async def lock(conn: AsyncConnection, wanted: Sequence[tuple[RateLimit, str]]) -> tuple[list[Bucket], float]:
    """The buckets ``wanted`` (created full if new), locked until the transaction ends, in its order,
    and the database's clock (epoch seconds)."""
    keys = sorted({key for _, key in wanted})
    found = await _read(conn, keys)
    missing = [(limit, key) for limit, key in wanted if key not in found]
    if missing:
        created = float((await conn.execute(_NOW)).scalar_one())
        for limit, key in missing:
            await conn.execute(_CREATE, {"bucket": key, "level": float(limit.burst), "at": created,
                                         "rate": limit.rate})
        found = await _read(conn, keys)
    # The clock once the locks are held: a transaction that waited for them acts at its own time.
    return [found[key] for _, key in wanted], float((await conn.execute(_NOW)).scalar_one())


async def _read(conn: AsyncConnection, keys: list[str]) -> dict[str, Bucket]:
    return {row.bucket: _bucket(row) for row in await conn.execute(_LOCK, {"keys": keys})}


def _bucket(row: Any) -> Bucket:
    return Bucket(row.bucket, float(row.level), float(row.at), float(row.hold_until))


async def save(conn: AsyncConnection, bucket: Bucket, limit: RateLimit) -> None:
    await conn.execute(_SAVE, {"bucket": bucket.key, "level": bucket.level, "at": bucket.at, "rate": limit.rate,
                               "burst": float(limit.burst), "hold_until": bucket.hold_until})


class PgRateLimits:
    """The worker's reservations and refunds, one short transaction each."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def reserve(self, charges: Sequence[tuple[RateLimit, str, float]]) -> tuple[float, str]:
        async with self.engine.begin() as conn:
            found, now = await lock(conn, [(limit, key) for limit, key, _ in charges])
            placed = buckets.reserve([Charge(b, limit, cost) for b, (limit, _, cost) in zip(found, charges)], now)
            for after, (limit, _, _) in zip(placed.buckets, charges):
                await save(conn, after, limit)
        return placed.go_at - now, placed.binding

    async def refund(self, limit: RateLimit, bucket: str, amount: float) -> None:
        async with self.engine.begin() as conn:
            (before,), now = await lock(conn, [(limit, bucket)])
            await save(conn, buckets.refund(before, limit, amount, now), limit)

    async def not_before(self, limit: RateLimit, bucket: str, seconds: float) -> None:
        async with self.engine.begin() as conn:
            (before,), now = await lock(conn, [(limit, bucket)])
            await save(conn, buckets.not_before(before, limit, now, seconds), limit)

    async def held(self, bucket_keys: Sequence[str]) -> float:
        async with self.engine.connect() as conn:
            rows = list(await conn.execute(_HELD, {"keys": list(bucket_keys)}))
        return buckets.held([_bucket(row) for row in rows], float(rows[0].now)) if rows else 0.0
