"""Worth running now: the far sides' circuit breakers as the reconciler tends them (the worker asks
them through ``ports.stores.Breakers``, on PostgreSQL ``db.breakers``).

The reconciler (``wake_for_health``, each round) wakes the runs waiting on ``tool-healthy:<far side>``
once that breaker is closed, and, for a breaker whose probe is due, reserves the probe for the run
that has waited longest and wakes it: waiting runs cost nothing, and no run polls.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app.tool_permits import wake_if_waiting
from longrun.db import tool_health
from longrun.db.transaction import PgTransaction
from longrun.domain import breaker as machine
from longrun.domain.breaker import TOOL_HEALTHY_PREFIX, BreakerSettings

PRODUCER = "reconciler"


async def wake_for_health(engine: AsyncEngine, settings: BreakerSettings, *, limit: int,
                          clock: Callable[[], float] = time.time) -> int:
    """One round: wake up to ``limit`` runs waiting on a closed breaker, and one run per breaker whose
    probe is due (its probe reserved for it). Returns how many runs were woken."""
    async with engine.connect() as conn:
        healed = await tool_health.healed_waiters(conn, TOOL_HEALTHY_PREFIX, limit=limit)
    woken = 0
    for run_id, key in healed:
        async with engine.begin() as conn:
            woken += await wake_if_waiting(PgTransaction(conn), run_id, key, clock(), producer=PRODUCER, why="healthy again")
    async with engine.begin() as conn:
        for due, now in await tool_health.probes_due(conn, limit=limit):
            key = f"{TOOL_HEALTHY_PREFIX}{due.far_side}"
            waiter = await tool_health.longest_waiter(conn, key)
            if waiter is None:
                continue  # nobody waits: the next run that needs it claims the probe
            await tool_health.save(conn, machine.reserve(due, run_id=waiter, now=now, settings=settings))
            woken += await wake_if_waiting(PgTransaction(conn), waiter, key, clock(), producer=PRODUCER, why="probe")
    return woken
