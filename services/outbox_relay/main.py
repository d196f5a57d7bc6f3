"""outbox-relay service: partition leases decide which outbox partitions this replica publishes."""

from __future__ import annotations

import asyncio

from longrun import service
from longrun.bootstrap import open_bus, open_database, open_statements, watch
from longrun.bus.partitions import PartitionOwnership
from longrun.config import Settings
from longrun.relay import Relay

SERVICE = "outbox-relay"


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    bus = await open_bus(settings, SERVICE)
    statements = await open_statements(settings)
    relay = Relay(statements, bus, batch=settings.relay_batch, poll_interval=settings.relay_poll_interval)
    ownership = PartitionOwnership(engine, service=SERVICE, instance_id=settings.instance_id,
                                   partitions=settings.partitions, ttl=settings.partition_lease_ttl,
                                   on_acquire=relay.acquire, on_release=relay.release)
    watch(health, engine=engine, bus=bus)
    health.ready = True
    tasks = [asyncio.create_task(ownership.run()), asyncio.create_task(relay.run(stopping)),
             asyncio.create_task(relay.listen(settings.database_url, stopping))]
    await stopping.wait()
    await ownership.stop()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await bus.close()
    await statements.close()
    await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)
