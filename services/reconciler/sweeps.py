"""The reconciler's schedule: one round of sweeps, the loop that re-wakes runs whose lease expired,
and the retention loop (``longrun.services.reconciler`` runs them; each sweep lives in its own module).

A round, every ``LONGRUN_RECONCILE_INTERVAL``: settle actions in doubt (``reconcile_unknown``),
flag silent runs and runs no live worker can run, wake runs waiting for a far side that is healthy
again or whose probe is due (``tool_health.wake_for_health``), free the tool permits of workers
whose membership lapsed, each waking a run waiting for one (``db.tool_permits.free_dead``), run the
cleanups of finished runs that are due (``app.reconciler.cleanup``); every ``LONGRUN_DRIFT_INTERVAL`` it
also compares a batch of confirmed actions with the far side, walking through them round after
round. One sweep failing is logged and does not stop the others or the next round.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app.reconciler.cleanup import clean_up
from longrun.app.reconciler.common import METRICS
from longrun.app.reconciler.leases import rewake_expired
from longrun.app.reconciler.settle import ABANDONED_AFTER, settle_in_doubt
from longrun.app.tool_permits import wake_waiter
from longrun.artifacts import ArtifactStore
from longrun.authoring import Registry
from longrun.config import Settings
from longrun.db import run_leases, tool_permits
from longrun.db.cleanups import PgCleanupStore
from longrun.db.errors import is_transient
from longrun.db.reconcile_store import PgReconcileStore
from longrun.db.schema import CONSUMING_SERVICES
from longrun.services.reconciler import alerts, retention, tool_health

RECONCILE_BATCH = 50
LEASE_BATCH = 200
LEASE_EXPIRY_MARGIN = 0.02
"""Seconds past the earliest lease's end before it is swept (an expired lease ends before now())."""
DRIFT_BATCH = 20
HEALTH_BATCH = 200
PERMIT_BATCH = 200
CLEANUP_BATCH = 50
PRODUCER = "reconciler"

logger = logging.getLogger(__name__)


