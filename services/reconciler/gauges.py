"""The database gauges of ``longrun.metrics``, collected by one elected process.

Figures that must agree with the database (runs by status, actions by status, the outbox backlog,
the quarantine, silent runs, runs waiting for a worker) are read in one read-only REPEATABLE READ
transaction, so they describe one moment. Every replica of the reconciler runs ``collect``; only the
holder of the collector's lease (``partition_leases`` row ``metrics``/0, taken like a partition's)
reads and exports them. The others export none of them, and a holder that loses the lease withdraws
its own: Prometheus never sees two copies to sum. The reads are ``longrun.db.gauges``.

Cost: eight aggregate statements per interval. Runs and actions are counted whole (group by: their
cost follows the rows retention keeps), silent runs read ``status_since`` from the snapshots of the
open runs in a limited status without a live lease (the reconciler's silent-run sweep reads the same
every round), the rest go through partial indexes (actions in doubt, unpublished outbox rows, runs
awaiting a worker, cleanups not done) or over a small table (the quarantine). Measured on a 2-core
machine shared with other work (``tests/integration/test_gauges.py`` prints it): 22-25 ms at 10,000 runs and 10,000
actions; 400-650 ms at 100,000 of each with 20,000 of those runs READY and silent, half of it the
silent-run count. Every ``LONGRUN_METRICS_INTERVAL`` (15 s), so under 5 % of one core at that size.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import metrics
from longrun.db import gauges as figures
from longrun.db import membership
from longrun.db.errors import is_transient
from longrun.domain import RunStatus

logger = logging.getLogger(__name__)

COLLECTOR = "metrics"
"""The collector's lease: ``partition_leases`` row (COLLECTOR, 0)."""


def withdraw() -> None:
    """Export none of the database gauges (this process does not hold the collector's lease)."""
    metrics.DATABASE.figures = None


async def take_lease(engine: AsyncEngine, instance_id: str, ttl: float) -> bool:
    """Take or renew the collector's lease; whether this process holds it."""
    async with engine.begin() as conn:
        await membership.ensure_partitions(conn, COLLECTOR, 1)
        return bool(await membership.acquire(conn, COLLECTOR, instance_id, {0}, ttl))


async def collect_once(engine: AsyncEngine, *, silence_limits: Mapping[RunStatus, float], tenants: bool) -> float:
    """Read the gauges and export them; the seconds the queries took."""
    async with engine.connect() as plain:
        conn = await plain.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        async with conn.begin():
            metrics.DATABASE.figures = await figures.read(conn, silence_limits=silence_limits, tenants=tenants)
    return metrics.DATABASE.figures.took


async def collect(engine: AsyncEngine, *, instance_id: str, interval: float, silence_limits: Mapping[RunStatus, float],
                  tenants: bool, stopping: asyncio.Event) -> None:
    """Every ``interval``: collect while holding the collector's lease (kept for three intervals, so a
    dead holder is replaced within them), withdraw otherwise. Released on stop."""
    held = False
    try:
        while not stopping.is_set():
            try:
                held = await take_lease(engine, instance_id, 3 * interval)
                if held:
                    await collect_once(engine, silence_limits=silence_limits, tenants=tenants)
                else:
                    withdraw()
            except Exception as e:
                withdraw()
                if is_transient(e):
                    logger.warning("metrics collection: database unavailable (%r); next interval retries", e)
                else:
                    logger.exception("metrics collection failed; next interval retries")
            try:
                await asyncio.wait_for(stopping.wait(), timeout=interval)
            except TimeoutError:
                pass
    finally:
        withdraw()
        if held:
            try:
                async with engine.begin() as conn:
                    await membership.release(conn, COLLECTOR, instance_id, {0})
            except Exception as e:
                logger.warning("metrics collector lease not released (%r); it expires by itself", e)
