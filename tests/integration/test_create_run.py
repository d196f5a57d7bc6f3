"""Creating and admitting runs (app/scheduler/admit.py) against the real database and broker."""

from __future__ import annotations

import asyncio
import functools
import json
import random
from contextlib import asynccontextmanager

import psycopg
import pytest
from sqlalchemy import text

from longrun.app import effects
from longrun.app.scheduler import admit
from longrun.authoring import Registry
from longrun.bus import topology
from longrun.bus.consumer import QueueConsumer
from longrun.db import outbox
from longrun.db.engine import psycopg_dsn
from longrun.db.transaction import PgTransaction
from longrun.envelope import Envelope, decode, make
from longrun.services.scheduler import admitting, ingress
from longrun.services.scheduler.producers import producer_tenants
from tests.fixtures import eventually
from tests.integration.ensemble import publish_create
from tests.kinds import registry

pytestmark = pytest.mark.integration
MAX_INPUT = 1 << 20


def _request(key: str) -> Envelope:
    return make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}},
                producer="tests", tenant_id="acme")


async def test_a_repeated_request_returns_its_run_even_once_its_workflow_is_no_longer_registered(
        clean, engine) -> None:
    # Given a run created under a key while its workflow was registered
    async with engine.begin() as conn:
        first = (await admit.create_run(PgTransaction(conn), _request("k-1"), kinds=registry(), partitions=8, slots=4,
                                     max_input_bytes=MAX_INPUT)).outcome
    assert first["created"] is True
    # When the same request comes again to a scheduler that no longer knows that workflow
    async with engine.begin() as conn:
        again = (await admit.create_run(PgTransaction(conn), _request("k-1"), kinds=Registry(), partitions=8, slots=4,
                                     max_input_bytes=MAX_INPUT)).outcome
    # Then it answers with the run that exists, not with a rejection
    assert again == {"run_id": first["run_id"], "created": False}
    # and a new key for that workflow is rejected with the reason
    async with engine.begin() as conn:
        unknown = (await admit.create_run(PgTransaction(conn), _request("k-2"), kinds=Registry(), partitions=8, slots=4,
                                     max_input_bytes=MAX_INPUT)).outcome
    assert unknown["rejected"] is True and "steps" in unknown["reason"]


async def _create(engine, key: str, *, slots: int) -> dict:  # type: ignore[no-untyped-def,type-arg]
    async with engine.begin() as conn:
        return (await admit.create_run(PgTransaction(conn), _request(key), kinds=registry(), partitions=8,
                                       slots=slots, max_input_bytes=MAX_INPUT)).outcome


async def _wakeups(engine) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def,type-arg]
    async with engine.connect() as conn:
        return [(r.aggregate_id, outbox.envelope_of("run.wakeup", r.payload)) for r in await conn.execute(text(
            "SELECT aggregate_id, payload FROM outbox WHERE type = 'run.wakeup' ORDER BY id"))]


async def test_the_creating_statement_admits_with_a_free_slot_queues_without_one_and_defers_to_those_queued(
        clean, engine) -> None:
    listener = await psycopg.AsyncConnection.connect(psycopg_dsn(engine.url.render_as_string(False)),
                                                     autocommit=True)
    await listener.execute(f"LISTEN {effects.ADMISSION_CHANNEL}")

    async def heard(seconds: float) -> list[str]:
        return [n.payload async for n in listener.notifies(timeout=seconds, stop_after=1)]

    try:
        # Given a tenant with one slot: a run created while it is free is admitted and woken at once
        first = await _create(engine, "k-1", slots=1)
        assert first["admitted"] is True
        [(run_id, wakeup)] = await _wakeups(engine)
        envelope = decode(json.dumps(wakeup).encode())
        assert (run_id, envelope.run_id, envelope.expected_state_version, envelope.payload.reason) == (
            first["run_id"], first["run_id"], 1, "admitted")
        # When the slot is taken, the next run is queued: no wakeup, and admission is not woken for nothing
        second = await _create(engine, "k-2", slots=1)
        assert "admitted" not in second
        assert len(await _wakeups(engine)) == 1
        assert await heard(0.5) == []
        # When slots are raised while a run is queued, a new run does not jump the queue: admission is
        # told, so it picks by priority and age
        third = await _create(engine, "k-3", slots=3)
        assert "admitted" not in third
        assert await heard(5) == ["acme"]
        assert len(await _wakeups(engine)) == 1
    finally:
        await listener.close()
    async with engine.connect() as conn:
        admitted = (await conn.execute(text("SELECT run_id FROM runs WHERE admitted_at IS NOT NULL"))).scalars().all()
    assert admitted == [first["run_id"]]