class Sweeper:
    """One round of sweeps; remembers where the drift walk is and when it is next due."""

    def __init__(self, engine: AsyncEngine, kinds: Registry, artifacts: ArtifactStore, settings: Settings,
                 clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.kinds = kinds
        self.artifacts = artifacts
        self.settings = settings
        self.clock = clock
        self._drift_after = ""
        self._drift_due = time.monotonic()
        self._reported: dict[str, int] = {}

    async def round(self) -> None:
        await self._step("reconcile", lambda: reconcile_unknown(
            self.engine, self.kinds, limit=RECONCILE_BATCH, clock=self.clock, artifacts=self.artifacts))
        await self._step("silence", lambda: alerts.flag_silent_runs(
            self.engine, limits=self.settings.silence_limits))
        await self._step("without worker", lambda: alerts.flag_runs_without_worker(self.engine))
        await self._step("tool health", lambda: tool_health.wake_for_health(
            self.engine, self.settings.breaker(), limit=HEALTH_BATCH, clock=self.clock))
        await self._step("tool permits", lambda: tool_permits.free_dead(
            self.engine, functools.partial(wake_waiter, producer=PRODUCER), limit=PERMIT_BATCH, clock=self.clock))
        await self._step("cleanup", lambda: clean_up(
            PgCleanupStore(self.engine), self.kinds, limit=CLEANUP_BATCH, clock=self.clock))
        if time.monotonic() >= self._drift_due:
            await self._step("drift", self._drift)
        self._report()

    async def sweep_leases(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            delay = self.settings.reconcile_interval
            try:
                if await rewake_expired_leases(self.engine, limit=LEASE_BATCH) == LEASE_BATCH:
                    continue
                until = await seconds_until_a_lease_expires(self.engine)
                # None: no lease held. <= 0: an expired lease is left (more than a batch, or one whose
                # wakeup failed: see the log); the next interval sweeps again rather than spinning.
                if until is not None and until > 0:
                    delay = min(delay, until + LEASE_EXPIRY_MARGIN)
            except Exception as e:
                if is_transient(e):
                    logger.warning("leases sweep: database unavailable (%r); retrying", e)
                else:
                    logger.exception("leases sweep failed; retrying")
            try:
                await asyncio.wait_for(stopping.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def _drift(self) -> None:
        sweep = await alerts.check_drift(self.engine, self.kinds, limit=DRIFT_BATCH, after=self._drift_after)
        self._drift_after = sweep.next_after
        # Walk on without pause until the end of the confirmed actions, then rest.
        if not sweep.next_after:
            self._drift_due = time.monotonic() + self.settings.drift_interval

    async def _step(self, name: str, sweep: Callable[[], Awaitable[object]]) -> None:
        try:
            await sweep()
        except Exception as e:
            if is_transient(e):
                logger.warning("%s sweep: database unavailable (%r); next round retries", name, e)
            else:
                logger.exception("%s sweep failed; next round retries", name)

    def _report(self) -> None:
        """Log the counters that moved since the last report (``/metrics`` exports them as Prometheus counters)."""
        moved = {k: v for k, v in METRICS.items() if self._reported.get(k) != v}
        if moved:
            logger.info("counters: %s", ", ".join(f"{k}={v}" for k, v in sorted(moved.items())))
            self._reported.update(moved)


def horizons(settings: Settings) -> retention.Horizons:
    """The retention horizons the settings give, by rule."""
    return retention.Horizons({
        "outbox": settings.retain_outbox, **{f"inbox_{s}": settings.retain_inbox for s in CONSUMING_SERVICES},
        "timers": settings.retain_timers, "webhook_events": settings.retain_webhook_events,
        "webhook_events_unmatched": settings.retain_unmatched_webhook_events,
        "delivery_failures": settings.retain_delivery_failures, "quarantine": settings.retain_replayed_quarantine,
        "service_members": settings.retain_dead_members, "audit_log": settings.retain_audit,
    }, settings.retain_finished_runs)


async def keep_horizons(engine: AsyncEngine, store: ArtifactStore, settings: Settings,
                        stopping: asyncio.Event) -> None:
    """A retention pass now and every ``retention_interval``; a failed pass is logged and the next retries."""
    kept = horizons(settings)
    while not stopping.is_set():
        try:
            await retention.run_pass(engine, store, kept, batch=settings.retention_batch,
                                     archive_batch=settings.archive_batch,
                                     orphan_grace=settings.artifact_orphan_grace)
        except Exception as e:
            if is_transient(e):
                logger.warning("retention pass: database unavailable (%r); next pass retries", e)
            else:
                logger.exception("retention pass failed; next pass retries")
        try:
            await asyncio.wait_for(stopping.wait(), timeout=settings.retention_interval)
        except TimeoutError:
            pass


async def reconcile_unknown(engine: AsyncEngine, registry: Registry, *, limit: int, clock: Callable[[], float],
                            artifacts: ArtifactStore | None = None,
                            abandoned_after: float = ABANDONED_AFTER) -> Counter[str]:
    """``settle_in_doubt`` (``app.reconciler.settle``) on PostgreSQL."""
    return await settle_in_doubt(PgReconcileStore(engine, artifacts), registry, limit=limit, clock=clock,
                                 artifacts=artifacts, abandoned_after=abandoned_after)


async def rewake_expired_leases(engine: AsyncEngine, *, limit: int) -> int:
    """``rewake_expired`` (``app.reconciler.leases``) on PostgreSQL."""
    return await rewake_expired(PgReconcileStore(engine), limit=limit)


async def seconds_until_a_lease_expires(engine: AsyncEngine) -> float | None:
    """Seconds (database clock) until the earliest held lease runs out; <= 0 when one has, None when none is held."""
    async with engine.connect() as conn:
        return await run_leases.seconds_until_one_expires(conn)
