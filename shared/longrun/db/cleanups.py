"""Cleanups on PostgreSQL (``ports.cleanups``): the ``cleanups`` rows, each due by the database clock;
every claim and outcome one transaction (``engine.begin()``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.db import actions as ledger
from longrun.db import runs
from longrun.db.audit import audit, tenant_of_run
from longrun.db.errors import is_transient
from longrun.domain import events as ev
from longrun.ports.cleanups import Claimed
from longrun.ports.runs import LedgerOutcome, LedgerRequest, StoredRun

_DUE = text("SELECT run_id FROM cleanups WHERE done_at IS NULL AND due_at <= now() ORDER BY due_at LIMIT :limit")
# Taken only while due: of two reconcilers, the second finds it due later and leaves it.
# Through ix_cleanups_due; one statement per round however many runs finished.
_DROP_DUE = text(
    "DELETE FROM cleanups c USING runs r WHERE c.run_id = r.run_id AND c.done_at IS NULL AND c.due_at <= now() "
    "AND (r.workflow, r.workflow_version) IN "
    "(SELECT * FROM unnest(CAST(:names AS text[]), CAST(:versions AS text[])))")
_CLAIM = text(
    "UPDATE cleanups SET attempts = attempts + 1, due_at = now() + make_interval(secs => CAST(:hold AS float8)) "
    "WHERE run_id = :run_id AND done_at IS NULL AND due_at <= now() RETURNING attempts, alerted")
_RETRY = text(
    "UPDATE cleanups SET due_at = now() + make_interval(secs => CAST(:delay AS float8)), last_error = :error, "
    "alerted = true WHERE run_id = :run_id")
_DONE = text("UPDATE cleanups SET done_at = now(), last_error = NULL WHERE run_id = :run_id AND done_at IS NULL")


class PgCleanupStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def unreachable(self, error: BaseException) -> bool:
        return is_transient(error)

    async def due(self, *, limit: int) -> list[str]:
        async with self.engine.connect() as conn:
            return [r.run_id for r in await conn.execute(_DUE, {"limit": limit})]

    async def drop_due(self, kinds: Sequence[tuple[str, str]]) -> int:
        if not kinds:
            return 0
        async with self.engine.begin() as conn:
            dropped = await conn.execute(_DROP_DUE, {"names": [n for n, _ in kinds], "versions": [v for _, v in kinds]})
            return int(dropped.rowcount)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgCleanupTransaction]:
        async with self.engine.begin() as conn:
            yield PgCleanupTransaction(conn)


class PgCleanupTransaction:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def claim(self, run_id: str, *, hold: float) -> Claimed | None:
        row = (await self.conn.execute(_CLAIM, {"run_id": run_id, "hold": hold})).first()
        return None if row is None else Claimed(row.attempts, row.alerted)

    async def load(self, run_id: str) -> StoredRun | None:
        return await runs.load(self.conn, run_id, lock=True)

    async def ledger_status(self, idempotency_key: str) -> str | None:
        row = await ledger.get(self.conn, idempotency_key)
        return None if row is None else row.status

    async def prepare(self, request: LedgerRequest) -> None:
        await ledger.prepare(self.conn, **request.row())

    async def record(self, outcome: LedgerOutcome) -> None:
        await ledger.record(self.conn, outcome.key, outcome.status, **outcome.fields)

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun:
        return await runs.append(self.conn, stored, events)

    async def retry(self, run_id: str, *, delay: float, error: str) -> None:
        await self.conn.execute(_RETRY, {"run_id": run_id, "delay": delay, "error": error})

    async def done(self, run_id: str) -> None:
        await self.conn.execute(_DONE, {"run_id": run_id})

    async def alert(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        await audit(self.conn, actor=actor, action=action, target=target, reason=reason, details=dict(details),
                    tenant=tenant_of_run(target))
