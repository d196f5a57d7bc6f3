"""Backpressure at the door: the ingress queue bounded by a RabbitMQ policy, on the real broker.

A burst of creates past the bound is nacked at the producer; every create the broker confirmed
becomes exactly one run (counted in PostgreSQL by idempotency key); the bound holds on an ingress
queue declared as earlier releases declared it, without a bound.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import httpx
import pytest
from longrun_client import Backoff, Client, PublishNotConfirmed
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import management, topology
from longrun.bus.codec import broker_user, to_message
from longrun.bus.connection import Bus
from longrun.config import Settings
from longrun.envelope import make
from tests.fixtures import eventually, test_topology
from tests.harness import Process, Services
from tests.infra import Infra

pytestmark = pytest.mark.integration

TENANT = "acme"
BOUND = 10
INGRESS_BEFORE_THE_BOUND = {
    "x-queue-type": "quorum", "x-delivery-limit": 5, "x-dead-letter-exchange": "longrun.quarantine",
    "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
"""The ingress queue's arguments as every release so far declared it: no length or byte bound."""


def _api(infra: Infra) -> str:
    return management.management_urls(infra.management_url, infra.amqp_url)[0]


async def _set_bound(infra: Infra, amqp_url: str, *, max_length: int, max_bytes: int) -> None:
    await management.apply_policy([_api(infra)], management.vhost_of(amqp_url),
                                  topology.ingress_policy(max_length=max_length, max_bytes=max_bytes),
                                  queue=topology.SCHEDULER_INGRESS_QUEUE, patience=5)


async def _policy(infra: Infra) -> dict | None:  # type: ignore[type-arg]
    parts = urlsplit(_api(infra))
    async with httpx.AsyncClient(auth=(parts.username or "", parts.password or ""), timeout=5) as http:
        answer = await http.get(f"{urlunsplit((parts.scheme, parts.netloc.rpartition('@')[2], '', '', ''))}"
                                f"/api/policies/{quote(infra.vhost, safe='')}/{topology.INGRESS_POLICY}")
    return answer.json() if answer.status_code == 200 else None


@pytest.fixture
async def default_bound_after(infra: Infra) -> AsyncIterator[None]:
    """The session's ingress gets the default bound back, for the tests after this one."""
    yield
    defaults = Settings.from_env({})
    await _set_bound(infra, infra.amqp_url, max_length=defaults.ingress_max_length,
                     max_bytes=defaults.ingress_max_bytes)


def _create(key: str, user: str, pad: int = 0) -> aio_pika.Message:
    return to_message(make("run.create", {"workflow": "steps", "idempotency_key": key,
                                          "input": {"steps": 1, "pad": "x" * pad}},
                           producer="tests", tenant_id=TENANT), user_id=user)


async def _send_each(channel: aio_pika.abc.AbstractChannel, n: int, user: str, pad: int = 0) -> tuple[int, int]:
    """``n`` creates, one at a time, each confirm awaited: (confirmed, nacked)."""
    exchange = await channel.get_exchange(topology.INGRESS_EXCHANGE)
    confirmed = nacked = 0
    for _ in range(n):
        try:
            await exchange.publish(_create(uuid.uuid4().hex, user, pad), routing_key="run.create")
            confirmed += 1
        except aio_pika.exceptions.DeliveryError:
            nacked += 1
    return confirmed, nacked


async def _runs_by_key(engine: AsyncEngine, keys: list[str]) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT idempotency_key, count(*) FROM runs WHERE tenant_id = :t AND idempotency_key = ANY(:keys) "
            "GROUP BY idempotency_key"), {"t": TENANT, "keys": keys})
        return {row[0]: row[1] for row in rows}


