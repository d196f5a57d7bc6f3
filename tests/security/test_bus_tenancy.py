"""Tenants kept apart on the bus by RabbitMQ itself: one user per tenant, with the permissions and
topic permissions docs/bus.md recommends, and a consumer that is plain aio-pika (no longrun code).

``tenant_grants`` is the exact list of ``rabbitmqctl`` commands the documentation gives.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from longrun_client import Client

from longrun.bus.connection import Bus
from tests.fixtures import eventually
from tests.infra import Infra, ctl
from tests.integration.ensemble import ROOT, Ensemble

pytestmark = pytest.mark.integration

INGRESS = "longrun.ingress"
EVENTS = "longrun.events"
EVENTS_LOG = "longrun.events.log"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TERMINATED", "TIMED_OUT", "BUDGET_EXHAUSTED"}


def tenant_grants(vhost: str, user: str, tenant: str) -> list[list[str]]:
    """What a tenant's user may do (after ``rabbitmqctl add_user``): configure, write and read its own
    ``<tenant>.`` queues; bind them to ``longrun.events`` (read on the exchange) with binding keys
    that start with ``<tenant>.`` only (topic read); publish to ``longrun.ingress`` with the keys
    ``run.create`` and ``run.signal`` only (topic write). Nothing else: not the stream ``longrun.events.log``, not the
    service queues, not the default exchange."""
    own = f"^{tenant}\\."
    return [
        ["set_permissions", "-p", vhost, user, own, f"{own}|^longrun\\.ingress$", f"{own}|^longrun\\.events$"],
        ["set_topic_permissions", "-p", vhost, user, EVENTS, "^$", own],
        ["set_topic_permissions", "-p", vhost, user, INGRESS, "^run\\.(create|signal)$", "^$"],
    ]


@dataclass
class TenantUser:
    tenant: str
    user: str
    url: str


@pytest.fixture
def tenant_user(infra: Infra, bus: Bus) -> Iterator[Callable[[str], TenantUser]]:
    """Make a RabbitMQ user for a tenant (a unique name per test run), granted as documented, in this
    session's vhost; every user made is deleted afterwards, whatever happened. ``bus`` has declared
    the topology (exchanges and the stream) the users are checked against."""
    if not infra.rabbitmqctl:
        pytest.skip("needs rabbitmqctl on a local broker to add users")
    made: list[str] = []

    def make_user(tenant: str) -> TenantUser:
        user = f"tenant-{tenant}-{uuid.uuid4().hex[:10]}"
        password = uuid.uuid4().hex
        made.append(user)
        ctl("add_user", user, password)
        for command in tenant_grants(infra.vhost, user, tenant):
            ctl(*command)
        parts = urlsplit(infra.amqp_url)
        netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5672}"
        return TenantUser(tenant, user, urlunsplit((parts.scheme, netloc, parts.path, "", "")))

    try:
        yield make_user
    finally:
        for user in made:
            ctl("delete_user", user, check=False)
        left = ctl("list_users", "-q", check=False).stdout
        assert not [u for u in made if u in left], f"users left behind: {made}"


async def _connect(url: str) -> AbstractConnection:
    return await aio_pika.connect(url, timeout=10)


async def _refused(connection: AbstractConnection, attempt: Callable[[AbstractChannel], Any]) -> str:
    """Run ``attempt`` on a fresh channel and expect the broker to refuse it (ACCESS_REFUSED, which
    closes that channel, not the connection); the broker's reason."""
    channel = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refused:
        await attempt(channel)
    assert not connection.is_closed
    return str(refused.value)


async def _ignore(message: AbstractIncomingMessage) -> None:
    pass


# -- 1. what a tenant's user may not do ---------------------------------------------------------------


