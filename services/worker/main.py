"""worker service: partition leases pick the wakeup queues; each wakeup takes a run's lease and advances it."""

from __future__ import annotations

import asyncio
import time

from longrun import run_kinds, service
from longrun.app import effects
from longrun.app.advance import Advancer
from longrun.artifacts import FilesystemArtifactStore
from longrun.bootstrap import consume_partitions, open_database, open_statements
from longrun.bus.consumer import OwnClaim
from longrun.config import Settings
from longrun.workflows import model_adapter

SERVICE = "worker"


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    statements = await open_statements(settings)
    kinds = run_kinds.load(settings)
    advancer = Advancer.on_postgres(engine=engine, statements=statements, kinds=kinds,
                                    model=model_adapter(settings),
                                    artifacts=FilesystemArtifactStore(settings.artifact_dir),
                                    instance_id=settings.instance_id, lease_ttl=settings.run_lease_ttl,
                                    concurrency=settings.worker_concurrency,
                                    clock=lambda: time.time() + settings.clock_skew,
                                    handover=effects.SlotHandover(settings.tenant_slots, settings.priority_aging,
                                                                  settings.partitions))
    try:
        await consume_partitions(settings, service=SERVICE, handler=OwnClaim(advancer.on_wakeup),
                                 stopping=stopping, health=health, on_outcome=advancer.after_ack,
                                 advertised=kinds.pins())
    finally:
        await advancer.drain()
        await statements.close()
        await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)
