"""reconciler service: the sweeps that keep runs moving when nothing else would, plus the dead-letter keeper.

Every ``LONGRUN_RECONCILE_INTERVAL`` seconds one round runs, in order: settle actions in
doubt (``reconcile_unknown``), flag silent runs, wake runs waiting for a far side that is
healthy again or whose probe is due (``tool_health.wake_for_health``); every
``LONGRUN_DRIFT_INTERVAL`` it also compares a batch of confirmed actions with the far side,
walking through them round after round. All their work lives in PostgreSQL, so any number
of replicas may run side by side (see ``longrun.app.reconcile``). One sweep failing is
logged and does not stop the others or the next round.

Runs whose lease expired are re-woken by their own loop, which sleeps until the earliest held
lease runs out (never longer than the interval): a dead worker's runs wait out its lease, not
the lease and then the rest of a round.

The quarantine ingester is its own consumer task on ``longrun.quarantine``, and retention its own
loop: every ``LONGRUN_RETENTION_INTERVAL`` a pass prunes what the horizons no longer keep, archives
finished runs and sweeps orphaned artifacts (``longrun.app.retention``). The database gauges of
``/metrics`` are a loop too: every ``LONGRUN_METRICS_INTERVAL`` the replica holding the collector's
lease reads them (``longrun.app.gauges``).

SIGTERM: the round in flight finishes (its lookups are bounded by the tools' timeouts),
then the ingester is cancelled (a message not yet acked goes back to the queue, and the
inbox absorbs the copy) and the connections close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import run_kinds, service
from longrun.app import gauges, reconcile, retention, tool_health
from longrun.artifacts import ArtifactStore, FilesystemArtifactStore
from longrun.authoring import Registry
from longrun.bootstrap import open_bus, open_database, watch
from longrun.config import Settings
from longrun.db.errors import is_transient
from longrun.db.schema import CONSUMING_SERVICES

SERVICE = "reconciler"
RECONCILE_BATCH = 50
LEASE_BATCH = 200
LEASE_EXPIRY_MARGIN = 0.02
"""Seconds past the earliest lease's end before it is swept (an expired lease ends before now())."""
DRIFT_BATCH = 20
HEALTH_BATCH = 200

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
        await self._step("reconcile", lambda: reconcile.reconcile_unknown(
            self.engine, self.kinds, limit=RECONCILE_BATCH, clock=self.clock, artifacts=self.artifacts))
        await self._step("silence", lambda: reconcile.flag_silent_runs(
            self.engine, limits=self.settings.silence_limits))
        await self._step("without worker", lambda: reconcile.flag_runs_without_worker(self.engine))
        await self._step("tool health", lambda: tool_health.wake_for_health(
            self.engine, self.settings.breaker(), limit=HEALTH_BATCH, clock=self.clock))
        if time.monotonic() >= self._drift_due:
            await self._step("drift", self._drift)
        self._report()

    async def sweep_leases(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            delay = self.settings.reconcile_interval
            try:
                if await reconcile.rewake_expired_leases(self.engine, limit=LEASE_BATCH) == LEASE_BATCH:
                    continue
                until = await reconcile.seconds_until_a_lease_expires(self.engine)
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
        sweep = await reconcile.check_drift(self.engine, self.kinds, limit=DRIFT_BATCH, after=self._drift_after)
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
        moved = {k: v for k, v in reconcile.METRICS.items() if self._reported.get(k) != v}
        if moved:
            logger.info("counters: %s", ", ".join(f"{k}={v}" for k, v in sorted(moved.items())))
            self._reported.update(moved)


def horizons(settings: Settings) -> retention.Horizons:
    """The retention horizons the settings give, by rule."""
    return retention.Horizons({
        "outbox": settings.retain_outbox, **{f"inbox_{s}": settings.retain_inbox for s in CONSUMING_SERVICES},
        "timers": settings.retain_timers, "webhook_events": settings.retain_webhook_events,
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


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    bus = await open_bus(settings, SERVICE)
    store = FilesystemArtifactStore(settings.artifact_dir)
    sweeper = Sweeper(engine, run_kinds.load(settings), store, settings)
    ingester = asyncio.create_task(
        reconcile.ingest_quarantine_queue(bus, engine, delivery_limit=settings.delivery_limit),
        name="quarantine ingester")

    def ingester_ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("quarantine ingester stopped", exc_info=task.exception())

    ingester.add_done_callback(ingester_ended)
    watch(health, engine=engine, bus=bus)
    # Dead letters would pile up unseen: not ready, so the rollout and the operator notice.
    health.probe("consuming", lambda: not ingester.done())
    leases = asyncio.create_task(sweeper.sweep_leases(stopping), name="expired leases")
    pruning = asyncio.create_task(keep_horizons(engine, store, settings, stopping), name="retention")
    collecting = asyncio.create_task(gauges.collect(
        engine, instance_id=settings.instance_id, interval=settings.metrics_interval,
        silence_limits=settings.silence_limits, tenants=settings.metrics_tenant_label, stopping=stopping),
        name="metrics collector")
    health.ready = True
    logger.info("sweeping every %.1fs; silence limits %s", settings.reconcile_interval,
                {s.value: v for s, v in settings.silence_limits.items()})
    try:
        while not stopping.is_set():
            await sweeper.round()
            try:
                await asyncio.wait_for(stopping.wait(), timeout=settings.reconcile_interval)
            except TimeoutError:
                pass
    finally:
        health.ready = False
        ingester.cancel()
        # A pass stops between or inside its transactions: each is whole or rolled back, and an archive
        # stored but never registered is an orphan the next sweep removes.
        pruning.cancel()
        await asyncio.gather(ingester, leases, pruning, collecting, return_exceptions=True)
        await bus.close()
        await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)