async def test_a_tenant_can_bind_its_own_run_events_only(tenant_user) -> None:  # type: ignore[no-untyped-def]
    acme, other = await asyncio.to_thread(tenant_user, "acme"), await asyncio.to_thread(tenant_user, "other")
    mine = f"other.runs-{uuid.uuid4().hex[:6]}"
    connection = await _connect(other.url)
    try:
        # Given tenant "other"'s user with its own queue
        channel = await connection.channel()
        await channel.declare_queue(mine, exclusive=True)

        def bind(key: str) -> Callable[[AbstractChannel], Any]:
            async def attempt(ch: AbstractChannel) -> None:
                await (await ch.get_queue(mine, ensure=False)).bind(EVENTS, routing_key=key)
            return attempt

        # When it binds that queue to acme's run events, to everything, or to every tenant's runs:
        # Then the broker refuses each, naming the topic permission
        for key in ("acme.run.#", "acme.run.status.completed", "#", "*.run.#", "*.*.*"):
            reason = await _refused(connection, bind(key))
            assert "ACCESS_REFUSED" in reason and key in reason, reason
        # nor can it bind its own exchange to longrun.events to get around the queue check
        async def exchange_to_exchange(ch: AbstractChannel) -> None:
            own = await ch.declare_exchange(f"other.fan-{uuid.uuid4().hex[:6]}", "fanout", auto_delete=True)
            await own.bind(EVENTS, routing_key="#")
        await _refused(connection, exchange_to_exchange)

        # nor read the stream of every tenant's events
        async def read_log(ch: AbstractChannel) -> None:
            await ch.set_qos(prefetch_count=10)
            log = await ch.get_queue(EVENTS_LOG, ensure=False)
            await log.consume(_ignore, arguments={"x-stream-offset": "first"})
        reason = await _refused(connection, read_log)
        assert EVENTS_LOG in reason, reason

        async def get_log(ch: AbstractChannel) -> None:
            await (await ch.get_queue(EVENTS_LOG, ensure=False)).get(fail=False)
        await _refused(connection, get_log)

        # nor declare (and so squat) a queue with acme's prefix, nor read a service queue
        async def squat(ch: AbstractChannel) -> None:
            await ch.declare_queue("acme.runs", durable=True)
        await _refused(connection, squat)

        # nor a server-named queue (amq.gen-...): a tenant's consumer names its queue <tenant>.<anything>
        async def server_named(ch: AbstractChannel) -> None:
            await ch.declare_queue("", exclusive=True)
        assert "amq.gen-" in await _refused(connection, server_named)

        async def read_service_queue(ch: AbstractChannel) -> None:
            await (await ch.get_queue("longrun.scheduler.ingress", ensure=False)).get(fail=False)
        await _refused(connection, read_service_queue)

        # nor publish anything but run.create and run.signal to the ingress, nor publish run events, nor go through
        # the default exchange to a service queue
        for exchange, key in ((INGRESS, "run.cancel"), (INGRESS, "#"), (EVENTS, "acme.run.status.completed"),
                              ("", "longrun.scheduler.ingress")):
            async def publish(ch: AbstractChannel, exchange: str = exchange, key: str = key) -> None:
                target = ch.default_exchange if exchange == "" else await ch.get_exchange(exchange, ensure=False)
                await target.publish(aio_pika.Message(b"{}"), routing_key=key)
            confirmed = await connection.channel(publisher_confirms=True)
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refused:
                await publish(confirmed)
            assert "ACCESS_REFUSED" in str(refused.value), refused.value
        # (Not covered, as documented: a passive declare needs no permission, so the stream's existence
        # is visible; its contents are not.)
        await (await connection.channel()).declare_queue(EVENTS_LOG, passive=True)
    finally:
        await connection.close()

    # When acme's user binds its own queue to its own run events, Then the broker lets it
    connection = await _connect(acme.url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"acme.runs-{uuid.uuid4().hex[:6]}", exclusive=True)
        await queue.bind(EVENTS, routing_key="acme.run.#")
        await queue.bind(EVENTS, routing_key="acme.run.status.completed")
        await queue.consume(_ignore)
        assert not channel.is_closed
    finally:
        await connection.close()


# -- 2. the Done-when scenario, over the real ensemble ------------------------------------------------


@dataclass
class Seen:
    routing_key: str
    envelope: dict[str, Any]
    properties: dict[str, Any]
    headers: dict[str, Any]