async def test_admission_picks_what_scoring_the_whole_queue_would_pick(clean, engine) -> None:
    # Given 60 queued runs of one tenant over every priority, of random ages, and queued runs of another
    rng = random.Random(20261130)
    for tenant, n in (("acme", 60), ("other", 10)):
        for i in range(n):
            request = make("run.create", {"workflow": "steps", "idempotency_key": f"{tenant}-{i}",
                                          "input": {"steps": 1}, "priority": rng.randint(0, 9)},
                           producer="tests", tenant_id=tenant)
            async with engine.begin() as conn:
                await admit.create_run(PgTransaction(conn), request, kinds=registry(), partitions=8, slots=0,
                                     max_input_bytes=MAX_INPUT)
    async with engine.begin() as conn:
        for run_id in (await conn.execute(text("SELECT run_id FROM runs"))).scalars().all():
            await conn.execute(text("UPDATE runs SET created_at = now() - make_interval(secs => :age) "
                                    "WHERE run_id = :r"), {"age": rng.uniform(0, 600), "r": run_id})
        # and five of the tenant's runs terminated while queued: they are never admitted
        await conn.execute(text("UPDATE runs SET status = 'TERMINATED' WHERE run_id IN (SELECT run_id FROM runs "
                                "WHERE tenant_id = 'acme' ORDER BY run_id LIMIT 5)"))
    # When admission gives the tenant more and more slots, Then each round admits exactly the runs that
    # ranking every queued run by priority plus age (one point per 30 s) puts first
    for slots in (1, 4, 9, 20, 45, 70):
        async with engine.begin() as conn:
            expected = (await conn.execute(text(
                "SELECT run_id FROM runs WHERE tenant_id = 'acme' AND admitted_at IS NULL AND status = 'READY' "
                "ORDER BY priority + extract(epoch FROM now() - created_at) / 30 DESC, created_at LIMIT :n"),
                {"n": await admitting._free(conn, "acme", slots)})).scalars().all()
            admitted = await admitting.admit(conn, slots=slots, aging_seconds=30, tenants=["acme"])
        assert admitted == list(expected)
    async with engine.connect() as conn:
        counts = dict((await conn.execute(text(
            "SELECT tenant_id, count(admitted_at) FROM runs GROUP BY tenant_id"))).all())
    assert counts == {"acme": 55, "other": 0}


async def test_a_batch_of_creates_takes_its_tenants_locks_in_tenant_order_before_any_create(
        clean, engine, bus) -> None:
    # Given creates of tenant "zeta" then tenant "alpha" waiting in the scheduler's ingress, and another
    # transaction (an admission round) holding alpha's admission lock and about to take zeta's
    for tenant in ("zeta", "alpha"):
        await publish_create(bus, tenant=tenant, key=f"{tenant}-1", input_={"steps": 1}, workflow="steps")
    channel = await bus.channel(prefetch=10)
    queue = await channel.get_queue(topology.SCHEDULER_INGRESS_QUEUE, ensure=False)
    waiting = [await queue.get(fail=True), await queue.get(fail=True)]
    consumer = _ingress(bus, engine)
    async with _admission_lock_held(engine, "alpha") as (holder, prober):
        # When the scheduler handles the two together
        batch = asyncio.create_task(consumer._process_together(waiting))
        await eventually(lambda: _waits_for_a_lock(prober), what="the batch waiting for a lock")
        # Then it waits for alpha's lock without holding zeta's (taking them in message order, it would
        # hold zeta's while waiting for alpha's, and the round would deadlock with it)
        assert not batch.done()
        await prober.execute("BEGIN")
        assert (await (await prober.execute(TRY_LOCK, {"t": "zeta"})).fetchone()) == (True,)
        await prober.execute("ROLLBACK")
        await holder.commit()
        await asyncio.wait_for(batch, timeout=10)
    async with engine.connect() as conn:
        created = (await conn.execute(text("SELECT tenant_id FROM runs ORDER BY tenant_id"))).scalars().all()
    assert created == ["alpha", "zeta"]
    assert (await queue.declare()).message_count == 0


async def test_a_create_handled_alone_waits_for_its_tenants_admission_lock(clean, engine, bus) -> None:
    # Given a create waiting in the scheduler's ingress, and an admission round holding its tenant's lock
    await publish_create(bus, tenant="acme", key="acme-1", input_={"steps": 1}, workflow="steps")
    channel = await bus.channel(prefetch=10)
    queue = await channel.get_queue(topology.SCHEDULER_INGRESS_QUEUE, ensure=False)
    message = await queue.get(fail=True)
    async with _admission_lock_held(engine, "acme") as (holder, prober):
        # When the scheduler handles it alone (its handler does not take the lock itself)
        alone = asyncio.create_task(_ingress(bus, engine)._process(message))
        # Then it waits for that lock before it creates, and creates once the round commits
        await eventually(lambda: _waits_for_a_lock(prober), what="the create waiting for the lock")
        assert not alone.done()
        await holder.commit()
        await asyncio.wait_for(alone, timeout=10)
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs WHERE tenant_id = 'acme'"))).scalar() == 1


def _ingress(bus, engine) -> QueueConsumer:  # type: ignore[no-untyped-def]
    """The scheduler's ingress consumer, wired as the service wires it."""
    creates = ingress.Ingress(kinds=registry(), partitions=8, slots=4, max_input_bytes=MAX_INPUT,
                            producers=producer_tenants((), bus.url))
    return QueueConsumer(bus=bus, engine=engine, service="scheduler", queue=topology.SCHEDULER_INGRESS_QUEUE,
                         handler=creates.handle, prefetch=10, max_attempts=3, batch=16, prelude=creates.prelude,
                         refuser=functools.partial(ingress.refuse, partitions=8))


@asynccontextmanager
async def _admission_lock_held(engine, tenant: str):  # type: ignore[no-untyped-def]
    """(holder, prober): a connection holding ``tenant``'s admission lock in its open transaction
    (an admission round), and one to look at pg_locks with."""
    dsn = psycopg_dsn(engine.url.render_as_string(False))
    holder, prober = (await psycopg.AsyncConnection.connect(dsn), await psycopg.AsyncConnection.connect(dsn))
    try:
        await holder.execute(LOCK, {"t": tenant})
        yield holder, prober
    finally:
        await holder.close()
        await prober.close()


async def _waits_for_a_lock(conn: psycopg.AsyncConnection) -> bool:  # type: ignore[type-arg]
    waiting = await conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    row = await waiting.fetchone()
    await conn.rollback()
    return row is not None and row[0] > 0


LOCK = "SELECT pg_advisory_xact_lock(hashtext('longrun.admit:' || %(t)s))"
TRY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('longrun.admit:' || %(t)s))"
