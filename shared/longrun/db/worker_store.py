"""The worker's store (``ports.stores.WorkerStore``) on PostgreSQL.

The common step is one statement sent on its own (``statements``, no transaction around it);
whatever needs several statements — an artifact's registration, a ledger key used before, a
wait's timers and kept events — gets a transaction of the engine's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.artifacts import ArtifactStore
from longrun.bus.eager import EagerPublisher
from longrun.db import actions as ledger
from longrun.db import leases, policies, runs
from longrun.db import timers as timer_rows
from longrun.db.artifacts import register
from longrun.db.driver import Pool
from longrun.db.errors import is_transient, is_unique_violation
from longrun.db.transaction import PgTransaction
from longrun.domain import TenantPolicy
from longrun.errors import LeaseLost
from longrun.ports import inbox
from longrun.ports.runs import Fence, LedgerRequest, StoredRun, Transition
from longrun.ports.stores import MatchKept


class PgWorkerStore:
    def __init__(self, *, engine: AsyncEngine, statements: Pool, artifacts: ArtifactStore,
                 match_kept: MatchKept, eager: EagerPublisher | None = None, eager_grace: float = 0.0) -> None:
        """``eager``: publishes a transition's messages right after its commit (``bus.eager``), the
        relay leaving them ``eager_grace`` seconds to it; without it the relay publishes them all."""
        self.engine = engine
        self.statements = statements
        self.artifacts = artifacts
        self.match_kept = match_kept
        self.eager = eager
        self.eager_grace = eager_grace if eager is not None else None

    async def take_on_wakeup(self, message: inbox.Message, owner: str, ttl: float,
                             served: Collection[str]) -> tuple[inbox.Handled, StoredRun | None]:
        async with self.statements.connection() as conn:
            return await leases.take_on_wakeup(conn, message, owner, ttl, served)

    async def adopt(self, owner: str, ttl: float, served: Collection[str], limit: int) -> list[StoredRun]:
        async with self.statements.connection() as conn:
            return await leases.adopt(conn, owner, ttl, served, limit)

    async def hand_over(self, run_id: str, fence: Fence) -> None:
        async with self.statements.connection() as conn:
            await leases.hand_over(conn, run_id, fence)

    async def load(self, run_id: str) -> StoredRun | None:
        async with self.statements.connection() as conn:
            return await runs.load(conn, run_id)

    async def extend_lease(self, run_id: str, fence: Fence, ttl: float) -> bool:
        async with self.engine.begin() as conn:
            return await leases.extend_lease(conn, run_id, fence, ttl)

    async def release_lease(self, run_id: str, fence: Fence) -> None:
        async with self.statements.connection() as conn:
            await leases.release_lease(conn, run_id, fence)

    async def commit(self, transition: Transition) -> StoredRun:
        after, eager = await self._commit(transition)
        if eager and self.eager is not None:
            rows = [(row_id, m) for row_id, m in zip(eager, transition.rides.messages, strict=True) if row_id is not None]
            self.eager.publish(after.snapshot.run_id, [r for r, _ in rows], [m for _, m in rows])
        return after

    async def _commit(self, transition: Transition) -> tuple[StoredRun, list[int | None]]:
        planned, fence, rides, call = transition.planned, transition.fence, transition.rides, transition.call
        riding = call if transition.first_call else None  # a first ledger row rides in the statement
        grace = self.eager_grace
        if transition.alone:
            try:
                async with self.statements.connection() as conn:
                    return await runs.write_eager(conn, planned, fence=fence, rides=rides, call=riding,
                                                  eager_grace=grace)
            except Exception as e:
                if riding is None or not is_unique_violation(e):
                    raise
            # The key is on the ledger after all: the move goes with one more attempt of the same
            # request, or is refused naming both hashes.
            riding = None
        async with self.engine.begin() as conn:
            if transition.artifact is not None:
                artifact = transition.artifact
                await register(conn, self.artifacts, artifact.ref, tenant_id=artifact.tenant_id, size=artifact.size,
                               media_type="application/json", run_id=planned.before.snapshot.run_id)
            after, eager = await runs.write_eager(conn, planned, fence=fence, rides=rides, call=riding,
                                                  eager_grace=grace)
            if call is not None and riding is None:
                await ledger.prepare(conn, **call.row())
            if transition.outcome is not None:
                outcome = transition.outcome
                await ledger.record(conn, outcome.key, outcome.status, **outcome.fields)
            if transition.settles_wait:
                await timer_rows.schedule_all(conn, transition.wait_timers)
                after = await self.match_kept(PgTransaction(conn), after)
            if transition.creates is not None:
                await transition.creates(PgTransaction(conn))
        return after, eager

    async def tenant_policy(self, tenant_id: str) -> TenantPolicy | None:
        async with self.engine.connect() as conn:
            return await policies.load(conn, tenant_id)

    async def resend(self, run_id: str, fence: Fence, ttl: float, attempt: LedgerRequest,
                     timers: Sequence[Mapping[str, Any]]) -> None:
        async with self.engine.begin() as conn:
            if not await leases.extend_lease(conn, run_id, fence, ttl):
                raise LeaseLost(run_id, fence.token)
            await ledger.prepare(conn, **attempt.row())
            await timer_rows.cancel_calls(conn, run_id, attempt.logical_action)
            await timer_rows.schedule_all(conn, [{"run_id": run_id, **timer} for timer in timers])

    async def requests(self, run_id: str, logical_actions: Collection[str]) -> dict[str, dict[str, Any]]:
        async with self.engine.connect() as conn:
            rows = await ledger.for_run(conn, run_id)
        return {row.logical_action: row.request for row in rows if row.logical_action in logical_actions}

    async def beat(self, idempotency_key: str, fencing_token: int, progress: Mapping[str, Any] | None, *,
                   timer_key: str | None, due_in: float) -> bool:
        async with self.statements.connection() as conn:
            return await ledger.beat(conn, idempotency_key, fencing_token=fencing_token,
                                     progress=None if progress is None else dict(progress), timer_key=timer_key,
                                     due_in=due_in)

    def unreachable(self, error: BaseException) -> bool:
        return is_transient(error)