@pytest.fixture
async def old_vhost(infra: Infra) -> AsyncIterator[str]:
    """A vhost of this test's own, made through the management API, with the ingress queue declared
    the way earlier releases declared it."""
    parts = urlsplit(_api(infra))
    base = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", ""))
    name = f"{infra.vhost}-door-{uuid.uuid4().hex[:6]}"
    user = broker_user(infra.amqp_url)
    async with httpx.AsyncClient(base_url=base, auth=(parts.username or "", parts.password or ""),
                                 timeout=10) as http:
        (await http.put(f"/api/vhosts/{quote(name, safe='')}")).raise_for_status()
        (await http.put(f"/api/permissions/{quote(name, safe='')}/{user}",
                        json={"configure": ".*", "write": ".*", "read": ".*"})).raise_for_status()
        amqp = urlsplit(infra.amqp_url)
        url = urlunsplit((amqp.scheme, amqp.netloc, "/" + quote(name, safe=""), "", ""))
        connection = await aio_pika.connect(url)
        channel = await connection.channel()
        await channel.declare_exchange(topology.INGRESS_EXCHANGE, "topic", durable=True)
        await channel.declare_exchange(topology.QUARANTINE_EXCHANGE, "fanout", durable=True)
        queue = await channel.declare_queue(topology.SCHEDULER_INGRESS_QUEUE, durable=True,
                                            arguments=INGRESS_BEFORE_THE_BOUND)
        await queue.bind(topology.INGRESS_EXCHANGE, "run.create")
        await connection.close()
        try:
            yield url
        finally:
            await http.delete(f"/api/vhosts/{quote(name, safe='')}")


@pytest.mark.timeout(120)
async def test_the_bound_holds_on_an_ingress_queue_declared_without_one_and_after_services_declare_it_again(
        infra: Infra, old_vhost: str) -> None:
    user = broker_user(old_vhost)
    connection = await aio_pika.connect(old_vhost)
    try:
        channel = await connection.channel(publisher_confirms=True)
        ingress = await channel.get_queue(topology.SCHEDULER_INGRESS_QUEUE, ensure=False)
        # Given the ingress queue as earlier releases declared it: it takes whatever comes
        assert await _send_each(channel, 3 * BOUND, user) == (3 * BOUND, 0)
        await ingress.purge()
        # When the bound is set on it as a policy (the scheduler's start does this)
        await _set_bound(infra, old_vhost, max_length=BOUND, max_bytes=1 << 20)
        # Then creates past the bound are nacked, and the queue holds the bound (RabbitMQ 3.10's quorum
        # queue takes one more: it refuses once it holds more than the bound)
        confirmed, nacked = await _send_each(channel, 3 * BOUND, user)
        assert (confirmed, nacked) == (BOUND + 1, 2 * BOUND - 1)
        assert (await channel.declare_queue(ingress.name, passive=True)).declaration_result.message_count == BOUND + 1

        # When a service declares the topology again, as each does at every start
        bus = Bus(old_vhost, topology=test_topology(), name="tests")
        await bus.connect()
        await bus.close()
        # Then the arguments it declares (no bound) are accepted and the bound still holds
        assert await _send_each(channel, 3, user) == (0, 3)
        # and once the queue drains, creates are taken again
        await ingress.purge()
        assert await _send_each(channel, 3, user) == (3, 0)
        await ingress.purge()

        # When the bound is in bytes (ten of these creates of some 2 KiB each), Then it holds the same way
        size = len(_create(uuid.uuid4().hex, user, pad=2048).body)
        await _set_bound(infra, old_vhost, max_length=1000, max_bytes=10 * size)
        confirmed, nacked = await _send_each(channel, 30, user, pad=2048)
        assert 10 <= confirmed <= 11 and nacked == 30 - confirmed
    finally:
        await connection.close()