@dataclass
class Subscriber:
    """A tenant's consumer: its own queue bound ``<tenant>.run.#``, everything it gets kept in order."""

    user: TenantUser
    connection: AbstractConnection | None = None
    seen: list[Seen] = field(default_factory=list)

    async def start(self) -> None:
        self.connection = await _connect(self.user.url)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=100)
        queue = await channel.declare_queue(f"{self.user.tenant}.runs-{uuid.uuid4().hex[:6]}", exclusive=True)
        await queue.bind(EVENTS, routing_key=f"{self.user.tenant}.run.#")
        await queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.seen.append(Seen(message.routing_key or "", json.loads(message.body),
                              {"message_id": message.message_id, "correlation_id": message.correlation_id,
                               "type": message.type, "content_type": message.content_type,
                               "delivery_mode": message.delivery_mode},
                              dict(message.headers or {})))
        await message.ack()

    def of(self, correlation_id: str) -> list[Seen]:
        """What was seen for one correlation id, the first copy of each event_id (dedup)."""
        first: dict[str, Seen] = {}
        for s in self.seen:
            if s.envelope.get("correlation_id") == correlation_id:
                first.setdefault(s.envelope["event_id"], s)
        return list(first.values())

    def finished(self, correlation_id: str) -> bool:
        return any(s.envelope["type"] == "run.event" and s.envelope["payload"]["status"] in TERMINAL
                   for s in self.of(correlation_id))

    def finishing(self, correlation_id: str) -> Callable[[], Any]:
        async def check() -> bool:
            return self.finished(correlation_id)
        return check

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


def run_create(tenant: str, correlation_id: str, key: str, steps: int) -> dict[str, Any]:
    """A run.create v2 envelope as any producer writes it, by hand."""
    return {
        "event_id": str(uuid.uuid4()),
        "type": "run.create",
        "schema_version": 2,
        "producer": f"{tenant}-billing",
        "tenant_id": tenant,
        "correlation_id": correlation_id,
        "occurred_at": datetime.now(UTC).isoformat(),
        "data_class": "internal",
        "payload": {"workflow": "steps", "idempotency_key": key, "input": {"steps": steps},
                    "priority": 5, "labels": {"order": correlation_id}},
    }


