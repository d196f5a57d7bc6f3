"""timer service: fires due timers exactly once per timer key, sharing the work among replicas.

The loop fires batches (``longrun.services.timer.batches.fire_due``, one transaction each, SKIP LOCKED
so any number of replicas run side by side) until less than a full batch was due, then
sleeps until the earliest unfired timer is due, asking PostgreSQL once per round (never
per run), and never longer than ``MAX_SLEEP``: timers scheduled meanwhile by other
services are not announced, so the cap bounds how late a freshly scheduled timer fires.
Once a full batch was due, ``LANES`` batches are in flight at once until the backlog is
gone: while PostgreSQL writes and commits one, this process prepares the next (SKIP LOCKED
keeps their timers and their runs apart, so lanes never wait on each other). When
the round before saw a whole batch coming due by the time it wakes (many timers set for the
same instant), the lanes start together instead of after a first batch fired alone.
Each round also fires the schedules due (``app.timer.schedules``), one transaction per schedule.
SIGTERM lets the batches in flight commit, then the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import run_kinds, service
from longrun.app.timer.schedules import Admission
from longrun.authoring import Registry
from longrun.bootstrap import open_database, watch
from longrun.config import Settings
from longrun.db.errors import is_transient
from longrun.domain import RetryPolicy
from longrun.services.timer import batches, schedules

SERVICE = "timer"
MAX_SLEEP = 0.5
"""Seconds; the longest a timer scheduled while the service sleeps waits before it is seen."""
ERROR_SLEEP = 1.0
LANES = 3
"""Batches in flight at once while a backlog lasts."""

logger = logging.getLogger(__name__)


async def fire_loop(engine: AsyncEngine, *, batch: int, stopping: asyncio.Event,
                    clock: Callable[[], float] = time.time, kinds: Registry | None = None,
                    retry: RetryPolicy = RetryPolicy(), admission: Admission | None = None) -> None:
    """``admission``: how the schedules' runs are created; without it no schedule is fired."""
    async def drain() -> None:
        while not stopping.is_set() and await batches.fire_due(
                engine, batch=batch, clock=clock, producer=SERVICE, kinds=kinds, retry=retry) == batch:
            pass

    burst = False
    while not stopping.is_set():
        try:
            if burst or await batches.fire_due(engine, batch=batch, clock=clock, producer=SERVICE,
                                              kinds=kinds, retry=retry) == batch:
                # A lane that fails stops; the others finish the backlog, then the first error is handled.
                failed = [r for r in await asyncio.gather(*(drain() for _ in range(LANES)), return_exceptions=True)
                          if r is not None]
                if failed:
                    raise failed[0]
            if admission is not None:
                await schedules.fire_due(engine, admission, clock=clock)
            delay, burst = await _sleep_for(engine, batch)
        except Exception as e:
            if is_transient(e):
                logger.warning("database unavailable (%r); retrying in %.1fs", e, ERROR_SLEEP)
            else:
                logger.exception("timer round failed; retrying in %.1fs", ERROR_SLEEP)
            delay, burst = ERROR_SLEEP, False
        try:
            await asyncio.wait_for(stopping.wait(), timeout=delay)
        except TimeoutError:
            pass


async def _sleep_for(engine: AsyncEngine, batch: int) -> tuple[float, bool]:
    """How long to sleep, and whether a whole batch will be due on waking."""
    coming = await batches.next_wakes(engine, batch=batch)
    if coming.first_in is None or coming.first_in <= 0:
        # Nothing unfired, or what is due is held by another replica (which keeps firing until
        # it runs out) or is a timer left unfired after a failure: no reason to spin on it.
        return MAX_SLEEP, False
    delay = min(coming.first_in, MAX_SLEEP)
    return delay, coming.batch_in is not None and coming.batch_in <= delay


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    watch(health, engine=engine)
    health.ready = True
    logger.info("firing timers in batches of %d", settings.timer_batch)
    kinds = run_kinds.load(settings)
    try:
        await fire_loop(engine, batch=settings.timer_batch, stopping=stopping,
                        clock=lambda: time.time() + settings.clock_skew, kinds=kinds,
                        retry=settings.retry_policy(),
                        admission=Admission(kinds, settings.partitions, settings.tenant_slots,
                                             settings.max_input_bytes))
    finally:
        health.ready = False
        await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)
