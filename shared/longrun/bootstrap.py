"""Composition helpers: open the database, the bus and the artifact store, waiting for the first two
with a clear message."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from longrun.artifacts import ArtifactStore, FilesystemArtifactStore
from longrun.bus import management, topology
from longrun.bus.connection import Bus
from longrun.bus.consumer import Handler, OutcomeHook, OwnClaim, PartitionedConsumer
from longrun.bus.partitions import PartitionOwnership
from longrun.config import Settings
from longrun.db.artifacts import RecordedUploads
from longrun.db.driver import Pool
from longrun.db.engine import check_reachable, make_engine
from longrun.errors import InfrastructureUnreachable
from longrun.service import Health

logger = logging.getLogger(__name__)


async def open_database(settings: Settings) -> AsyncEngine:
    engine = make_engine(settings.database_url, idle_transaction_timeout=settings.idle_transaction_timeout)
    await _patiently(lambda: check_reachable(engine), "PostgreSQL", settings.startup_patience)
    return engine


async def open_statements(settings: Settings) -> Pool:
    """The pool for statements sent by psycopg itself (``longrun.db.driver``); call after
    ``open_database``, which waits for PostgreSQL."""
    pool = Pool(settings.database_url)
    await pool.open()
    return pool


async def open_bus(settings: Settings, name: str) -> Bus:
    bus = Bus(settings.amqp_url, name=f"{name}/{settings.instance_id}", heartbeat=settings.amqp_heartbeat,
              topology=topology.build(partitions=settings.partitions, delivery_limit=settings.delivery_limit))
    await _patiently(bus.connect, "RabbitMQ", settings.startup_patience)
    return bus


async def bound_ingress(settings: Settings) -> None:
    """The ingress queue's bound (``LONGRUN_INGRESS_MAX_*``) set as a policy through the management
    API; call after ``open_bus`` has declared the queue."""
    await management.apply_policy(
        management.management_urls(settings.rabbitmq_management_url, settings.amqp_url),
        management.vhost_of(settings.amqp_url),
        topology.ingress_policy(max_length=settings.ingress_max_length, max_bytes=settings.ingress_max_bytes),
        queue=topology.SCHEDULER_INGRESS_QUEUE, patience=settings.startup_patience)


def open_artifacts(settings: Settings, engine: AsyncEngine) -> RecordedUploads:
    """The configured artifact store (``LONGRUN_ARTIFACT_STORE``), its uploads on record in ``engine``'s
    database for the orphan sweep."""
    store: ArtifactStore
    if settings.artifact_store == "s3":
        # Imported here: only deployments that store artifacts in S3 install the s3 extra.
        from longrun.s3_artifacts import S3ArtifactStore, S3Location

        store = S3ArtifactStore(S3Location(
            bucket=settings.s3_bucket, region=settings.s3_region, endpoint=settings.s3_endpoint,
            access_key_id=settings.s3_access_key_id, secret_access_key=settings.s3_secret_access_key,
            prefix=settings.s3_prefix, encryption=settings.s3_encryption, kms_key_id=settings.s3_kms_key_id))
    else:
        store = FilesystemArtifactStore(settings.artifact_dir)
    return RecordedUploads(engine, store)


def watch(health: Health, *, engine: AsyncEngine, bus: Bus | None = None) -> None:
    """Readiness probes for what a service depends on: PostgreSQL answers, the bus connection is up."""
    async def database_answers() -> bool:
        await check_reachable(engine)
        return True

    health.probe("postgresql", database_answers)
    if bus is not None:
        health.probe("rabbitmq", lambda: bus.connected)


async def keep_connected(bus: Bus) -> None:
    """For a process that publishes only now and then: reconnect whenever the connection drops."""
    while True:
        await bus.lost.wait()
        try:
            await bus.ensure_connected()
        except Exception:
            logger.exception("reconnecting to RabbitMQ failed; trying again")
            await asyncio.sleep(1.0)


async def _patiently(attempt_once, what: str, patience: float) -> None:  # type: ignore[no-untyped-def]
    """Containers start in any order: wait a while, then stop with what to start and how."""
    async for attempt in AsyncRetrying(retry=retry_if_exception_type(InfrastructureUnreachable),
                                       stop=stop_after_delay(patience),
                                       wait=wait_exponential_jitter(multiplier=0.5, max=5), reraise=True):
        with attempt:
            if attempt.retry_state.attempt_number > 1:
                logger.warning("waiting for %s (attempt %d)", what, attempt.retry_state.attempt_number)
            await attempt_once()


async def consume_partitions(settings: Settings, *, service: str, handler: Handler | OwnClaim,
                             stopping: asyncio.Event, health: Health, on_outcome: OutcomeHook | None = None,
                             advertised: Sequence[Mapping[str, str]] = (),
                             before_leaving: Callable[[], Awaitable[None]] | None = None) -> None:
    """Run a partitioned consumer for ``service`` until ``stopping``: leases decide which queues.
    ``advertised``: what this replica can run, kept in its membership row. ``before_leaving``: run on
    stopping, once the partitions are handed back and before the replica leaves the member list."""
    engine = await open_database(settings)
    bus = await open_bus(settings, service)
    consumer = PartitionedConsumer(
        bus=bus, engine=engine, service=service,
        queue_for=lambda k: topology.partition_queue(service, k), handler=handler,
        prefetch=settings.prefetch, max_attempts=settings.delivery_limit, on_outcome=on_outcome)
    ownership = PartitionOwnership(engine, service=service, instance_id=settings.instance_id,
                                   partitions=settings.partitions, ttl=settings.partition_lease_ttl,
                                   on_acquire=consumer.acquire, on_release=consumer.release,
                                   reconcile=consumer.reconcile, advertised=advertised)
    tasks = [asyncio.create_task(ownership.run()), asyncio.create_task(consumer.supervise())]
    watch(health, engine=engine, bus=bus)
    health.probe("consuming", lambda: consumer.consuming)
    health.ready = True
    await stopping.wait()
    health.ready = False
    await ownership.stop(before_leaving=before_leaving)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await bus.close()
    await engine.dispose()
