"""Taking over the runs of a worker that is gone, without waiting out their leases.

A worker renews its membership (``service_members.alive_until``) every third of
``LONGRUN_PARTITION_LEASE_TTL``; its run leases last ``LONGRUN_RUN_LEASE_TTL``, much longer. Once
its membership lapses (it died, or froze past that TTL) every live worker that runs its runs takes
them over (``db.leases.take_over_lapsed``), mid-call or between steps, looking every
``TAKEOVER_INTERVAL``: a run moves on within the membership TTL and a second, not its lease. A worker
that was only frozen is fenced when it resumes: the take bumped the fencing token, so its commit
is refused, and so is the request it sends afterwards at a far side that checks fencing tokens.
A worker restarted under the same ``LONGRUN_INSTANCE_ID`` renews the old membership row, so its
earlier process never looks lapsed: it takes back the runs that process held instead (leases set
before it started). The reconciler's sweep of expired leases stays the fallback.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from sqlalchemy import text

from longrun.app.worker.loop import Worker
from longrun.db import driver, leases
from longrun.db.driver import Pool

TAKEOVER_INTERVAL = 1.0
"""Seconds between looks for runs whose holder's membership lapsed (a read of the held leases)."""
TAKEOVER_BATCH = 32
_NOW = driver.Statement(text("SELECT now()"))
"""The database's clock: read as the worker starts, no lease it takes later expires before ``now() + ttl``."""

logger = logging.getLogger(__name__)


async def database_now(statements: Pool) -> datetime:
    async with statements.connection() as conn:
        now: datetime = (await driver.one(conn, _NOW)).now
    return now


async def take_over_lapsed(worker: Worker, statements: Pool, stopping: asyncio.Event, started: datetime) -> None:
    """Until ``stopping``: take over the runs of workers whose membership lapsed (or of an earlier
    process under this worker's name: leases set before ``started``, ``database_now`` read before
    this process took any), and advance them."""
    while not stopping.is_set():
        try:
            while True:
                async with statements.connection() as conn:
                    taken = await leases.take_over_lapsed(conn, worker.instance_id, worker.lease_ttl, worker.served,
                                                          TAKEOVER_BATCH, started)
                for stored, lapsed_owner in taken:
                    worker.recover(stored, lapsed_owner)
                if len(taken) < TAKEOVER_BATCH:
                    break
        except Exception as e:
            logger.warning("taking over the runs of lapsed workers failed (%r); trying again", e)
        try:
            await asyncio.wait_for(stopping.wait(), timeout=TAKEOVER_INTERVAL)
        except TimeoutError:
            pass
