"""Workers in memory: the real ``Worker`` over the ``World``'s tables (``MemoryWorkerStore``, the
``ports.stores.WorkerStore`` of memory), its runs stepped one checkpoint at a time.

Each store call first awaits a ``checkpoint``, so a test can stop (or kill) a worker before any of
its reads and writes. What rides with a transition lands where the relay would take it: wakeups in
the world's pending deliveries, broadcasts in ``World.broadcasts``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from longrun.app import effects
from longrun.app.gateway import webhooks
from longrun.app.worker.loop import Taken, Worker
from longrun.artifacts import content_hash_of, object_key
from longrun.bus import wakeup
from longrun.db.inbox import Duplicate, Handled, Message
from longrun.db.leases import NOT_TAKEN
from longrun.db.schema import QUEUED_STATUS
from longrun.domain import TERMINAL, TenantPolicy
from longrun.domain.rate_limit import RateLimit
from longrun.envelope import Envelope
from longrun.errors import LeaseLost
from longrun.model import ModelAdapter, ScriptedModel
from longrun.ports.runs import Fence, Handover, LedgerRequest, Rides, StoredRun, Transition
from longrun.ports.runs import Message as OutboxMessage
from longrun.ports.stores import CrashPoints
from longrun.testing.checkpoints import Crashed, Turnstile, checkpoint
from longrun.testing.transaction import MemoryTransaction
from longrun.testing.world import AGING, SLOTS, World

WORKER_INBOX = "worker"


class MemoryWorkerStore:
    def __init__(self, world: World) -> None:
        self.world = world
        self.store = world.store

    async def take_on_wakeup(self, message: Message, owner: str, ttl: float,
                             served: Collection[str]) -> tuple[Handled, StoredRun | None]:
        await checkpoint("take on wakeup")
        store = self.store
        with store.transaction():
            claim = store.claim(WORKER_INBOX, message_id=message.message_id, message_type=message.message_type,
                                run_id=message.run_id)
            if isinstance(claim, Duplicate):
                return Handled(claim.outcome, True, None), None
            assert message.run_id is not None
            row = store.runs.get(message.run_id)
            fence, needs = None, None
            if row is not None and not store.served(row, served):
                needs = store.decline(message.run_id)
            elif row is None or not store.is_queued(row):
                fence = store.take_lease(message.run_id, owner, ttl)
            outcome = ({"taken": True, "owner": fence.owner, "token": fence.token} if fence is not None
                       else {"taken": False, "reason": f"this worker does not run {needs}"} if needs is not None
                       else {"taken": False, "reason": NOT_TAKEN})
            store.record_outcome(WORKER_INBOX, message_id=message.message_id, outcome=outcome)
        return Handled(outcome, False, None), None if fence is None else store.load(message.run_id)

    async def adopt(self, owner: str, ttl: float, served: Collection[str], limit: int) -> list[StoredRun]:
        await checkpoint("adopt")
        return [stored for run_id in self.store.adopt(owner, ttl, served, limit)
                if (stored := self.store.load(run_id)) is not None]

    async def hand_over(self, run_id: str, fence: Fence) -> None:
        await checkpoint("hand over")
        self.store.hand_over(run_id, fence)

    async def load(self, run_id: str) -> StoredRun | None:
        await checkpoint("load")
        return self.store.load(run_id)

    async def extend_lease(self, run_id: str, fence: Fence, ttl: float) -> bool:
        await checkpoint("extend lease")
        return self.store.extend_lease(run_id, fence, ttl)

    async def release_lease(self, run_id: str, fence: Fence) -> None:
        await checkpoint("release lease")
        self.store.release_lease(run_id, fence)

    async def commit(self, transition: Transition) -> StoredRun:
        await checkpoint("commit")
        planned, call = transition.planned, transition.call
        with self.store.transaction():
            if transition.artifact is not None:
                self.world.artifacts[transition.artifact.ref] = transition.artifact.size
            held = self.store.runs[planned.before.snapshot.run_id].admitted
            after = self.store.write(planned, fence=transition.fence)
            self._ride(planned.before.snapshot.run_id, transition.rides, held=held)
            if call is not None:
                self.store.prepare(**call.row())
            if transition.outcome is not None:
                outcome = transition.outcome
                self.store.record(outcome.key, outcome.status, **outcome.fields)
            if transition.settles_wait:
                for timer in transition.wait_timers:
                    self.store.schedule(**timer)
                after = await webhooks.match_kept(MemoryTransaction(self.world), after, clock=self.world.clock)
            if transition.creates is not None:
                await transition.creates(MemoryTransaction(self.world))
        return after

    async def tenant_policy(self, tenant_id: str) -> TenantPolicy | None:
        await checkpoint("tenant policy")
        return self.world.policies.get(tenant_id)

    async def resend(self, run_id: str, fence: Fence, ttl: float, attempt: LedgerRequest,
                     timers: Sequence[Mapping[str, Any]]) -> None:
        await checkpoint("resend")
        with self.store.transaction():
            if not self.store.extend_lease(run_id, fence, ttl):
                raise LeaseLost(run_id, fence.token)
            self.store.prepare(**attempt.row())
            self.store.cancel_calls(run_id, attempt.logical_action)
            for timer in timers:
                self.store.schedule(run_id=run_id, **timer)

    async def requests(self, run_id: str, logical_actions: Collection[str]) -> dict[str, dict[str, Any]]:
        await checkpoint("requests")
        return {row.logical_action: row.request for row in self.store.for_run(run_id)
                if row.logical_action in logical_actions}

    async def beat(self, idempotency_key: str, fencing_token: int, progress: Mapping[str, Any] | None, *,
                   timer_key: str | None, due_in: float) -> bool:
        await checkpoint("heartbeat")
        return self.store.beat(idempotency_key, fencing_token=fencing_token, progress=progress,
                               timer_key=timer_key, due_in=due_in)

    def unreachable(self, error: BaseException) -> bool:
        return False  # memory is always there

    def _ride(self, run_id: str, rides: Rides, *, held: bool) -> None:
        """``held``: the run was admitted when the write found it (a finished or parked run's slot)."""
        for timer in rides.timers:
            self.store.schedule(run_id=run_id, **timer)
        self.world.send(rides.messages)
        if rides.handover is not None and held:
            self._hand_over(rides.handover, run_id)
        # A notice to admission wakes the scheduler in PostgreSQL (as do, with a handover, a freed slot
        # no queued run takes and a key given back: a writer with a handover leaves them to its test).
        tenant = self.store.runs[run_id].tenant_id
        if (effects.ADMISSION_CHANNEL, tenant) in rides.notices:
            self.world.admit(tenant)

    def _hand_over(self, handover: Handover, ended: str) -> None:
        """As ``db.runs``' handover: the finished run's slot goes to its tenant's best queued run (priority
        plus one point per ``aging_seconds`` waited, then age; ``db.admission``), admitted and woken with
        the handover's wake, while the tenant's runs hold fewer slots than its own (else ``slots``). A run
        waiting for its concurrency key is passed over; the best run is taken only if it has no key, holds
        it, or takes the one the finished run gave back (``db.keys.hands_on``)."""
        rows = [r for r in self.store.runs.values() if r.tenant_id == handover.tenant_id]
        slots = self.world.tenant_slots.get(handover.tenant_id, handover.slots)
        if sum(1 for r in rows if r.admitted and r.snapshot.status not in TERMINAL) >= slots:
            return
        now = self.world.clock()
        gave = self.store.runs[ended]
        given_back = gave.key.key if gave.key is not None and gave.key_held else None
        queued = [r for r in rows if not r.admitted and r.snapshot.status is QUEUED_STATUS
                  and (r.key is None or r.key_held
                       or self.store.key_holders(r.tenant_id, r.key.key, besides=ended) < r.key.limit)]
        if not queued:
            return
        best = max(queued, key=lambda r: (r.snapshot.priority + (now - r.snapshot.created_at) / handover.aging_seconds,
                                          -r.snapshot.created_at))
        if best.key is not None and not best.key_held and best.key.key != given_back:
            return
        run = best.snapshot
        self.store.admit(run.run_id)
        kept = wakeup.wake(**handover.wake, run_id=run.run_id, revision=run.revision)
        self.world.send([OutboxMessage(wakeup.envelope(kept), handover.exchange, handover.routes[best.partition],
                                       best.partition)])


class MemoryArtifacts:
    """``ArtifactStore`` in memory: objects by their key (tenant and SHA-256)."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self.objects = {} if objects is None else objects

    async def put(self, tenant_id: str, data: bytes) -> str:
        content_hash = content_hash_of(data)
        self.objects[object_key(tenant_id, content_hash)] = data
        return content_hash

    async def get(self, tenant_id: str, content_hash: str) -> bytes:
        try:
            return self.objects[object_key(tenant_id, content_hash)]
        except KeyError:
            raise FileNotFoundError(object_key(tenant_id, content_hash)) from None

    async def location(self, tenant_id: str, content_hash: str) -> str:
        return f"memory:{object_key(tenant_id, content_hash)}"

    async def delete(self, tenant_id: str, content_hash: str) -> None:
        self.objects.pop(object_key(tenant_id, content_hash), None)


def _no_crash(name: str) -> None:
    return None


class MemoryWorker:
    """One worker process: the real ``Worker`` on the world's store, its clock and its run kinds."""

    def __init__(self, world: World, instance_id: str, *, lease_ttl: float, model: ModelAdapter | None = None,
                 crash_points: CrashPoints = _no_crash, model_limits: tuple[RateLimit, ...] = ()) -> None:
        self.world = world
        self.worker = Worker(store=MemoryWorkerStore(world), kinds=world.kinds, model=model or ScriptedModel({}),
                             artifacts=MemoryArtifacts(world.stored_objects), instance_id=instance_id,
                             lease_ttl=lease_ttl, clock=world.clock, rng=random.Random(0), crash_points=crash_points,
                             rate_limits=world.rate_limits, model_limits=model_limits,
                             handover=effects.SlotHandover(SLOTS, AGING, partitions=1))
        self._taken: dict[Fence, Taken] = {}

    def on_wakeup(self, message: Envelope) -> tuple[dict[str, Any], bool]:
        """The wakeup's inbox row and the lease: (outcome, duplicate). A lease taken is kept for ``advance``."""
        outcome = self.world.loop.run_until_complete(self.worker.on_wakeup(message))
        if isinstance(outcome.carried, Taken):
            self._taken[outcome.carried.fence] = outcome.carried
        return outcome.outcome, outcome.duplicate

    def advance(self, run_id: str, fence: Fence) -> Steps:
        """The step loop under ``fence`` (a lease ``on_wakeup`` took), stopped at its first checkpoint;
        each ``next`` lets it run to the next one (and yields its name) until the run leaves the worker."""
        lease = self._taken.pop(fence, None)
        if lease is None or lease.run_id != run_id:
            raise ValueError(f"run {run_id}: this worker took no lease {fence}")
        return Steps(Turnstile(self.world.loop, self.worker.run_steps(run_id, fence, lease.cause)))


class Steps(Iterator[str]):
    """A worker's step loop as an iterator over its checkpoints (``close``: SIGKILL it where it waits)."""

    def __init__(self, turnstile: Turnstile) -> None:
        self.turnstile = turnstile

    def __next__(self) -> str:
        if not self.turnstile.step():
            raise StopIteration
        assert self.turnstile.at is not None
        return self.turnstile.at

    def close(self) -> None:
        self.turnstile.kill()

    @property
    def crashed(self) -> str | None:
        """The crash point the loop died at (``checkpoints.Crashed``), once it ended."""
        task = self.turnstile.task
        if not task.done() or task.cancelled():
            return None
        error = task.exception()
        return str(error) if isinstance(error, Crashed) else None
