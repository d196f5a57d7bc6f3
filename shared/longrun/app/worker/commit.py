"""The commit of a step: what a round decided, as one ``Transition`` given to the store.

``Step`` is a run's turn on this worker: its fence and the message that caused the turn (what every
broadcast names as its cause). Each commit plans the events on the run as held (after any events
deferred to it), adds what rides along (the broadcast of a status change, a finished run's slot
handed on, a call's ledger row and timers) and hands the value to ``WorkerStore.commit``: the adapter
only persists it. A write that finds the run moved on (``StaleRevision``) is rebuilt on the new state
when it records what the far side answered, because an effect that happened must be recorded, not
asked for again.

A turn may leave calls running while it goes on (the losers of a satisfied join, ``in_flight``): the
lease is released only once they answered and were recorded (``landed``); their outcomes moved the
run on, so the releasing write then finds it stale and the round is decided again on the new state.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from longrun.app import effects
from longrun.app.wait_notices import wait_notices
from longrun.authoring import Registry, Tool
from longrun.domain import WORKER_HAS_WORK, ActionStatus, request_hash
from longrun.domain import events as ev
from longrun.errors import LeaseLost, StaleRevision
from longrun.ports.stores import CrashPoints, RunTransaction, WorkerStore
from longrun.ports.runs import (
    Artifact,
    Fence,
    LedgerOutcome,
    LedgerRequest,
    Planned,
    Rides,
    StoredRun,
    Transition,
    plan,
)

PRODUCER = "worker"
logger = logging.getLogger("longrun.app.worker")


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A call a decision asks for: the tool, the logical action it carries out, its idempotency key and
    its validated arguments."""

    tool: Tool
    logical_action: str
    key: str
    args: Mapping[str, Any]
    request_hash: str = field(init=False)
    """Of ``args`` (``domain.request_hash``): hashed once for the scope check, the prepared event and
    the ledger's row, which all name it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_hash", request_hash(self.tool.name, self.tool.version, args=dict(self.args)))

    def ledger(self, run_id: str, fence: Fence, answer: Mapping[str, Any] | None = None) -> LedgerRequest:
        """The ledger's record of this request under ``fence``; with ``answer``, confirmed with it."""
        tool = self.tool
        return LedgerRequest(
            action_id=str(uuid.uuid4()), run_id=run_id, logical_action=self.logical_action, tool=tool.name,
            tool_version=tool.version, effect_kind=tool.effect.value, idempotency_key=self.key,
            request_hash=self.request_hash, request=dict(self.args),
            fencing_token=fence.token, answer=answer)


