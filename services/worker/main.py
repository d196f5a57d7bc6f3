"""worker service: partition leases pick the wakeup queues; each wakeup takes a run's lease and advances
it. A run of a version this worker does not run waits for a worker that does (``Worker.adopt_waiting``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import run_kinds, service
from longrun.app import effects, tool_permits
from longrun.app.gateway import webhooks
from longrun.app.worker.loop import Worker
from longrun.artifacts import ArtifactStore
from longrun.bootstrap import consume_partitions, open_artifacts, open_bus, open_database, open_statements
from longrun.bus.eager import EagerPublisher
from longrun.bus.consumer import OwnClaim
from longrun.bus.progress import ProgressPublisher
from longrun.config import Settings
from longrun.db.breakers import PgBreakers
from longrun.db.spent_tenants import PgSpentTenants
from longrun.db.driver import Pool
from longrun.db.rate_limits import PgRateLimits
from longrun.db.tool_permits import PgToolPermits
from longrun.db.worker_store import PgWorkerStore
from longrun.services.worker.takeover import database_now, take_over_lapsed
from longrun.workflows import model_adapter

SERVICE = "worker"
ADOPT_INTERVAL = 1.0
"""Seconds between looks for runs waiting for a worker like this one (an indexed read of the few
runs waiting, if any)."""
RATE_LIMIT_LEAD = 2.0
"""Seconds ahead of its place in line a rate-limited call's run is woken: more than a timer's wake
takes to reach a worker (timer service, admission for the run it queued again, relay, broker), so the
call still goes at its place on a loaded machine too."""
logger = logging.getLogger(__name__)


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    statements = await open_statements(settings)
    kinds = run_kinds.load(settings)
    progress = ProgressPublisher(settings.amqp_url, name=f"{SERVICE}/{settings.instance_id}")
    eager = (EagerPublisher(await open_bus(settings, f"{SERVICE}-eager"), statements)
             if settings.eager_publish_grace > 0 else None)
    worker = on_postgres(engine=engine, statements=statements, kinds=kinds,
                                    eager=eager, eager_grace=settings.eager_publish_grace,
                                    model=model_adapter(settings, kinds),
                                    artifacts=open_artifacts(settings, engine),
                                    instance_id=settings.instance_id, lease_ttl=settings.run_lease_ttl,
                                    concurrency=settings.worker_concurrency,
                                    clock=lambda: time.time() + settings.clock_skew,
                                    handover=effects.SlotHandover(settings.tenant_slots, settings.priority_aging,
                                                                  settings.partitions),
                                    retry=settings.retry_policy(),
                                    breakers=PgBreakers(engine, settings.breaker(), cache_seconds=settings.breaker_cache),
                                    health_max_wait=settings.breaker_max_wait,
                                    budgets=effects.TenantBudgets(settings.tenant_budget_period,
                                                                  settings.tenant_token_budget,
                                                                  settings.tenant_cost_budget),
                                    spent_tenants=PgSpentTenants(engine),
                                    rate_limits=PgRateLimits(engine), rate_limit_lead=RATE_LIMIT_LEAD,
                                    model_limits=settings.model_rate_limits(),
                                    model_max_tokens=settings.model_max_tokens,
                                    tool_permits=PgToolPermits(engine, functools.partial(
                                        tool_permits.wake_waiter, producer=SERVICE)),
                                    progress=progress)
    adopting = asyncio.create_task(_adopt_waiting(worker, stopping))
    started = await database_now(statements)  # before this process takes any run
    taking_over = asyncio.create_task(take_over_lapsed(worker, statements, stopping, started))

    async def finish_in_hand() -> None:
        adopting.cancel()
        taking_over.cancel()
        await worker.drain(settings.worker_stop_grace)

    try:
        await consume_partitions(settings, service=SERVICE, handler=OwnClaim(worker.on_wakeup),
                                 stopping=stopping, health=health, on_outcome=worker.after_ack,
                                 advertised=kinds.pins(),
                                 # Its rounds in hand finish, or their calls end (freeing their tool permits),
                                 # while it is still a member: its runs are not taken over from it meanwhile,
                                 # and the reconciler frees a permit only once its holder is not one.
                                 before_leaving=finish_in_hand)
    finally:
        adopting.cancel()
        taking_over.cancel()
        await worker.drain()
        if eager is not None:
            await eager.close()
        await progress.close()
        await statements.close()
        await engine.dispose()


def on_postgres(*, engine: AsyncEngine, statements: Pool, artifacts: ArtifactStore,
                clock: Callable[[], float] = time.time, eager: EagerPublisher | None = None,
                eager_grace: float = 0.0, **options: Any) -> Worker:
    """The runtime's worker: its store is PostgreSQL (``db.worker_store``); with ``eager``, it
    publishes its own messages after their commit (``bus.eager``)."""
    store = PgWorkerStore(engine=engine, statements=statements, artifacts=artifacts,
                          match_kept=functools.partial(webhooks.match_kept, clock=clock),
                          eager=eager, eager_grace=eager_grace)
    return Worker(store=store, artifacts=artifacts, clock=clock, **options)


async def _adopt_waiting(worker: Worker, stopping: asyncio.Event) -> None:
    """Runs whose wakeup reached a worker that cannot run them wait for one that can: take them
    over when this is one (a worker that just joined, or one serving the version they were migrated to)."""
    while not stopping.is_set():
        try:
            while await worker.adopt_waiting():
                pass
        except Exception as e:
            logger.warning("taking over waiting runs failed (%r); trying again", e)
        try:
            await asyncio.wait_for(stopping.wait(), timeout=ADOPT_INTERVAL)
        except TimeoutError:
            pass


def main() -> None:
    service.run(SERVICE, serve)
