"""scheduler service: consume run.create from the ingress queue; admit runs by tenant slots and priority."""

from __future__ import annotations

import asyncio
import functools
import logging

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import run_kinds, service
from longrun.app import effects
from longrun.bootstrap import bound_ingress, open_bus, open_database, watch
from longrun.bus import topology
from longrun.bus.consumer import QueueConsumer
from longrun.config import Settings
from longrun.db.engine import autocommit, psycopg_dsn
from longrun.services.scheduler import admitting
from longrun.services.scheduler.ingress import Ingress, refuse
from longrun.services.scheduler.producers import producer_tenants

SERVICE = "scheduler"
CREATE_BATCH = 16
"""run.creates waiting in the ingress handled in one transaction: under a burst, a create costs
one statement of its own (the create; the batch takes its tenants' locks first) instead of six
round trips."""
logger = logging.getLogger(__name__)


async def admission_loop(engine: AsyncEngine, settings: Settings, stopping: asyncio.Event) -> None:
    """Admit on every NOTIFY (a run created or finished) and at least twice a second."""
    wake = asyncio.Event()
    listener = asyncio.create_task(_listen(settings.database_url, wake, stopping))
    try:
        while not stopping.is_set():
            try:
                # Most rounds find nobody queued (a finished run's slot found no taker): one
                # statement then, no transaction.
                async with autocommit(engine) as conn:
                    queued = await admitting.queued_tenants(conn)
                if queued:
                    async with engine.begin() as conn:
                        admitted = await admitting.admit(conn, slots=settings.tenant_slots,
                                                         aging_seconds=settings.priority_aging, tenants=queued)
                    if admitted:
                        logger.info("admitted %d run(s)", len(admitted))
            except Exception:
                logger.exception("admission round failed")
            try:
                await asyncio.wait_for(wake.wait(), timeout=0.5)
            except TimeoutError:
                pass
            wake.clear()
    finally:
        listener.cancel()


async def _listen(database_url: str, wake: asyncio.Event, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(psycopg_dsn(database_url), autocommit=True) as conn:
                await conn.execute(f"LISTEN {effects.ADMISSION_CHANNEL}")
                async for _ in conn.notifies():
                    wake.set()
        except (psycopg.Error, OSError):
            await asyncio.sleep(1.0)


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    producers = producer_tenants(settings.producer_tenants, settings.amqp_url)
    engine = await open_database(settings)
    bus = await open_bus(settings, SERVICE)
    await bound_ingress(settings)
    kinds = run_kinds.load(settings)
    creates = Ingress(kinds=kinds, partitions=settings.partitions, slots=settings.tenant_slots,
                      max_input_bytes=settings.max_input_bytes, producers=producers)
    ingress = QueueConsumer(bus=bus, engine=engine, service=SERVICE, queue=topology.SCHEDULER_INGRESS_QUEUE,
                            handler=creates.handle, prefetch=settings.prefetch, max_attempts=settings.delivery_limit,
                            batch=CREATE_BATCH, prelude=creates.prelude,
                            refuser=functools.partial(refuse, partitions=settings.partitions))
    await ingress.start()
    admission = asyncio.create_task(admission_loop(engine, settings, stopping))
    watch(health, engine=engine, bus=bus)
    health.probe("consuming", lambda: ingress.alive)
    health.ready = True
    while not stopping.is_set():
        lost = asyncio.create_task(bus.lost.wait())
        stop = asyncio.create_task(stopping.wait())
        await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        lost.cancel()
        if bus.lost.is_set() and not stopping.is_set():
            await ingress.stop()
            await bus.ensure_connected()
            await ingress.start()
    await ingress.stop()
    admission.cancel()
    await asyncio.gather(admission, return_exceptions=True)
    await bus.close()
    await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)
