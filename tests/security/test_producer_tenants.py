"""Producers bound to their tenants (docs/bus.md): the ingress admits a run.create only in a tenant
its publishing broker user is allowed (LONGRUN_PRODUCER_TENANTS). Anything else is answered
``tenant_not_allowed`` on the create's tenant, audited, not quarantined, and creates nothing, while
the ingress keeps flowing. Two real broker users, made as docs/bus.md says, and the real ensemble."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika
import aiormq
import pytest
from sqlalchemy import text

from bench.ensemble import TENANT, Producer
from longrun.bus import topology
from longrun.db import quarantine as quarantine_rows
from longrun.services.gateway import quarantine
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, run_id_for, status_of
from tests.security.test_bus_tenancy import (INGRESS, Subscriber, _connect, producers, publish_create, run_create,
                                             tenant_user)

pytestmark = pytest.mark.integration

__all__ = ["tenant_user"]  # the fixture, shared with test_bus_tenancy


def _answer(subscriber: Subscriber, correlation_id: str) -> Any:
    async def answered() -> dict[str, Any] | None:
        seen = subscriber.of(correlation_id)
        return seen[0].envelope if seen else None
    return answered


async def _quarantined_then_replayed(engine, bus, create: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    """``create`` kept in the scheduler's quarantine (as after a handler that kept failing), then
    replayed by an operator: the gateway publishes it again as the runtime, naming no publisher."""
    async with engine.begin() as conn:
        entry = await quarantine_rows.put(
            conn, owner="scheduler", queue=topology.SCHEDULER_INGRESS_QUEUE, body=json.dumps(create).encode(),
            headers={}, message_id=create["event_id"], error_code="handler_error", reason="kept failing",
            attempts=5)
    await quarantine.replay(engine, bus, entry, actor="ops", reason="fixed", replay_window=86400)


@pytest.mark.long
@pytest.mark.timeout(300)
async def test_a_producer_creates_runs_only_in_the_tenants_its_broker_user_is_allowed(
        clean, engine, bus, services, tmp_path, tenant_user) -> None:  # type: ignore[no-untyped-def]
    acme_user = await asyncio.to_thread(tenant_user, "acme")
    other_user = await asyncio.to_thread(tenant_user, "other")
    # Given the ensemble, each tenant's user allowed its own tenant, and each tenant's consumer
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "worker", "relay", **producers(acme_user, other_user))
    acme, other = Subscriber(acme_user), Subscriber(other_user)
    await acme.start()
    await other.start()
    try:
        # When acme's user publishes a create for tenant other, and one for acme naming no user_id
        spoofed = run_create("other", "spoofed", "key-spoofed", 1)
        unnamed = run_create("acme", "unnamed", "key-unnamed", 1)
        await publish_create(acme_user, spoofed)
        await publish_create(acme_user, unnamed, named=False)
        # and the spoofed create is replayed: sent again as it was by other's own user, and a create
        # for acme put back on the ingress from the quarantine
        await publish_create(other_user, spoofed)
        replayed = run_create("acme", "replayed", "key-replayed", 1)
        await _quarantined_then_replayed(engine, bus, replayed)
        # and then each tenant's user creates a run of its own
        await publish_create(acme_user, run_create("acme", "mine", "key-mine", 1))
        await publish_create(other_user, run_create("other", "theirs", "key-theirs", 1))

        # Then the ingress kept flowing: both runs of their own complete
        await eventually(acme.finishing("mine"), timeout=120, interval=0.2, what="acme's own run")
        await eventually(other.finishing("theirs"), timeout=60, interval=0.2, what="other's own run")
        # and each refused create was answered tenant_not_allowed on the tenant it named
        for subscriber, correlation in ((other, "spoofed"), (acme, "unnamed"), (acme, "replayed")):
            answer = await eventually(_answer(subscriber, correlation), what=f"the answer to {correlation}")
            assert (answer["type"], answer["payload"]["code"]) == ("run.rejected", "tenant_not_allowed"), answer
        assert [s.envelope["type"] for s in other.of("spoofed")] == ["run.rejected"]  # the replay made no answer
        async with engine.connect() as conn:
            # and created nothing
            made = (await conn.execute(text(
                "SELECT count(*) FROM runs WHERE idempotency_key IN ('key-spoofed', 'key-unnamed', 'key-replayed')"
            ))).scalar_one()
            # and was audited with its publisher, not quarantined again
            audited = sorted((r.details["idempotency_key"], r.target, r.details["publisher"] or "") for r in (
                await conn.execute(text("SELECT target, details FROM audit_log WHERE action = 'run.create.refused'"))))
            kept = (await conn.execute(text("SELECT count(*) FROM quarantine WHERE replayed_at IS NULL"))).scalar_one()
            replay_outcome = (await conn.execute(text(
                "SELECT outcome->>'code' FROM inbox_scheduler WHERE message_id = :id"),
                {"id": spoofed["event_id"]})).scalar_one()
        assert made == 0
        assert audited == [("key-replayed", "acme", ""), ("key-spoofed", "other", acme_user.user),
                           ("key-unnamed", "acme", "")]
        assert kept == 0
        assert replay_outcome == "tenant_not_allowed"
    finally:
        await acme.close()
        await other.close()


async def test_the_broker_refuses_a_user_id_that_is_not_the_connections_user(
        tenant_user) -> None:  # type: ignore[no-untyped-def]
    acme_user = await asyncio.to_thread(tenant_user, "acme")
    other_user = await asyncio.to_thread(tenant_user, "other")
    connection = await _connect(acme_user.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        ingress = await channel.get_exchange(INGRESS, ensure=False)
        # When acme's connection names other's user as the publisher, Then RabbitMQ refuses it
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="user_id property set to"):
            await ingress.publish(aio_pika.Message(
                json.dumps(run_create("other", "forged", "key-forged", 1)).encode(), user_id=other_user.user),
                routing_key="run.create", mandatory=True)
    finally:
        await connection.close()


async def test_the_benchs_producer_creates_runs_as_a_tenants_own_user(
        clean, engine, services, tmp_path, tenant_user) -> None:  # type: ignore[no-untyped-def]
    bench_user = await asyncio.to_thread(tenant_user, TENANT)
    # Given the ensemble, with the bench tenant's user allowed its tenant
    Ensemble(services, tmp_path).start_services("scheduler", "worker", "relay", **producers(bench_user))
    # When the bench's producer creates a run as that user
    async with Producer(bench_user.url) as producer:
        await producer.create("bench-key", 1)
    # Then the run is created and completes
    run_id = await eventually(lambda: run_id_for(engine, TENANT, "bench-key"), timeout=60, what="the bench's run")
    assert await eventually(lambda: _completed(engine, run_id), timeout=60, what="its completion")


async def _completed(engine, run_id: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == "COMPLETED"
