"""Producers' signals bound to their tenants (docs/bus.md): a ``run.signal`` published by a tenant's own
broker user, granted as docs/bus.md says (topic write ``^run\\.(create|signal)$`` on the ingress), is
taken only for a run of a tenant that user is allowed. A signal naming another tenant, or naming its
own tenant and another tenant's run, or whose payload the run's kind refuses, is answered with
run.rejected (tenant_not_allowed, run_not_found, signal_refused), audited, and changes nothing; the
same signal sent twice by the run's own tenant (``longrun_client.Client.signal_run``) is recorded
once and wakes the run once."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import pytest
from longrun_client import Client
from sqlalchemy import text

from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of
from tests.security.test_bus_tenancy import INGRESS, Subscriber, TenantUser, producers, tenant_user

pytestmark = pytest.mark.integration

__all__ = ["tenant_user"]  # the fixture, shared with test_bus_tenancy


def run_signal(tenant: str, run_id: str, signal_id: str, payload: Any) -> dict[str, Any]:
    """A run.signal v1 envelope as any producer writes it, by hand."""
    return {"event_id": str(uuid.uuid4()), "type": "run.signal", "schema_version": 1, "producer": f"{tenant}-ci",
            "tenant_id": tenant, "run_id": run_id, "correlation_id": signal_id,
            "occurred_at": datetime.now(UTC).isoformat(), "data_class": "internal",
            "payload": {"signal_id": signal_id, "name": "ship", "payload": payload}}


async def publish_signal(user: TenantUser, envelope: dict[str, Any]) -> None:
    """Raw aio-pika as the tenant's own user: persistent, mandatory, confirmed, with its user_id."""
    connection = await aio_pika.connect(user.url, timeout=10)
    try:
        channel = await connection.channel(publisher_confirms=True)
        ingress = await channel.get_exchange(INGRESS, ensure=False)
        await ingress.publish(aio_pika.Message(
            body=json.dumps(envelope).encode(), content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=envelope["event_id"],
            correlation_id=envelope["correlation_id"], type=envelope["type"], user_id=user.user),
            routing_key="run.signal", mandatory=True)
    finally:
        await connection.close()


@pytest.mark.long
@pytest.mark.timeout(300)
async def test_a_producer_signals_only_runs_of_the_tenants_its_broker_user_is_allowed(
        clean, engine, bus, services, tmp_path, tenant_user) -> None:  # type: ignore[no-untyped-def]
    acme_user = await asyncio.to_thread(tenant_user, "acme")
    other_user = await asyncio.to_thread(tenant_user, "other")
    # Given the ensemble running the signalled kind, each tenant's user allowed its own tenant, a run of
    # other's waiting for its signal, and acme's consumer
    ensemble = Ensemble(services, tmp_path)
    ensemble.env["LONGRUN_RUN_KINDS"] = "tests.integration.signal_kinds:SIGNALLED"
    ensemble.start_services("scheduler", "worker", "relay", **producers(acme_user, other_user))
    key = new_key()
    await publish_create(bus, tenant="other", key=key, workflow="signalled", input_={})
    theirs = str(await eventually(lambda: run_id_for(engine, "other", key), what="other's run"))
    await eventually(lambda: _is(engine, theirs, "WAITING_EVENT"), timeout=60, what="the wait for ship")
    acme = Subscriber(acme_user)
    await acme.start()
    try:
        # When acme's user signals other's run naming tenant other, then naming its own tenant
        foreign = run_signal("other", theirs, "spoofed", {"by": "acme"})
        disguised = run_signal("acme", theirs, "disguised", {"by": "acme"})
        await publish_signal(acme_user, foreign)
        await publish_signal(acme_user, disguised)
        # and other's user sends a payload the kind refuses, then, with longrun-client, the right one
        # twice (a retry: a new message with the same signal id)
        refused = run_signal("other", theirs, "bad", {"by": ""})
        await publish_signal(other_user, refused)
        async with await Client.connect(other_user.url, producer="other-ci") as client:
            for _ in range(2):
                await client.signal_run("other", theirs, "ship", {"by": "other"}, signal_id="ship-1")

        # Then other's run completes, woken once by its own signal, the only one recorded on it
        await eventually(lambda: _is(engine, theirs, "COMPLETED"), timeout=60, what="other's run completes")
        events = await event_types(engine, theirs)
        received = [(d["signal_id"], d["sent_by"]) for t, d in events if t == "signal.received"]
        assert received == [("ship-1", f"producer:{other_user.user}")]
        [completed] = [d for t, d in events if t == "run.completed"]
        assert completed["evidence"]["woken_by"] == "ship-1"
        # and each refusal was recorded with its code and publisher, in the inbox and the audit log
        outcomes = {envelope["payload"]["signal_id"]: await _outcome(engine, envelope["event_id"])
                    for envelope in (foreign, disguised, refused)}
        assert outcomes == {"spoofed": "tenant_not_allowed", "disguised": "run_not_found", "bad": "signal_refused"}
        assert await _refusals(engine) == [("spoofed", "tenant_not_allowed", acme_user.user),
                                           ("disguised", "run_not_found", acme_user.user),
                                           ("bad", "signal_refused", other_user.user)]
        # and acme's own consumer was told of the signal it sent in its tenant's name, not of other's run
        answer = await eventually(lambda: _rejected(acme, disguised["event_id"]), what="acme's answer")
        assert (answer["payload"]["code"], answer["payload"]["reason"]) == \
            ("run_not_found", f"no run {theirs!r} in tenant 'acme'")
        assert not [s for s in acme.seen if s.envelope.get("run_id") == theirs]
    finally:
        await acme.close()


async def _is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status


async def _outcome(engine, event_id: str) -> str | None:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT outcome->>'code' FROM inbox_scheduler WHERE message_id = :id"),
                                   {"id": event_id})).scalar()


async def _refusals(engine) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT details FROM audit_log WHERE action = 'run.signal.refused' ORDER BY id"))
        return [(r.details["signal_id"], r.details["code"], r.details["publisher"]) for r in rows]


async def _rejected(subscriber: Subscriber, event_id: str) -> dict[str, Any] | None:
    found = [s.envelope for s in subscriber.seen if s.envelope["type"] == "run.rejected"
             and s.envelope["payload"]["refused_event_id"] == event_id]
    return found[0] if found else None
