"""The circuit breakers' table: one row per far side, changed only under its row lock.

Every change reads the row ``FOR UPDATE`` with the database's clock, applies a pure transition of
``domain.breaker`` and writes the result, in the caller's transaction: two workers asking for the
probe at once are served one after the other, and only the first gets it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import sql_name
from longrun.domain.breaker import Breaker, BreakerState
from longrun.domain.run import RunStatus

_WAITING = sql_name(RunStatus.RETRY_SCHEDULED)
_CLOSED, _OPEN, _HALF_OPEN = (sql_name(s) for s in (BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN))

_COLUMNS = ("far_side, state, failures, extract(epoch FROM window_start) AS window_start, "
            "extract(epoch FROM reopen_at) AS reopen_at, probe_by, extract(epoch FROM probe_until) AS probe_until")
_LOCK = text(f"SELECT {_COLUMNS}, extract(epoch FROM clock_timestamp()) AS now FROM tool_health "
             "WHERE far_side = :f FOR UPDATE")
_CREATE = text(f"INSERT INTO tool_health (far_side, state) VALUES (:f, {_CLOSED}) ON CONFLICT DO NOTHING")
_SAVE = text("UPDATE tool_health SET state = :state, failures = :failures, window_start = to_timestamp(:window_start), "
             "reopen_at = to_timestamp(:reopen_at), probe_by = :probe_by, probe_until = to_timestamp(:probe_until), "
             "updated_at = now() WHERE far_side = :far_side")
_NOT_CLEAN = text(f"SELECT {_COLUMNS} FROM tool_health WHERE state <> {_CLOSED} OR failures > 0")
_PROBES_DUE = text(
    f"SELECT {_COLUMNS}, extract(epoch FROM clock_timestamp()) AS now FROM tool_health "
    f"WHERE (state = {_OPEN} AND reopen_at <= clock_timestamp() AND (probe_until IS NULL OR probe_until <= "
    f"clock_timestamp())) OR (state = {_HALF_OPEN} AND probe_until <= clock_timestamp()) "
    "ORDER BY far_side LIMIT :limit FOR UPDATE SKIP LOCKED")

# Both find waiting runs through ix_runs_wait_correlation_key, from the few breakers' rows.
_HEALED_WAITERS = text(
    "SELECT r.run_id, r.wait_correlation_key AS key FROM tool_health h JOIN runs r "
    "ON r.wait_correlation_key = :prefix || h.far_side "
    f"WHERE h.state = {_CLOSED} AND r.status = {_WAITING} LIMIT :limit")
_LONGEST_WAITER = text(
    f"SELECT run_id FROM runs WHERE wait_correlation_key = :k AND status = {_WAITING} "
    "ORDER BY updated_at LIMIT 1")


def _breaker(row: Any) -> Breaker:
    return Breaker(row.far_side, BreakerState(row.state), row.failures,
                   None if row.window_start is None else float(row.window_start),
                   None if row.reopen_at is None else float(row.reopen_at), row.probe_by,
                   None if row.probe_until is None else float(row.probe_until))


async def lock(conn: AsyncConnection, far_side: str) -> tuple[Breaker, float]:
    """The far side's breaker (created CLOSED if it has none), locked until the transaction ends, and
    the database's clock (epoch seconds) to apply a transition at."""
    row = (await conn.execute(_LOCK, {"f": far_side})).first()
    if row is None:
        await conn.execute(_CREATE, {"f": far_side})
        row = (await conn.execute(_LOCK, {"f": far_side})).first()
        assert row is not None
    return _breaker(row), float(row.now)


async def save(conn: AsyncConnection, breaker: Breaker) -> None:
    await conn.execute(_SAVE, {"far_side": breaker.far_side, "state": breaker.state.value,
                               "failures": breaker.failures, "window_start": breaker.window_start,
                               "reopen_at": breaker.reopen_at, "probe_by": breaker.probe_by,
                               "probe_until": breaker.probe_until})


async def not_clean(conn: AsyncConnection) -> list[Breaker]:
    """Every breaker that is not closed with nothing counted: a worker's copy of the table (a far
    side missing from it is healthy)."""
    return [_breaker(row) for row in await conn.execute(_NOT_CLEAN)]


async def probes_due(conn: AsyncConnection, *, limit: int) -> list[tuple[Breaker, float]]:
    """Breakers whose probe is due (``domain.breaker.probe_due``), locked (those another transaction
    holds are skipped), with the database's clock."""
    return [(_breaker(row), float(row.now)) for row in await conn.execute(_PROBES_DUE, {"limit": limit})]


async def healed_waiters(conn: AsyncConnection, prefix: str, *, limit: int) -> list[tuple[str, str]]:
    """(run_id, correlation key) of up to ``limit`` runs waiting on ``<prefix><far side>`` of a closed breaker."""
    rows = await conn.execute(_HEALED_WAITERS, {"prefix": prefix, "limit": limit})
    return [(row.run_id, row.key) for row in rows]


async def longest_waiter(conn: AsyncConnection, correlation_key: str) -> str | None:
    """The run that has waited on ``correlation_key`` longest (its last write the oldest)."""
    return (await conn.execute(_LONGEST_WAITER, {"k": correlation_key})).scalar()
