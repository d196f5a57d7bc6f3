"""What the cleanup sweep (``app.reconciler.cleanup``) needs of storage: the cleanups due, and in one
transaction a claim, the finished run, its ledger rows, its events, the cleanup's schedule and the
alert. PostgreSQL in ``db.cleanups``, memory in ``testing.cleanup_store``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from longrun.domain import events as ev
from longrun.ports.runs import LedgerOutcome, LedgerRequest, StoredRun


@dataclass(frozen=True, slots=True)
class Claimed:
    """A cleanup taken for one attempt."""

    attempt: int
    """This attempt, 1-based."""
    alerted: bool
    """Whether an earlier attempt raised the cleanup's alert."""


class CleanupTransaction(Protocol):
    async def claim(self, run_id: str, *, hold: float) -> Claimed | None:
        """Take the cleanup of ``run_id`` if it is still due, leaving it due again ``hold`` seconds
        from now (its claimant died, if nothing else rescheduled it); None: done, or taken."""

    async def load(self, run_id: str) -> StoredRun | None:
        """The run, locked until the transaction ends."""

    async def ledger_status(self, idempotency_key: str) -> str | None:
        """The status of the ledger row of ``idempotency_key``; None: no attempt was recorded."""

    async def prepare(self, request: LedgerRequest) -> None:
        """The ledger row of an attempt, SUBMITTED before it is sent (one more attempt of the same key)."""

    async def record(self, outcome: LedgerOutcome) -> None: ...

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun: ...

    async def retry(self, run_id: str, *, delay: float, error: str) -> None:
        """The cleanup is due again in ``delay`` seconds, failed with ``error``, its alert raised."""

    async def done(self, run_id: str) -> None: ...

    async def alert(self, *, actor: str, action: str, target: str, reason: str,
                    details: Mapping[str, Any]) -> None: ...


class CleanupStore(Protocol):
    def unreachable(self, error: BaseException) -> bool:
        """Whether ``error`` says the store cannot be reached (the sweep stops and is tried again)."""

    async def due(self, *, limit: int) -> list[str]:
        """The runs whose cleanup is due, soonest first."""

    async def drop_due(self, kinds: Sequence[tuple[str, str]]) -> int:
        """Drop the due cleanups of runs of ``kinds`` (name, workflow version), whose kinds declare no
        cleanup step; how many."""

    def transaction(self) -> AbstractAsyncContextManager[CleanupTransaction]: ...
