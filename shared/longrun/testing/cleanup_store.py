"""The cleanup sweep (``ports.cleanups.CleanupStore``) in memory, over the ``World``'s tables, and the entry
point the ``World`` calls: the real ``app.reconciler.cleanup`` use case, run on ``World.loop``. The world's
clock stands for the database clock; it runs one transaction at a time."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from longrun.app.reconciler.cleanup import clean_up as clean_up_due
from longrun.domain import events as ev
from longrun.ports.cleanups import Claimed
from longrun.ports.runs import LedgerOutcome, LedgerRequest, StoredRun
from longrun.testing.tables import Tables

SWEEP = 10_000
"""The sweep's limit: far above what a test's world holds."""


def clean_up(world: Tables) -> Counter[str]:
    """``app.reconciler.cleanup.clean_up`` over the world (a seeded jitter: the same run, the same delays)."""
    return world.loop.run_until_complete(clean_up_due(MemoryCleanupStore(world), world.kinds, limit=SWEEP,
                                                      clock=world.clock, rng=random.Random(0)))


def next_due(world: Tables) -> float | None:
    """When the soonest cleanup not done is due (the world's clock), if any."""
    return min((row.due_at for row in world.store.cleanups.values() if row.done_at is None), default=None)


class MemoryCleanupStore:
    def __init__(self, world: Tables) -> None:
        self.world = world

    def unreachable(self, error: BaseException) -> bool:
        return False  # memory is always there

    async def due(self, *, limit: int) -> list[str]:
        now = self.world.clock()
        due = sorted((row.due_at, run_id) for run_id, row in self.world.store.cleanups.items()
                     if row.done_at is None and row.due_at <= now)
        return [run_id for _, run_id in due[:limit]]

    async def drop_due(self, kinds: Sequence[tuple[str, str]]) -> int:
        now, store = self.world.clock(), self.world.store
        dropped = [run_id for run_id, row in store.cleanups.items()
                   if row.done_at is None and row.due_at <= now
                   and (store.runs[run_id].snapshot.kind, store.runs[run_id].snapshot.versions.workflow) in kinds]
        for run_id in dropped:
            del store.cleanups[run_id]
        return len(dropped)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryCleanupTransaction]:
        """All or nothing, the audit rows it wrote included."""
        audit = list(self.world.audit_log)
        try:
            with self.world.store.transaction():
                yield MemoryCleanupTransaction(self.world)
        except BaseException:
            self.world.audit_log[:] = audit
            raise


class MemoryCleanupTransaction:
    def __init__(self, world: Tables) -> None:
        self.world = world
        self.store = world.store

    async def claim(self, run_id: str, *, hold: float) -> Claimed | None:
        row = self.store.cleanups.get(run_id)
        now = self.world.clock()
        if row is None or row.done_at is not None or row.due_at > now:
            return None
        self.store.cleanups[run_id] = replace(row, attempts=row.attempts + 1, due_at=now + hold)
        return Claimed(row.attempts + 1, row.alerted)

    async def load(self, run_id: str) -> StoredRun | None:
        return self.store.load(run_id)

    async def ledger_status(self, idempotency_key: str) -> str | None:
        row = self.store.actions.get(idempotency_key)
        return None if row is None else row.status

    async def prepare(self, request: LedgerRequest) -> None:
        self.store.prepare(**request.row())

    async def record(self, outcome: LedgerOutcome) -> None:
        self.store.record(outcome.key, outcome.status, **outcome.fields)

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun:
        return self.store.append(stored, events)

    async def retry(self, run_id: str, *, delay: float, error: str) -> None:
        row = self.store.cleanups[run_id]
        self.store.cleanups[run_id] = replace(row, due_at=self.world.clock() + delay, last_error=error, alerted=True)

    async def done(self, run_id: str) -> None:
        row = self.store.cleanups[run_id]
        if row.done_at is None:
            self.store.cleanups[run_id] = replace(row, done_at=self.world.clock(), last_error=None)

    async def alert(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        self.world.audit_log.append({"actor": actor, "action": action, "target": target,
                                     "reason": reason, "details": dict(details)})