@dataclass(frozen=True, slots=True)
class Step:
    """A run's turn on this worker: whose writes count (``fence``) and what caused the turn
    (``cause``: the wakeup's event id, or the adoption that took the run over)."""

    store: WorkerStore
    kinds: Registry
    fence: Fence
    cause: str
    clock: Callable[[], float]
    crash_point: CrashPoints
    handover: effects.SlotHandover | None = None
    budgets: effects.TenantBudgets | None = None
    """Without them, no model call is charged to its tenant's period."""
    in_flight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """Calls this turn left running while it went on, by logical action: each records its own outcome."""

    async def landed(self) -> bool:
        """Every call left running answered and was recorded (each is bounded by its start-to-close):
        the lease is not released under one. Whether there was any; the first that failed raises
        (e.g. ``LeaseLost``)."""
        tasks = list(self.in_flight.values())
        if tasks:
            await asyncio.wait(tasks)
            self.in_flight.clear()
        for task in tasks:
            error = task.exception()
            if error is not None:
                raise error
        return bool(tasks)

    async def abandon(self) -> None:
        """The turn ends without its lease (lost, or the worker stops): the calls left running are
        cancelled, so nothing writes after the lease; their durable timers and the reconciler take over."""
        tasks = list(self.in_flight.values())
        self.in_flight.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def hand_on(self, stored: StoredRun) -> None:
        """The worker stops between rounds: what the turn deferred is written, and the run is released
        as waiting for a worker that runs it (``WorkerStore.hand_over``), which a live one adopts; a run
        with no work for a worker (finished or parked meanwhile) is only released."""
        if stored.snapshot.status not in WORKER_HAS_WORK:
            await self.commit(stored, [], release=True)
            return
        await self.landed()
        if stored.unwritten:
            try:
                await self.commit(stored, [])
            except StaleRevision:
                pass  # the calls left running moved the run on: what was deferred is decided again
        await self.store.hand_over(stored.snapshot.run_id, self.fence)
        logger.info("run %s: handed on as this worker stops", stored.snapshot.run_id)

    def event(self, stored: StoredRun, cls: type[ev.RunEvent], *, offset: int = 1, **fields: Any) -> ev.RunEvent:
        return cls(seq=stored.seq(offset), at=self.clock(), **fields)

    async def load(self, run_id: str) -> StoredRun | None:
        """The run, if this turn still holds its lease."""
        stored = await self.store.load(run_id)
        if stored is None or stored.lease_owner != self.fence.owner or stored.fencing_token != self.fence.token:
            return None
        return stored

    async def commit(self, stored: StoredRun, events: Sequence[ev.RunEvent], *, release: bool = False,
                     call: ToolRequest | None = None, answer: Mapping[str, Any] | None = None,
                     artifact: Artifact | None = None, timers: Sequence[Mapping[str, Any]] = (),
                     creates: Callable[[RunTransaction], Awaitable[None]] | None = None) -> StoredRun:
        """``events`` after those deferred to this write; ``call`` recorded SUBMITTED (or CONFIRMED
        with the ledger columns of its ``answer``), watched by ``timers``; ``release``: the lease too,
        once the calls left running landed; ``creates``: runs created in the same transaction
        (``Transition.creates``)."""
        if release and await self.landed():
            # Their outcomes moved the run on: what was decided on the state before is decided again.
            raise StaleRevision(stored.snapshot.run_id, stored.snapshot.revision)
        if not events and not stored.unwritten:
            await self.store.release_lease(stored.snapshot.run_id, self.fence)
            return stored
        planned = plan(stored, events, release_lease=release)
        rides = self._rides(stored, planned)
        if timers:
            rides = replace(rides, timers=timers)
        request, first = stored.unwritten_request, True  # a first call recorded among the deferred events
        if call is not None:
            if request is not None:
                raise ValueError(f"run {stored.snapshot.run_id}: a deferred call must be written before another")
            request = call.ledger(stored.snapshot.run_id, self.fence, answer)
            first = stored.snapshot.action(call.logical_action) is None
        after = await self.store.commit(Transition(planned, self.fence, rides, call=request, first_call=first,
                                                   artifact=artifact, creates=creates))
        self.crash_point("worker.after_commit")
        return after

    async def finish(self, stored: StoredRun, cls: type[ev.RunEvent], **fields: Any) -> None:
        """Append one event that takes the run out of this worker, and release the lease with it."""
        await self.commit(stored, [self.event(stored, cls, **fields)], release=True)

    async def record_outcome(self, stored: StoredRun, key: str, status: ActionStatus,
                             build: Callable[[StoredRun], list[ev.RunEvent]], *, release: bool = False,
                             artifact: Artifact | None = None, **fields: Any) -> StoredRun | None:
        """Record what the far side answered for the ledger row of ``key``; the state to go on from,
        or None once the run parked. A concurrent append only makes it rebuild on the new state."""
        if stored.unwritten_request is not None:
            stored = await self.commit(stored, [])  # the call before this one goes on record first
        while True:
            events = build(stored)
            parked = release or any(isinstance(e, ev.RunStatusChanged | ev.WaitStarted) for e in events)
            if parked and await self.landed():
                stored = await self._reload(stored)  # their outcomes moved the run on: rebuilt on the new state
                continue
            planned = plan(stored, events, release_lease=parked)
            try:
                after = await self.store.commit(Transition(
                    planned, self.fence, self._rides(stored, planned), artifact=artifact,
                    outcome=LedgerOutcome(key, status, fields)))
            except StaleRevision:
                stored = await self._reload(stored)
                continue
            return None if parked else after

    async def _reload(self, stored: StoredRun) -> StoredRun:
        reloaded = await self.load(stored.snapshot.run_id)
        if reloaded is None:
            raise LeaseLost(stored.snapshot.run_id, self.fence.token) from None
        return reloaded

    async def resend(self, stored: StoredRun, call: ToolRequest, ttl: float,
                     timers: Sequence[Mapping[str, Any]]) -> None:
        """The same submission sent again by a new lease holder: one more attempt on the ledger,
        under the new fencing token, watched by its own timers; no event and no charge (it was
        charged when first made)."""
        run_id = stored.snapshot.run_id
        await self.store.resend(run_id, self.fence, ttl, call.ledger(run_id, self.fence), timers)

    def _rides(self, stored: StoredRun, planned: Planned) -> Rides:
        run = stored.snapshot
        public = self.kinds.public_receipts(run.kind, run.versions.workflow)
        rides = effects.broadcast_rides(run, planned.after, producer=PRODUCER, cause=self.cause, public=public,
                                        handover=self.handover)
        charge = effects.tenant_charge(run.tenant_id, [e for e, applied in planned.rows if applied], self.budgets)
        if charge is not None:
            rides = replace(rides, tenant_charge=charge)
        asked = wait_notices(planned, producer=PRODUCER, cause=self.cause)
        if asked:
            rides = replace(rides, messages=(*rides.messages, *asked))
        if stored.written is None:
            return rides
        # A move deferred to this write (READY -> RUNNING) is announced too, first, as if written alone.
        deferred = effects.broadcast_message(stored.written.snapshot, stored, producer=PRODUCER, cause=self.cause)
        return rides if deferred is None else replace(rides, messages=(deferred, *rides.messages))
