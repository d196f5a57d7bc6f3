"""The worker's loop: take a run's lease with its wakeup, keep it alive, and play rounds until the run
leaves this worker (parks, finishes, or the lease is lost), or the worker stops (``drain``: the run is
handed on between rounds).

A wakeup takes the lease and reads the run in the statement that records the wakeup in the
worker's inbox (so the delivery is acked at once); the lease travels with the consumer's outcome
to the hook that runs after the ack, and the rounds run from the run as taken, outside any
delivery. Each round's writes carry the expected revision AND the fencing token: a worker that
lost its lease changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from longrun import faults, logs, metrics, otel
from longrun.app import effects
from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.app.worker.rounds import play
from longrun.artifacts import ArtifactStore
from longrun.authoring import Registry
from longrun.domain import RetryPolicy
from longrun.domain.lease import MEMBER_LAPSED, recovered_by, recovery_cause
from longrun.domain.rate_limit import RateLimit
from longrun.envelope import Envelope
from longrun.errors import DecodeError, LeaseLost, StaleRevision
from longrun.model import ModelAdapter
from longrun.ports import inbox
from longrun.ports.inbox import Outcome
from longrun.ports.rate_limits import RateLimits
from longrun.ports.runs import Fence, StoredRun
from longrun.ports.stores import Breakers, CrashPoints, SpentTenants, WorkerStore
from longrun.ports.tool_permits import ToolPermits
from longrun.streaming import ProgressSink

logger = logging.getLogger("longrun.app.worker")
ADOPT_BATCH = 32


@dataclass(frozen=True, slots=True)
class Recovery:
    """A run taken up again after its worker was lost: how (``domain.lease.LEASE_EXPIRED`` or
    ``MEMBER_LAPSED``) and when (epoch seconds: the re-wake, or the takeover)."""

    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class Taken:
    """A run this worker took: its fence, what caused the take (``cause``: what every message of the
    turn names), the run as taken (None: read it when its turn comes), the trace context, and the
    recovery it is (None: an ordinary take)."""

    run_id: str
    fence: Fence
    cause: str
    taken: StoredRun | None = None
    trace: str | None = None
    recovery: Recovery | None = None


class Worker:
    def __init__(self, *, store: WorkerStore, kinds: Registry, model: ModelAdapter, artifacts: ArtifactStore,
                 instance_id: str, lease_ttl: float, concurrency: int = 64, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, handover: effects.SlotHandover | None = None,
                 crash_points: CrashPoints = faults.crash_point, retry: RetryPolicy = RetryPolicy(),
                 breakers: Breakers | None = None, health_max_wait: float = 600.0,
                 budgets: effects.TenantBudgets | None = None, spent_tenants: SpentTenants | None = None,
                 rate_limits: RateLimits | None = None, rate_limit_lead: float = 0.0,
                 model_limits: tuple[RateLimit, ...] = (), model_max_tokens: int = 1024,
                 tool_permits: ToolPermits | None = None, progress: ProgressSink | None = None) -> None:
        """``handover``: a run this worker finishes gives its tenant slot to the next queued run in
        the same statement (without it, admission is notified and does that). ``retry``: the policy
        of tools, models and kinds' failed steps (``step_retry``) that declare none. ``breakers``: the
        far sides' health (without them, every far side is called whatever it answered before); a run
        waiting for one to be healthy (or for a tool permit) looks again by itself after ``health_max_wait`` seconds.
        ``budgets``: a model call is charged to its tenant's budget period too (a tenant with a budget).
        ``spent_tenants``: a run about to ask the model while its tenant's budget is spent waits instead.
        ``rate_limits``: the far sides' token buckets (without them, no declared rate limit holds); a
        limited call's run is woken ``rate_limit_lead`` seconds ahead of its place and waits out the rest.
        ``model_limits``: the model provider's rate limits, a call reserving ``model_max_tokens`` beside its input.
        ``tool_permits``: the tenants' tool concurrency (without them, no tool group is bounded).
        ``progress``: where calls' live output goes (without it, nowhere)."""
        self.store = store
        self.kinds = kinds
        self.instance_id = instance_id
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.handover = handover
        self.budgets = budgets
        self.crash_point = crash_points
        self.far = FarSide(model=model, artifacts=artifacts, clock=clock, rng=rng or random.Random(), retry=retry,
                           breakers=breakers, health_max_wait=health_max_wait, lease_ttl=lease_ttl,
                           spent_tenants=spent_tenants, rate_limits=rate_limits, rate_limit_lead=rate_limit_lead,
                           model_limits=model_limits, model_max_tokens=model_max_tokens, tool_permits=tool_permits,
                           progress=progress)
        self.served = frozenset(kinds.serves())
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    # -- bus side -----------------------------------------------------------------------
    async def on_wakeup(self, envelope: Envelope) -> Outcome:
        """Consumer handler (``OwnClaim``): the wakeup's inbox row and the take of the run's lease in one
        statement; the lease, with the run as taken, is carried to ``after_ack``."""
        if envelope.run_id is None:
            raise DecodeError(f"a {envelope.type} on a worker's queue names no run to wake", b"")
        handled, stored = await self.store.take_on_wakeup(
            inbox.Message(envelope.event_id, envelope.type, envelope.run_id), self.instance_id, self.lease_ttl,
            self.served)
        lease = None
        if stored is not None:
            metrics.TAKE_DELAY.observe(max(0.0, self.clock() - envelope.occurred_at.timestamp()))
            fence = Fence(handled.outcome["owner"], handled.outcome["token"])
            recovered = recovered_by(envelope.causation_id)
            lease = Taken(envelope.run_id, fence, envelope.event_id, stored, trace=envelope.trace,
                          recovery=None if recovered is None else Recovery(recovered,
                                                                           envelope.occurred_at.timestamp()))
        return Outcome(envelope, handled.outcome, handled.duplicate, carried=lease)

    async def after_ack(self, outcome: Outcome) -> None:
        if isinstance(outcome.carried, Taken):
            self.start(outcome.carried)

    async def adopt_waiting(self, limit: int = ADOPT_BATCH) -> int:
        """Take over runs waiting for a worker that runs them, if this is one, and advance them: their
        wakeup reached a worker that could not. Returns how many (none once this worker stops)."""
        if self._stopping:
            return 0
        adopted = await self.store.adopt(self.instance_id, self.lease_ttl, self.served, limit)
        for stored in adopted:
            run = stored.snapshot
            metrics.RECOVERIES.labels("taken_over").inc()
            with logs.bound(run.run_id, run.tenant_id):
                logger.info("run %s: taken over (%s@%s)", run.run_id, run.kind, run.versions.workflow)
                fence = Fence(self.instance_id, stored.fencing_token)
                self.start(Taken(run.run_id, fence, f"adopted:{fence.owner}:{fence.token}", stored))
        return len(adopted)

    def recover(self, stored: StoredRun, lapsed_owner: str) -> None:
        """Advance a run this worker took over from ``lapsed_owner``, whose membership lapsed (it died,
        froze past its TTL, or stopped) while it held the run, mid-call or between steps; or from an
        earlier process under this worker's own name."""
        run = stored.snapshot
        metrics.RECOVERIES.labels(MEMBER_LAPSED).inc()
        holder = ("an earlier process of this name" if lapsed_owner == self.instance_id
                  else f"{lapsed_owner}, whose membership lapsed")
        with logs.bound(run.run_id, run.tenant_id):
            logger.info("run %s: taken over from %s (lease %d)", run.run_id, holder, stored.fencing_token)
        fence = Fence(self.instance_id, stored.fencing_token)
        self.start(Taken(run.run_id, fence, recovery_cause(MEMBER_LAPSED, lapsed_owner, fence.token - 1), stored,
                         recovery=Recovery(MEMBER_LAPSED, self.clock())))

    def start(self, lease: Taken) -> None:
        task = asyncio.create_task(self.advance(lease), name=f"advance {lease.run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, grace: float = 0.0) -> None:
        """On shutdown: each turn finishes the round in hand (a call is answered and recorded) and hands
        its run on to a live worker, within ``grace`` seconds; a turn still busy then is cancelled, its
        run taken over once this worker's membership lapsed as it leaves."""
        self._stopping = True
        deadline = time.monotonic() + grace
        while self._tasks and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self._tasks), timeout=left)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the turn -------------------------------------------------------------------------
    async def advance(self, lease: Taken) -> None:
        # The lease was taken with the wakeup: keep it alive while the run waits for a free slot too.
        heartbeat = asyncio.create_task(self._heartbeat(lease.run_id, lease.fence))
        taken = lease.taken
        if self._slots.locked():
            taken = None  # it will wait for a slot: others may append meanwhile, so read it then
        try:
            async with self._slots:
                # A child of the run's root: the wakeup's consumer knew it (``otel.root``), else the take read it.
                run_root = otel.root() or (taken.trace_root if taken is not None else None)
                with otel.run_span("advance run", run_root, cause=lease.trace, attributes={
                        "longrun.run_id": lease.run_id, "longrun.fencing_token": lease.fence.token}):
                    await self.run_steps(lease.run_id, lease.fence, lease.cause, taken, lease.recovery)
        finally:
            heartbeat.cancel()

    async def run_steps(self, run_id: str, fence: Fence, cause: str, taken: StoredRun | None = None,
                        recovery: Recovery | None = None) -> None:
        """Rounds until the run leaves this worker (parks, finishes, or the lease is lost) or the worker
        stops (the run handed on before the next round); a failure is logged and leaves the lease to
        expire. ``cause``: what the turn's messages name; ``recovery``: the run's first round committed
        is its first progress since it was recovered."""
        step = Step(self.store, self.kinds, fence, cause, self.clock, self.crash_point, self.handover, self.budgets)
        try:
            stored = taken if taken is not None else await step.load(run_id)
            while stored is not None:
                if self._stopping:
                    await step.hand_on(stored)
                    return
                started, kind = time.perf_counter(), stored.snapshot.kind
                try:
                    stored = await play(self.far, step, stored, self.kinds, self.served)
                    metrics.step(kind).observe(time.perf_counter() - started)
                    if recovery is not None:
                        metrics.RECOVERY_PROGRESS.labels(recovery.reason).observe(max(0.0, self.clock() - recovery.at))
                        recovery = None
                except StaleRevision:
                    # Someone appended meanwhile (a webhook, an operator): re-read and decide again.
                    stored = await step.load(run_id)
        except LeaseLost:
            logger.warning("run %s: lease %d lost; another worker owns it now", run_id, fence.token)
        except Exception as e:
            if not self.store.unreachable(e):
                logger.exception("run %s: step failed; the lease will expire and the run be retried", run_id)
            else:
                logger.warning("run %s: database unavailable (%r); lease left to expire", run_id, e)
        finally:
            await step.abandon()  # nothing this turn left running writes once it no longer holds the lease

    async def _heartbeat(self, run_id: str, fence: Fence) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                if not await self.store.extend_lease(run_id, fence, self.lease_ttl):
                    return
            except Exception as e:
                logger.warning("run %s: heartbeat failed (%r)", run_id, e)