@pytest.mark.timeout(60)
async def test_on_this_broker_the_lower_of_policy_and_argument_bounds_and_the_policys_overflow_wins(
        infra: Infra, old_vhost: str) -> None:
    """What docs/flow-control.md says of RabbitMQ 3.10, and why the bound's policy sets overflow too."""
    parts = urlsplit(_api(infra))
    vhost = quote(management.vhost_of(old_vhost), safe="")
    connection = await aio_pika.connect(old_vhost)
    try:
        channel = await connection.channel(publisher_confirms=True)
        async with httpx.AsyncClient(base_url=urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", "")),
                                     auth=(parts.username or "", parts.password or "")) as http:
            async def declared(name: str, arguments: dict[str, object], policy: dict[str, object]
                               ) -> aio_pika.abc.AbstractQueue:
                queue = await channel.declare_queue(name, durable=True,
                                                    arguments={"x-queue-type": "quorum", **arguments})
                (await http.put(f"/api/policies/{vhost}/{name}", json={
                    "pattern": f"^{name}$", "apply-to": "queues", "definition": policy})).raise_for_status()
                return queue

            async def sent(queue: aio_pika.abc.AbstractQueue, n: int) -> tuple[int, int]:
                confirmed = 0
                for _ in range(n):
                    try:
                        await channel.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2),
                                                               routing_key=queue.name)
                        confirmed += 1
                    except aio_pika.exceptions.DeliveryError:
                        pass
                depth = (await channel.declare_queue(queue.name, passive=True)).declaration_result.message_count
                return confirmed, depth

            # A bound in the arguments and another in the policy: the lower holds, whichever it is
            lower_argument = await declared("arg-3", {"x-max-length": 3, "x-overflow": "reject-publish"},
                                            {"max-length": 8})
            lower_policy = await declared("pol-3", {"x-max-length": 8, "x-overflow": "reject-publish"},
                                          {"max-length": 3})
            assert await sent(lower_argument, 10) == await sent(lower_policy, 10) == (4, 4)
            # The queue's argument says reject-publish, the policy drop-head: the policy's wins, and a full
            # queue drops what it had accepted instead of refusing what comes
            dropping = await declared("drops", {"x-overflow": "reject-publish"},
                                      {"max-length": 3, "overflow": "drop-head"})
            assert await sent(dropping, 10) == (10, 3)
    finally:
        await connection.close()


def _scheduler(services: Services, **env: str) -> Process:
    return services.start("scheduler", "longrun.services.scheduler", LONGRUN_INGRESS_MAX_LENGTH=str(BOUND), **env)


async def _bounded_by(infra: Infra, services: Services) -> Process:
    """A scheduler that set the test's bound, stopped: nothing drains the ingress meanwhile."""
    scheduler = _scheduler(services)

    async def bound_set() -> bool:
        policy = await _policy(infra)
        return policy is not None and policy["definition"]["max-length"] == BOUND

    await eventually(bound_set, timeout=30, what="the scheduler to set the ingress bound")
    scheduler.terminate()
    return scheduler


@pytest.mark.timeout(180)
async def test_a_burst_past_the_bound_is_nacked_at_the_producer_and_each_confirmed_create_is_one_run(
        clean, infra: Infra, engine: AsyncEngine, services: Services, default_bound_after: None) -> None:
    await _bounded_by(infra, services)
    keys = [f"burst-{uuid.uuid4().hex[:8]}-{i:03d}" for i in range(8 * BOUND)]
    async with await Client.connect(infra.amqp_url, producer="tests",
                                    nack_backoff=Backoff(first=0.05, longest=0.2, give_up_after=1.0)) as client:
        # When a producer sends a burst of creates eight times the bound while nothing drains the ingress
        results = await asyncio.gather(*(client.create_run(TENANT, "steps", {"steps": 1}, idempotency_key=key)
                                         for key in keys), return_exceptions=True)
    confirmed = [key for key, result in zip(keys, results, strict=True) if not isinstance(result, BaseException)]
    refused = [(key, result) for key, result in zip(keys, results, strict=True) if isinstance(result, BaseException)]
    # Then the broker took the bound's worth (and what was in flight when it filled), and the client
    # saw the rest nacked: after sending each again for a second, it gave up saying so
    assert BOUND <= len(confirmed) < len(keys) // 2, len(confirmed)
    assert all(isinstance(e, PublishNotConfirmed) and "nacked" in str(e) for _, e in refused), refused[:3]

    # When a scheduler drains the ingress
    _scheduler(services)

    async def created() -> dict[str, int]:
        runs = await _runs_by_key(engine, keys)
        return runs if len(runs) >= len(confirmed) else {}

    runs = await eventually(created, timeout=60, what=f"runs for the {len(confirmed)} confirmed creates")
    await asyncio.sleep(1.0)  # anything more would come from the ingress within this
    runs = await _runs_by_key(engine, keys)
    # Then every confirmed create made exactly one run, and no refused one made any
    assert runs == {key: 1 for key in confirmed}


