"""reconciler service: the sweeps that keep runs moving when nothing else would, plus the dead-letter keeper.

Every ``LONGRUN_RECONCILE_INTERVAL`` seconds one round of sweeps runs (``longrun.services.reconciler.sweeps``
says which, and in what order). All their work lives in PostgreSQL, so any number of replicas may
run side by side (see ``longrun.app.reconciler``).

Runs whose lease expired are re-woken by their own loop, which sleeps until the earliest held
lease runs out (never longer than the interval): a dead worker's runs wait out its lease, not
the lease and then the rest of a round.

The quarantine ingester is its own consumer task on ``longrun.quarantine``, and retention its own
loop: every ``LONGRUN_RETENTION_INTERVAL`` a pass prunes what the horizons no longer keep, archives
finished runs and sweeps orphaned artifacts (``longrun.services.reconciler.retention``). The database gauges of
``/metrics`` are a loop too: every ``LONGRUN_METRICS_INTERVAL`` the replica holding the collector's
lease reads them (``longrun.services.reconciler.gauges``).

SIGTERM: the round in flight finishes (its lookups are bounded by the tools' timeouts),
then the ingester is cancelled (a message not yet acked goes back to the queue, and the
inbox absorbs the copy) and the connections close.
"""

from __future__ import annotations

import asyncio
import logging

from longrun import run_kinds, service
from longrun.bootstrap import open_artifacts, open_bus, open_database, watch
from longrun.config import Settings
from longrun.services.reconciler import dead_letters, gauges
from longrun.services.reconciler.sweeps import Sweeper, keep_horizons

SERVICE = "reconciler"
logger = logging.getLogger(__name__)


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    bus = await open_bus(settings, SERVICE)
    store = open_artifacts(settings, engine)
    sweeper = Sweeper(engine, run_kinds.load(settings), store, settings)
    ingester = asyncio.create_task(
        dead_letters.ingest_quarantine_queue(bus, engine, delivery_limit=settings.delivery_limit),
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