async def publish_create(user: TenantUser, envelope: dict[str, Any], *, named: bool = True) -> None:
    """Raw aio-pika, the tenant's own user: persistent, mandatory, with publisher confirms (an
    exception here would mean the broker did not take it), naming that user as its ``user_id``
    unless not ``named``."""
    connection = await _connect(user.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        ingress = await channel.get_exchange(INGRESS, ensure=False)
        await ingress.publish(aio_pika.Message(
            body=json.dumps(envelope).encode(), content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=envelope["event_id"],
            correlation_id=envelope["correlation_id"], type=envelope["type"],
            user_id=user.user if named else None), routing_key="run.create", mandatory=True)
    finally:
        await connection.close()


def producers(*users: TenantUser) -> dict[str, str]:
    """The scheduler's setting that lets each tenant's user create runs in its own tenant."""
    return {"LONGRUN_PRODUCER_TENANTS": ",".join(f"{u.user}={u.tenant}" for u in users)}


@pytest.mark.long
@pytest.mark.timeout(300)
async def test_a_tenants_consumer_sees_its_run_accepted_then_its_status_events_to_the_outcome_and_nothing_else(
        clean, services, tmp_path, tenant_user) -> None:  # type: ignore[no-untyped-def]
    acme_user = await asyncio.to_thread(tenant_user, "acme")
    other_user = await asyncio.to_thread(tenant_user, "other")
    # Given the ensemble (scheduler, worker, relay), and each tenant's consumer bound <tenant>.run.#
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "worker", "relay", **producers(acme_user, other_user))
    acme, other = Subscriber(acme_user), Subscriber(other_user)
    await acme.start()
    await other.start()
    try:
        # When each tenant's producer publishes a run.create of a 2-step run, with its correlation id
        correlation = f"order-{uuid.uuid4().hex[:8]}"
        create = run_create("acme", correlation, f"key-{correlation}", 2)
        theirs = f"order-{uuid.uuid4().hex[:8]}"
        await publish_create(acme_user, create)
        await publish_create(other_user, run_create("other", theirs, f"key-{theirs}", 2))

        # Then acme's consumer sees, for its correlation id, run.accepted, then the run's status events
        # in increasing seq, up to the terminal one, which carries the outcome
        await eventually(acme.finishing(correlation), timeout=180, interval=0.2,
                         what="acme's run to finish on acme's queue")
        await eventually(other.finishing(theirs), timeout=60, interval=0.2,
                         what="other's run to finish on other's queue")
        await asyncio.sleep(1.0)  # anything routed to acme's queue with other's last event has arrived
        mine = acme.of(correlation)
        accepted, statuses = mine[0], mine[1:]
        assert accepted.envelope["type"] == "run.accepted", [s.routing_key for s in mine]
        assert accepted.envelope["schema_version"] == 2
        assert accepted.routing_key == "acme.run.accepted"
        run_id = accepted.envelope["payload"]["run_id"]
        assert accepted.envelope["run_id"] == run_id
        assert accepted.envelope["causation_id"] == create["event_id"]
        assert {k: accepted.envelope["payload"][k] for k in ("idempotency_key", "workflow", "labels", "repeated")} == {
            "idempotency_key": create["payload"]["idempotency_key"], "workflow": "steps",
            "labels": {"order": correlation}, "repeated": False}
        assert set(accepted.envelope["payload"]["versions"]) == {"workflow", "prompt", "model_policy", "tool_schemas"}

        assert statuses, "no status event"
        assert all(s.envelope["type"] == "run.event" and s.envelope["schema_version"] == 3 for s in statuses)
        seqs = [s.envelope["payload"]["seq"] for s in statuses]
        assert seqs == sorted(set(seqs)), f"status events out of order: {seqs}"
        names = [s.envelope["payload"]["status"] for s in statuses]
        assert names[-1] == "COMPLETED" and not TERMINAL & set(names[:-1]), names
        for s in statuses:
            payload = s.envelope["payload"]
            assert s.routing_key == f"acme.run.status.{payload['status'].lower()}"
            assert (s.envelope["run_id"], s.envelope["tenant_id"]) == (run_id, "acme")
            assert s.envelope["causation_id"], f"{payload['status']} names no cause"
            assert payload["labels"] == {"order": correlation}
            assert (payload["outcome"] is None) == (payload["status"] not in TERMINAL)
        # each status event says where the run came from: the previous one's status
        assert [s.envelope["payload"]["data"]["from"] for s in statuses[1:]] == names[:-1]
        outcome = statuses[-1].envelope["payload"]["outcome"]
        assert outcome["status"] == "COMPLETED"
        assert outcome["acceptance"] == {"evidence": {"steps": 2}, "unmet": []}
        assert [(r["logical_action"], r["tool"]) for r in outcome["receipts"]] == [
            ("step:0", "bench.echo"), ("step:1", "bench.echo")]

        # and every message carries its metadata as AMQP properties and CloudEvents headers
        for s in mine:
            e = s.envelope
            assert s.properties == {"message_id": e["event_id"], "correlation_id": correlation, "type": e["type"],
                                    "content_type": "application/json",
                                    "delivery_mode": aio_pika.DeliveryMode.PERSISTENT}
            assert {k: v for k, v in s.headers.items() if k.startswith("cloudEvents:")} == {
                "cloudEvents:specversion": "1.0", "cloudEvents:id": e["event_id"], "cloudEvents:type": e["type"],
                "cloudEvents:source": e["producer"], "cloudEvents:subject": run_id,
                "cloudEvents:time": e["occurred_at"]}
            assert (s.headers.get("schema_version"), s.headers.get("tenant_id")) == (e["schema_version"], "acme")

        # And nothing of tenant other's run reached acme's queue, though other's consumer saw all of it
        assert [s.routing_key for s in acme.seen if not s.routing_key.startswith("acme.")] == []
        assert {s.envelope["tenant_id"] for s in acme.seen} == {"acme"}
        assert acme.of(theirs) == []
        theirs_seen = other.of(theirs)
        assert theirs_seen[0].routing_key == "other.run.accepted"
        assert theirs_seen[-1].routing_key == "other.run.status.completed"
        assert {s.envelope["tenant_id"] for s in other.seen} == {"other"}
    finally:
        await acme.close()
        await other.close()


# -- 3. the operator's stream --------------------------------------------------------------------------


def operator_grants(vhost: str, user: str) -> list[list[str]]:
    """An auditing operator: reads the stream of every tenant's events, and nothing else."""
    return [["set_permissions", "-p", vhost, user, "^$", "^$", "^longrun\\.events\\.log$"]]


