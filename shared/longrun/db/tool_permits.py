"""Tool permits (``ports.tool_permits.ToolPermits``) on PostgreSQL.

A tenant's group is judged under its own advisory lock (taken in each transaction that takes or frees
one of its permits), so two workers taking the last permit at once are served one after the other. A
permit is live while its holder is a live worker (its ``service_members`` row, in the database's
time) that still holds the run's lease: a worker SIGKILLed mid-call holds nothing once its membership
lapses, long before its run leases would expire. Whoever frees a permit (the holder once the call's
outcome is recorded, or the reconciler's sweep for one no longer live) wakes the group's longest
waiter in the same transaction: one wake per permit freed.

The tenants' bounds are read for every tenant at once, at most once per ``cache_seconds`` per worker:
a call of a tenant without bounds, or of a tool no group bounds, runs no statement.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.db.schema import sql_name
from longrun.db.tenant_copy import TenantCopy
from longrun.db.transaction import PgTransaction
from longrun.domain.run import RunStatus
from longrun.domain.tool_permits import waiting_key

HOLDERS = "worker"
"""The service whose members hold permits."""

Wake = Callable[[PgTransaction, str, str, float], Awaitable[int]]
"""Wakes a run (its id) waiting on a key at a time; how many were woken (``app.tool_permits.wake_waiter``)."""

_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('tool_permits/' || :t || '/' || :g, 0))")
_HELD = (f"EXISTS (SELECT 1 FROM service_members AS m WHERE m.service = '{HOLDERS}' AND m.instance_id = p.holder "
         "AND m.alive_until > now()) "
         "AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = p.run_id AND r.lease_owner = p.holder)")
_OTHERS_LIVE = f"SELECT count(*) FROM tool_permits AS p WHERE p.tenant_id = :t AND p.tool_group = :g AND {_HELD}"
# Only a live member takes a permit: one whose membership lapsed (cut off from the database past its
# TTL) holds permits the others count as free, so a call of its would go past the bound.
_TAKER_LIVE = (f"EXISTS (SELECT 1 FROM service_members AS m WHERE m.service = '{HOLDERS}' AND m.instance_id = :h "
               "AND m.alive_until > now())")
_TAKE = text(
    "INSERT INTO tool_permits (tenant_id, tool_group, run_id, holder) SELECT :t, :g, :r, :h "
    f"WHERE {_TAKER_LIVE} AND ({_OTHERS_LIVE} AND NOT (p.run_id = :r AND p.holder = :h)) < :bound "
    "ON CONFLICT ON CONSTRAINT pk_tool_permits DO UPDATE SET taken_at = now() RETURNING 1")
_LIVE = text(_OTHERS_LIVE)
_RELEASE = text("DELETE FROM tool_permits WHERE tenant_id = :t AND tool_group = :g AND run_id = :r AND holder = :h "
                "RETURNING 1")
_FREE_IF_DEAD = text(f"DELETE FROM tool_permits AS p WHERE p.tenant_id = :t AND p.tool_group = :g AND p.run_id = :r "
                     f"AND p.holder = :h AND NOT ({_HELD}) RETURNING 1")
_DEAD = text(f"SELECT p.tenant_id, p.tool_group, p.run_id, p.holder FROM tool_permits AS p WHERE NOT ({_HELD}) "
             "LIMIT :limit")
# Oldest run first among those waiting (through ix_runs_wait_correlation_key): a run that found its
# permit taken again when woken keeps its turn.
_LONGEST_WAITER = text(
    f"SELECT run_id FROM runs WHERE wait_correlation_key = :k AND tenant_id = :t "
    f"AND status = {sql_name(RunStatus.RETRY_SCHEDULED)} ORDER BY created_at, run_id LIMIT 1")
_BOUNDS = text("SELECT tenant_id, tool_concurrency FROM tenant_limits WHERE tool_concurrency <> '{}'::jsonb")


async def _wake_longest(conn: AsyncConnection, wake: Wake, tenant_id: str, group: str, at: float) -> int:
    key = waiting_key(group)
    waiter = (await conn.execute(_LONGEST_WAITER, {"k": key, "t": tenant_id})).scalar()
    return 0 if waiter is None else await wake(PgTransaction(conn), waiter, key, at)


async def free_dead(engine: AsyncEngine, wake: Wake, *, limit: int, clock: Callable[[], float] = time.time) -> int:
    """Free up to ``limit`` permits that are no longer live (their holder's membership lapsed, or it
    gave up the run's lease without freeing them), each waking its group's longest waiter. Returns
    how many were freed."""
    async with engine.connect() as conn:
        dead = list(await conn.execute(_DEAD, {"limit": limit}))
    freed = 0
    for permit in dead:
        async with engine.begin() as conn:
            params = {"t": permit.tenant_id, "g": permit.tool_group, "r": permit.run_id, "h": permit.holder}
            await conn.execute(_LOCK, params)
            if (await conn.execute(_FREE_IF_DEAD, params)).first() is not None:
                freed += 1
                await _wake_longest(conn, wake, permit.tenant_id, permit.tool_group, clock())
    return freed


class PgToolPermits:
    """The worker's permits, one short transaction each, and its copy of the tenants' bounds."""

    def __init__(self, engine: AsyncEngine, wake: Wake, *, clock: Callable[[], float] = time.time,
                 cache_seconds: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.wake = wake
        self.clock = clock
        self._bounds: TenantCopy[dict[str, int]] = TenantCopy(
            engine, _BOUNDS, lambda row: dict(row.tool_concurrency), what="the tenants' tool concurrency",
            cache_seconds=cache_seconds, monotonic=monotonic)

    async def bounds(self, tenant_id: str) -> Mapping[str, int]:
        return await self._bounds.get(tenant_id) or {}

    async def take(self, tenant_id: str, group: str, bound: int, run_id: str, holder: str) -> bool:
        params: dict[str, Any] = {"t": tenant_id, "g": group, "r": run_id, "h": holder, "bound": bound}
        async with self.engine.begin() as conn:
            await conn.execute(_LOCK, params)
            return (await conn.execute(_TAKE, params)).first() is not None

    async def release(self, tenant_id: str, group: str, run_id: str, holder: str) -> None:
        params = {"t": tenant_id, "g": group, "r": run_id, "h": holder}
        async with self.engine.begin() as conn:
            await conn.execute(_LOCK, params)
            # Nothing deleted: the sweep freed it already (and woke a waiter for it).
            if (await conn.execute(_RELEASE, params)).first() is not None:
                await _wake_longest(conn, self.wake, tenant_id, group, self.clock())

    async def wake_if_free(self, tenant_id: str, group: str, bound: int, run_id: str) -> None:
        params = {"t": tenant_id, "g": group}
        async with self.engine.begin() as conn:
            await conn.execute(_LOCK, params)
            if (await conn.execute(_LIVE, params)).scalar_one() < bound:
                await self.wake(PgTransaction(conn), run_id, waiting_key(group), self.clock())
