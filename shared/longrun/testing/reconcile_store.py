"""The reconciler's sweeps that move runs (``ports.stores.ReconcileStore``) in memory, over the ``World``'s
tables, and the entry points the ``World`` calls: the real ``app.reconciler.settle`` and ``app.reconciler.leases``
use cases, run on ``World.loop``.

The world's clock stands for the database clock: a ledger row is stale once its last write
(``ActionRow.updated``) is more than ``abandoned_after`` before now, a lease expired once its end is
before now. The world runs one transaction at a time, so locks never make anyone wait or skip.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from longrun.app.reconciler import leases, settle
from longrun.app.reconciler.settle import ABANDONED_AFTER
from longrun.db import outbox
from longrun.domain import TERMINAL, ActionStatus, RunStatus, cleanup, thaw
from longrun.domain import events as ev
from longrun.ports.runs import Artifact, LedgerOutcome, StoredRun
from longrun.ports.stores import Doubtful, ExpiredLease
from longrun.testing.tables import Tables

if TYPE_CHECKING:
    from longrun.testing.memory import ActionRow

_A = ActionStatus
SWEEP = 10_000
"""Every sweep's limit: far above what a test's world holds, so one sweep sees everything."""


# -- what the World calls ---------------------------------------------------------------------------------


def in_doubt(world: Tables, *, abandoned_after: float = ABANDONED_AFTER) -> list[tuple[str, str]]:
    """What the next ``reconcile_unknown`` would try to claim (``app.settle.in_doubt``)."""
    return world.loop.run_until_complete(settle.in_doubt(MemoryReconcileStore(world), limit=SWEEP,
                                                            abandoned_after=abandoned_after))


def reconcile_unknown(world: Tables, *, abandoned_after: float = ABANDONED_AFTER) -> Counter[str]:
    """``app.settle.settle_in_doubt`` over the world, its tools asking ``World.far_side``; receipts
    are kept inline."""
    return world.loop.run_until_complete(settle.settle_in_doubt(
        MemoryReconcileStore(world), world.kinds, limit=SWEEP, clock=world.clock, abandoned_after=abandoned_after))


def rewake_expired_leases(world: Tables) -> int:
    """``app.leases.rewake_expired`` over the world: the wakeups sent."""
    return world.loop.run_until_complete(leases.rewake_expired(MemoryReconcileStore(world), limit=SWEEP))


# -- the port --------------------------------------------------------------------------------------------


class MemoryReconcileStore:
    def __init__(self, world: Tables) -> None:
        self.world = world
        self.store = world.store

    def unreachable(self, error: BaseException) -> bool:
        return False  # memory is always there

    async def in_doubt(self, *, limit: int, abandoned_after: float,
                       held: Collection[RunStatus]) -> list[tuple[str, str]]:
        """As ``PgReconcileStore.in_doubt``; runs keep no time of their last write here, so held runs
        come in creation order."""
        stale = self.world.clock() - abandoned_after
        rows = sorted((a for a in self.store.actions.values() if not cleanup.is_cleanup(a.logical_action)),
                      key=lambda a: a.updated)
        found = [(a.run_id, a.logical_action) for a in rows
                 if a.status == _A.UNKNOWN.value or (a.status == _A.RECONCILING.value and a.updated < stale)][:limit]
        parked = [(run_id, row.snapshot) for run_id, row in self.store.runs.items()
                  if row.snapshot.status in held and any(a.status is _A.UNKNOWN for a in row.snapshot.actions)]
        for run_id, snapshot in parked[:limit]:
            found += [(run_id, a.logical_action) for a in snapshot.actions if a.status is _A.UNKNOWN]
        return found + [(a.run_id, a.logical_action) for a in rows if self._orphaned(a, stale)][:limit]

    def _orphaned(self, row: ActionRow, stale: float) -> bool:
        return (row.status == _A.SUBMITTED.value and row.updated < stale
                and self.store.runs[row.run_id].snapshot.status in TERMINAL)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryReconcileTransaction]:
        """All or nothing, what it sent and registered included (as ``World.in_transaction``)."""
        world = self.world
        sent, registered = (list(world.pending), list(world.broadcasts)), dict(world.artifacts)
        try:
            with self.store.transaction():
                yield MemoryReconcileTransaction(world)
        except BaseException:
            world.pending[:], world.broadcasts[:] = sent
            world.artifacts.clear()
            world.artifacts.update(registered)
            raise


class MemoryReconcileTransaction:
    def __init__(self, world: Tables) -> None:
        self.world = world
        self.store = world.store

    async def lock_run(self, run_id: str) -> StoredRun | None:
        return self.store.load(run_id)

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        return self.store.load(run_id)

    async def load_many(self, run_ids: Sequence[str]) -> dict[str, StoredRun]:
        loaded = {run_id: self.store.load(run_id) for run_id in sorted(set(run_ids))}
        return {run_id: stored for run_id, stored in loaded.items() if stored is not None}

    async def doubtful(self, run_id: str, logical_action: str, *, abandoned_after: float) -> Doubtful | None:
        row = next((a for a in self.store.actions.values()
                    if a.run_id == run_id and a.logical_action == logical_action), None)
        if row is None:
            return None
        request: Mapping[str, Any] = thaw(row.request)  # type: ignore[assignment]
        return Doubtful(row.idempotency_key, row.tool, row.effect_kind, request, row.status, row.last_error,
                        row.updated < self.world.clock() - abandoned_after)

    async def latest_claim(self, run_id: str, logical_action: str) -> int | None:
        return max((r.event.seq for r in self.store.event_rows(run_id)
                    if isinstance(r.event, ev.ReconciliationStarted) and r.event.logical_action == logical_action),
                   default=None)

    async def ledger_status(self, idempotency_key: str) -> str | None:
        row = self.store.actions.get(idempotency_key)
        return None if row is None else row.status

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun:
        return self.store.append(stored, events)

    async def record(self, outcome: LedgerOutcome) -> None:
        self.store.record(outcome.key, outcome.status, **outcome.fields)

    async def send(self, messages: Sequence[outbox.Message]) -> None:
        self.world.send(messages)

    async def register(self, artifact: Artifact, run_id: str) -> None:
        self.world.artifacts[artifact.ref] = artifact.size

    async def alert(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        self.world.audit_log.append({"actor": actor, "action": action, "target": target,
                                     "reason": reason, "details": dict(details)})

    async def clear_expired(self, limit: int) -> list[ExpiredLease]:
        return [self._clear(run_id) for run_id in self.store.expired_leases()[:limit]]

    async def clear_one_expired(self, skipping: Collection[str]) -> ExpiredLease | None:
        run_id = next((r for r in self.store.expired_leases() if r not in skipping), None)
        return None if run_id is None else self._clear(run_id)

    def _clear(self, run_id: str) -> ExpiredLease:
        row = self.store.runs[run_id]
        assert row.lease_owner is not None
        self.store.clear_lease(run_id)
        return ExpiredLease(run_id, row.lease_owner, row.fencing_token)