async def _read_stream(channel: AbstractChannel, offset: Any, wanted: set[str]) -> list[tuple[int, str]]:
    """(stream offset, message id) of the messages read from ``offset`` until every ``wanted`` id came."""
    await channel.set_qos(prefetch_count=100)
    log = await channel.get_queue(EVENTS_LOG, ensure=False)
    got: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        got.append((int((message.headers or {})["x-stream-offset"]), message.message_id or ""))  # type: ignore[call-overload]
        await message.ack()
        if wanted <= {m for _, m in got}:
            done.set()

    tag = await log.consume(on_message, arguments={"x-stream-offset": offset})
    await asyncio.wait_for(done.wait(), timeout=20)
    await log.cancel(tag)
    return got


async def test_an_operator_granted_the_stream_reads_every_tenants_events_from_an_offset(
        infra: Infra, bus: Bus) -> None:
    if not infra.rabbitmqctl:
        pytest.skip("needs rabbitmqctl on a local broker to add users")
    user, password = f"audit-{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    try:
        await asyncio.to_thread(ctl, "add_user", user, password)
        for command in operator_grants(infra.vhost, user):
            await asyncio.to_thread(ctl, *command)
        # Given events of two tenants published to longrun.events (the stream is bound '#')
        ids = [str(uuid.uuid4()) for _ in range(3)]
        for message_id, tenant in zip(ids, ("acme", "other", "acme"), strict=True):
            await bus.publish(EVENTS, f"{tenant}.run.status.running",
                              aio_pika.Message(b"{}", message_id=message_id,
                                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT))
        parts = urlsplit(infra.amqp_url)
        url = urlunsplit((parts.scheme, f"{user}:{password}@{parts.hostname}:{parts.port or 5672}", parts.path, "", ""))
        connection = await _connect(url)
        try:
            # When the operator reads the stream from its start, Then every tenant's events are there, in order
            first = await _read_stream(await connection.channel(), "first", set(ids))
            mine = [(offset, m) for offset, m in first if m in ids]
            assert [m for _, m in mine] == ids
            # and reading again from a recorded offset starts exactly there
            again = await _read_stream(await connection.channel(), mine[1][0], set(ids[1:]))
            assert again[0] == mine[1]
            # but it may not bind, declare or publish anything
            refused = await _refused(connection, lambda ch: ch.declare_queue("audit.copy", exclusive=True))
            assert "ACCESS_REFUSED" in refused
        finally:
            await connection.close()
    finally:
        await asyncio.to_thread(ctl, "delete_user", user, check=False)


# -- 4. the clients the documentation points to, under a tenant's own user -----------------------------


async def test_the_python_client_and_the_node_example_work_with_a_tenants_own_user_only(
        clean, services, tmp_path, tenant_user) -> None:  # type: ignore[no-untyped-def]
    acme_user = await asyncio.to_thread(tenant_user, "acme")
    # Given the ensemble, and nothing but acme's broker user (allowed tenant acme) for the producers
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "worker", "relay", **producers(acme_user))
    # When longrun-client creates a run and waits for it, a durable consumer of its own following it
    handed: list[Any] = []
    missed: list[Any] = []
    async with await Client.connect(acme_user.url, producer="tests") as client:
        async def handle(event: Any) -> None:
            handed.append(event)
        await client.consume("acme", handle, name="billing", on_missed=missed.append)
        request = await client.create_run("acme", "steps", {"steps": 2}, idempotency_key=f"py-{uuid.uuid4().hex}")
        outcome = await client.wait(request, timeout=60)
        await eventually(lambda: _ended(handed), timeout=30, what="the durable consumer's terminal event")
        # but a durable consumer of another tenant's events is refused: its queues are not acme's to name
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await client.consume("other", handle, name="billing", on_missed=missed.append)
        assert missed == []
    # and the Node.js example does the same
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
    node = await asyncio.create_subprocess_exec(
        "node", "create-and-follow.mjs", "--tenant", "acme", "--timeout", "60", cwd=ROOT / "examples" / "node",
        env={**env, "LONGRUN_AMQP_URL": acme_user.url}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(node.communicate(), timeout=90)
    # Then both runs completed: the clients' queues are named as a tenant's user may name them
    assert outcome.status == "COMPLETED"
    assert node.returncode == 0, err.decode()
    assert '"status":"COMPLETED"' in out.decode().splitlines()[-1]


async def _ended(handed: list[Any]) -> bool:
    return any(e.type == "run.event" and e.payload.status in TERMINAL for e in handed)