@pytest.mark.timeout(180)
async def test_nacked_creates_sent_again_under_the_same_event_id_each_make_exactly_one_run(
        clean, infra: Infra, engine: AsyncEngine, services: Services, default_bound_after: None,
        caplog: pytest.LogCaptureFixture) -> None:
    await _bounded_by(infra, services)
    keys = [f"retry-{uuid.uuid4().hex[:8]}-{i:03d}" for i in range(6 * BOUND)]
    caplog.set_level(logging.WARNING, logger="longrun_client.retry")
    async with await Client.connect(infra.amqp_url, producer="tests",
                                    nack_backoff=Backoff(first=0.05, longest=0.5, give_up_after=30)) as client:
        # When a producer sends a burst of creates six times the bound while nothing drains the ingress,
        burst = asyncio.gather(*(client.create_run(TENANT, "steps", {"steps": 1}, idempotency_key=key)
                                 for key in keys))

        async def nacked() -> bool:
            return any("nacked by the broker" in r.getMessage() for r in caplog.records)

        await eventually(nacked, timeout=10, what="the broker to nack a create")
        # and a scheduler starts draining it a moment later
        _scheduler(services)
        requests = await asyncio.wait_for(burst, timeout=60)
    # Then every create was confirmed in the end, each under the event id it was first sent with
    resent = {r.getMessage().split()[1] for r in caplog.records if "nacked by the broker" in r.getMessage()}
    assert resent and resent <= {request.event_id for request in requests}

    async def created() -> dict[str, int]:
        runs = await _runs_by_key(engine, keys)
        return runs if len(runs) == len(keys) else {}

    await eventually(created, timeout=60, what="a run for every create")
    await asyncio.sleep(1.0)
    # and each made exactly one run
    assert await _runs_by_key(engine, keys) == {key: 1 for key in keys}


def _unreachable(infra: Infra) -> tuple[str, tuple[str, ...]]:
    """A management API that does not answer (the plugin not enabled), and what the refusal names."""
    return (f"http://{broker_user(infra.amqp_url)}:x@127.0.0.1:9/",
            ("stays unbounded", "does not answer", "rabbitmq_management", "LONGRUN_RABBITMQ_MANAGEMENT_URL"))


def _refusing(infra: Infra) -> tuple[str, tuple[str, ...]]:
    """The broker's management API, asked with a wrong password."""
    parts = urlsplit(_api(infra))
    return (f"{parts.scheme}://{parts.username}:x@{parts.hostname}:{parts.port}/",
            ("refused user", "policymaker", "LONGRUN_RABBITMQ_MANAGEMENT_URL"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", [_unreachable, _refusing])
async def test_a_scheduler_that_cannot_set_the_bound_stops_naming_what_is_missing(
        infra: Infra, services: Services, api) -> None:  # type: ignore[no-untyped-def]
    url, named = api(infra)
    # Given a management API the scheduler cannot set the bound through
    scheduler = _scheduler(services, LONGRUN_RABBITMQ_MANAGEMENT_URL=url, LONGRUN_STARTUP_PATIENCE="1")
    # Then it does not start with an unbounded ingress: it exits saying what is missing
    assert await asyncio.to_thread(scheduler.wait_dead, 40) == 3
    output = scheduler.output()
    assert all(words in output for words in named), output[-2000:]
    assert ":x@" not in output
