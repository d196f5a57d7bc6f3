"""The reconciler's sweeps that move runs (``ports.stores.ReconcileStore``) on PostgreSQL: candidates read
on a connection of their own, each claim, settlement or lease sweep one transaction (``engine.begin()``).

Staleness and lease expiry are measured by the database clock (``now()``), so reconcilers on hosts
whose clocks disagree judge the same rows alike. Runs are locked with SKIP LOCKED where a sweep may
meet a run another replica (or a worker) is writing: it is left for the next sweep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.artifacts import ArtifactStore
from longrun.db import actions as ledger
from longrun.db import outbox, run_batches, runs
from longrun.db.artifacts import register
from longrun.db.audit import audit, tenant_of_run
from longrun.db.errors import is_transient
from longrun.db.schema import actions, run_events, sql_names
from longrun.db.schema import runs as runs_table
from longrun.domain import TERMINAL, ActionStatus, RunStatus, cleanup
from longrun.domain import events as ev
from longrun.ports.runs import Artifact, LedgerOutcome, StoredRun
from longrun.ports.stores import Doubtful, ExpiredLease

_A = ActionStatus

_EXPIRED = "lease_owner IS NOT NULL AND lease_until <= now()"
_CLEAR_EXPIRED = text(
    "UPDATE runs AS r SET lease_owner = NULL, lease_until = NULL "
    f"FROM (SELECT run_id, lease_owner, fencing_token FROM runs WHERE {_EXPIRED} "
    "      ORDER BY lease_until LIMIT :limit FOR UPDATE SKIP LOCKED) AS e "
    "WHERE r.run_id = e.run_id "
    "RETURNING r.run_id, e.lease_owner, e.fencing_token")
_CLEAR_ONE_EXPIRED = text(
    "UPDATE runs AS r SET lease_owner = NULL, lease_until = NULL "
    f"FROM (SELECT run_id, lease_owner, fencing_token FROM runs WHERE {_EXPIRED} "
    "        AND run_id <> ALL(CAST(:failed AS text[])) "
    "      ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED) AS e "
    "WHERE r.run_id = e.run_id "
    "RETURNING r.run_id, e.lease_owner, e.fencing_token")


_NOT_CLEANUP = ~actions.c.logical_action.startswith(cleanup.PREFIX, autoescape=True)
"""A finished run's cleanup steps settle their own doubts (``app.reconciler.cleanup``)."""


def _stale(abandoned_after: float) -> ColumnElement[Any]:
    return func.now() - timedelta(seconds=abandoned_after)


class PgReconcileStore:
    """``artifacts``: where receipts too large to keep inline were uploaded (their location is registered)."""

    def __init__(self, engine: AsyncEngine, artifacts: ArtifactStore | None = None) -> None:
        self.engine = engine
        self.artifacts = artifacts

    def unreachable(self, error: BaseException) -> bool:
        return is_transient(error)

    async def in_doubt(self, *, limit: int, abandoned_after: float,
                       held: Collection[RunStatus]) -> list[tuple[str, str]]:
        stale = _stale(abandoned_after)
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(actions.c.run_id, actions.c.logical_action)
                .where(or_(actions.c.status == _A.UNKNOWN.value,
                           and_(actions.c.status == _A.RECONCILING.value, actions.c.updated_at < stale)),
                       _NOT_CLEANUP)
                .order_by(actions.c.updated_at).limit(limit))
            found = [(r.run_id, r.logical_action) for r in rows]
            parked = await conn.execute(
                select(runs_table.c.run_id, runs_table.c.snapshot["actions"].label("actions"))
                # Literals, not parameters: the planner then matches ix_runs_held's predicate (HELD).
                .where(text(f"runs.status IN ({sql_names(held)})"),
                       runs_table.c.snapshot["actions"].contains([{"status": _A.UNKNOWN.value}]))
                .order_by(runs_table.c.updated_at).limit(limit))
            for row in parked:
                found += [(row.run_id, a["logical_action"]) for a in row.actions if a["status"] == _A.UNKNOWN.value]
            orphans = await conn.execute(
                select(actions.c.run_id, actions.c.logical_action)
                .join(runs_table, runs_table.c.run_id == actions.c.run_id)
                .where(actions.c.status == _A.SUBMITTED.value, actions.c.updated_at < stale,
                       runs_table.c.status.in_([s.value for s in TERMINAL]), _NOT_CLEANUP)
                .order_by(actions.c.updated_at).limit(limit))
            return found + [(r.run_id, r.logical_action) for r in orphans]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgReconcileTransaction]:
        async with self.engine.begin() as conn:
            yield PgReconcileTransaction(conn, self.artifacts)


class PgReconcileTransaction:
    def __init__(self, conn: AsyncConnection, artifacts: ArtifactStore | None) -> None:
        self.conn = conn
        self.artifacts = artifacts

    async def lock_run(self, run_id: str) -> StoredRun | None:
        if (await self.conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == run_id)
                                    .with_for_update(skip_locked=True))).first() is None:
            return None
        return await runs.load(self.conn, run_id)

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        return await runs.load(self.conn, run_id, lock=lock)

    async def load_many(self, run_ids: Sequence[str]) -> dict[str, StoredRun]:
        return await run_batches.load_many(self.conn, run_ids)

    async def doubtful(self, run_id: str, logical_action: str, *, abandoned_after: float) -> Doubtful | None:
        row = (await self.conn.execute(
            select(actions, (actions.c.updated_at < _stale(abandoned_after)).label("stale"))
            .where(actions.c.run_id == run_id, actions.c.logical_action == logical_action)
            .with_for_update())).first()
        return None if row is None else Doubtful(row.idempotency_key, row.tool, row.effect_kind, row.request,
                                                 row.status, row.last_error, row.stale)

    async def latest_claim(self, run_id: str, logical_action: str) -> int | None:
        return (await self.conn.execute(
            select(func.max(run_events.c.seq))
            .where(run_events.c.run_id == run_id, run_events.c.type == ev.ReconciliationStarted.type,
                   run_events.c.data["logical_action"].astext == logical_action))).scalar()

    async def ledger_status(self, idempotency_key: str) -> str | None:
        return (await self.conn.execute(select(actions.c.status)
                                        .where(actions.c.idempotency_key == idempotency_key))).scalar()

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun:
        return await runs.append(self.conn, stored, events)

    async def record(self, outcome: LedgerOutcome) -> None:
        await ledger.record(self.conn, outcome.key, outcome.status, **outcome.fields)

    async def send(self, messages: Sequence[outbox.Message]) -> None:
        await outbox.enqueue_many(self.conn, messages)

    async def register(self, artifact: Artifact, run_id: str) -> None:
        assert self.artifacts is not None, "an uploaded receipt names the store it was uploaded to"
        await register(self.conn, self.artifacts, artifact.ref, tenant_id=artifact.tenant_id, size=artifact.size,
                       media_type="application/json", run_id=run_id)

    async def alert(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        await audit(self.conn, actor=actor, action=action, target=target, reason=reason, details=details,
                    tenant=tenant_of_run(target))

    async def clear_expired(self, limit: int) -> list[ExpiredLease]:
        rows = await self.conn.execute(_CLEAR_EXPIRED, {"limit": limit})
        return [ExpiredLease(r.run_id, r.lease_owner, r.fencing_token) for r in rows]

    async def clear_one_expired(self, skipping: Collection[str]) -> ExpiredLease | None:
        row = (await self.conn.execute(_CLEAR_ONE_EXPIRED, {"failed": sorted(skipping)})).first()
        return None if row is None else ExpiredLease(row.run_id, row.lease_owner, row.fencing_token)
