"""Per-run order across partitions and replicas; poison isolation; failover after a SIGKILL;
every owned partition consumed again after a consumer or its connection broke at an exact point."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator

import aiormq
import pytest
from sqlalchemy import text

from longrun.bootstrap import consume_partitions
from longrun.bus import connection as bus_connection
from longrun.bus import topology
from longrun.bus.consumer import QueueConsumer
from longrun.config import Settings
from longrun.db import membership
from longrun.service import Health
from tests.fixtures import PARTITIONS, eventually
from tests.infra import close_connections_named
from tests.integration.bus_helpers import applied, create_probe_table, enqueue, publish, route, scalar, wakeup
from tests.probe_consumer import make_handler

pytestmark = pytest.mark.integration


async def owners(engine) -> dict[str, set[int]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT owner, partition FROM partition_leases WHERE service = 'worker' "
            "AND owner IS NOT NULL AND lease_until > now()"))
        held: dict[str, set[int]] = defaultdict(set)
        for owner, k in rows:
            held[owner].add(k)
        return dict(held)


async def test_each_runs_messages_are_handled_in_publish_order(clean, engine, services) -> None:
    # Given 2 consumer replicas and a relay
    await create_probe_table(engine)
    services.start("consumer", "tests.probe_consumer")
    services.start("consumer", "tests.probe_consumer")
    services.start("relay", "longrun.services.outbox_relay")
    # (each holding its share of the partitions: one replica alone would drain 1,000 messages before
    # the other's first lease)
    await eventually(lambda: _owners_are(engine, 2), timeout=30, what="both replicas holding partitions")
    # When 1,000 messages over 200 runs (8 partitions) are committed, each run's in sequence
    runs = [f"run-{i}" for i in range(200)]
    for seq in range(5):
        async with engine.begin() as conn:
            for run in runs:
                await enqueue(conn, wakeup(run, f"{seq}"))
    await eventually(lambda: _count_is(engine, 1000), timeout=90, what="1,000 messages applied")
    # Then every run's messages were applied once each, in the order they were published
    by_run: dict[str, list[int]] = defaultdict(list)
    consumers = set()
    for run_id, wakeup_id, consumer in await applied(engine):
        by_run[run_id].append(int(wakeup_id))
        consumers.add(consumer)
    assert {run: seqs for run, seqs in by_run.items() if seqs != [0, 1, 2, 3, 4]} == {}
    assert len(by_run) == 200
    assert len({route(r)[2] for r in runs}) == PARTITIONS
    assert consumers == {"consumer-0", "consumer-1"}


async def test_poison_messages_are_quarantined_with_their_reason_and_the_partition_keeps_flowing(
        clean, engine, bus, services) -> None:
    # Given a consumer and, on one partition: a good message, garbage, an unknown version, a good one
    await create_probe_table(engine)
    exchange, key, _ = route("run-poison")
    await publish(bus, wakeup("run-poison", "before"))
    await bus.publish(exchange, key, _raw(b"{not json"))
    unknown = wakeup("run-poison", "future").model_dump(mode="json")
    unknown["schema_version"] = 99
    await bus.publish(exchange, key, _raw(__import__("json").dumps(unknown).encode()))
    await publish(bus, wakeup("run-poison", "after"))
    services.start("consumer", "tests.probe_consumer")
    # Then both bad ones are in quarantine with their reason, owner and queue
    await eventually(lambda: _count_is(engine, 2), what="good messages applied")
    assert [w for _, w, _ in await applied(engine)] == ["before", "after"]
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT error_code, reason, owner, queue, attempts, body FROM quarantine ORDER BY id"))).all()
    assert [r.error_code for r in rows] == ["decode_error", "unknown_schema_version"]
    assert "not JSON" in rows[0].reason and rows[0].body == b"{not json"
    assert "unknown schema_version 99 for type 'run.wakeup' (known: 1)" in rows[1].reason
    assert {(r.owner, r.queue) for r in rows} == {("worker", f"longrun.worker.p{route('run-poison')[2]}")}


@pytest.mark.long
async def test_a_killed_replicas_partitions_move_to_the_survivor_within_the_lease_ttl(
        clean, engine, bus, services) -> None:
    # Given two replicas that split the partitions
    await create_probe_table(engine)
    services.start("consumer", "tests.probe_consumer")
    victim = services.start("consumer", "tests.probe_consumer")
    await eventually(lambda: _split_evenly(engine), what="an even split")
    held = (await owners(engine))["consumer-1"]
    # When one is SIGKILLed and a message arrives on every partition
    victim.kill()
    killed_at = time.monotonic()
    runs = _one_run_per_partition()
    for run in runs:
        await publish(bus, wakeup(run, "after-kill"))
    # Then the survivor consumes them all within the lease TTL (3 s) plus a few seconds
    await eventually(lambda: _count_is(engine, PARTITIONS), timeout=15, what="every partition consumed")
    took = time.monotonic() - killed_at
    assert took < 3 + 5, f"failover took {took:.1f}s"
    assert {c for _, _, c in await applied(engine)} == {"consumer-0"}
    assert (await owners(engine))["consumer-0"] >= held


# -- one replica in this process, broken at an exact point: each fault left a partition that the
# replica owned (per partition_leases) with no live consumer, and its messages waiting forever.

REPLICA = "replica-0"
BROKEN = 3
"""The partition whose consumer each fault hits."""
BROKEN_QUEUE = topology.partition_queue("worker", BROKEN)


async def test_a_partition_whose_consumer_failed_to_start_is_started_on_a_later_round(
        clean, engine, bus, services, monkeypatch) -> None:
    # Given one partition's consumer fails to start once (its channel open times out under load)
    await create_probe_table(engine)
    failed: list[str] = []
    real_start = QueueConsumer.start

    async def start(self: QueueConsumer) -> None:
        if self.queue == BROKEN_QUEUE and not failed:
            failed.append(self.queue)
            raise TimeoutError("channel open timed out")
        await real_start(self)

    monkeypatch.setattr(QueueConsumer, "start", start)
    # When the replica takes every partition
    async with _replica(services):
        await eventually(lambda: _owns_all(engine), what=f"{REPLICA} owning every partition")
        # Then a message on each partition is handled, the one that failed to start included
        await _a_message_on_each_partition_is_handled(engine, bus)
    assert failed == [BROKEN_QUEUE]


async def test_a_consumer_started_as_the_connection_drops_is_replaced_after_the_reconnect(
        clean, infra, engine, bus, services, monkeypatch) -> None:
    # Given the connection drops the moment one partition's consumer has started, and the replica
    # records that consumer just as the reconnect sweeps away the consumers of the dropped connection
    await create_probe_table(engine)
    drops: list[asyncio.Task[int]] = []
    real_start = QueueConsumer.start

    async def start(self: QueueConsumer) -> None:
        await real_start(self)
        if self.queue == BROKEN_QUEUE and not drops:
            drops.append(asyncio.create_task(
                asyncio.to_thread(close_connections_named, infra.vhost, f"worker/{REPLICA}")))
            await self.bus.lost.wait()

    monkeypatch.setattr(QueueConsumer, "start", start)
    # When the replica takes every partition and reconnects
    async with _replica(services):
        await eventually(lambda: _owns_all(engine), what=f"{REPLICA} owning every partition")
        await eventually(lambda: _true(bool(drops) and drops[0].done()), what="the connection dropped")
        # Then a message on each partition is handled: no consumer of the dead connection is kept
        await _a_message_on_each_partition_is_handled(engine, bus)
    assert drops[0].result() == 1


async def _close_its_channel(consumer: QueueConsumer) -> None:
    """A channel error: the broker closes that channel only, as it does to a delivery left unacked
    past its ack timeout."""
    assert consumer._channel is not None
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await consumer._channel.get_queue("longrun.no-such-queue", ensure=True)


async def _cancel_its_consumer(consumer: QueueConsumer) -> None:
    """What a broker's basic.cancel leaves (its queue deleted or recovering): the channel open, no consumer."""
    assert consumer._channel is not None and consumer._tag is not None
    await (await consumer._channel.get_underlay_channel()).basic_cancel(consumer._tag)


@pytest.mark.parametrize("stop_it", [_close_its_channel, _cancel_its_consumer],
                         ids=["channel-closed", "consumer-cancelled"])
async def test_a_consumer_stopped_on_a_live_connection_is_restarted(
        clean, engine, bus, services, monkeypatch, stop_it) -> None:
    # Given a replica consuming every partition
    await create_probe_table(engine)
    started: dict[str, QueueConsumer] = {}
    real_start = QueueConsumer.start

    async def start(self: QueueConsumer) -> None:
        await real_start(self)
        started[self.queue] = self

    monkeypatch.setattr(QueueConsumer, "start", start)
    async with _replica(services):
        await eventually(lambda: _owns_all(engine), what=f"{REPLICA} owning every partition")
        await eventually(lambda: _true(len(started) == PARTITIONS), what="a consumer on every partition")
        # When one partition's consumer stops while the connection stays up
        stopped = started[BROKEN_QUEUE]
        await stop_it(stopped)
        # Then a message on each partition is handled, by a new consumer on that partition
        await _a_message_on_each_partition_is_handled(engine, bus)
        assert started[BROKEN_QUEUE] is not stopped and started[BROKEN_QUEUE].alive


async def test_a_connection_dropped_again_while_reconnecting_is_reconnected(
        clean, infra, engine, bus, services, monkeypatch) -> None:
    # Given a replica consuming every partition, whose next topology declaration loses its connection
    await create_probe_table(engine)
    armed: list[bool] = []
    dropped: list[int] = []
    real_declare = bus_connection.declare

    async def declare(channel, topology_: topology.Topology) -> None:  # type: ignore[no-untyped-def]
        if armed and not dropped:
            dropped.append(await asyncio.to_thread(close_connections_named, infra.vhost, f"worker/{REPLICA}"))
        await real_declare(channel, topology_)

    monkeypatch.setattr(bus_connection, "declare", declare)
    async with _replica(services):
        await eventually(lambda: _owns_all(engine), what=f"{REPLICA} owning every partition")
        armed.append(True)
        # When its connection drops, and the new one drops too while the replica declares the topology
        assert await asyncio.to_thread(close_connections_named, infra.vhost, f"worker/{REPLICA}") == 1
        # Then it reconnects once more, and a message on each partition is handled
        await _a_message_on_each_partition_is_handled(engine, bus)
    assert dropped == [1]


async def test_partitions_taken_in_one_round_are_started_together_not_one_after_another(
        clean, engine, bus, services, monkeypatch) -> None:
    # Given a broker that answers each consumer start slowly (a busy machine: ~0.5 s per channel)
    await create_probe_table(engine)
    in_flight: list[int] = [0]
    most_at_once: list[int] = [0]
    real_start = QueueConsumer.start

    async def start(self: QueueConsumer) -> None:
        in_flight[0] += 1
        most_at_once[0] = max(most_at_once[0], in_flight[0])
        try:
            await asyncio.sleep(0.5)
            await real_start(self)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(QueueConsumer, "start", start)
    # When one replica takes every partition (as a survivor takes a dead replica's share)
    async with _replica(services):
        await eventually(lambda: _owns_all(engine), what=f"{REPLICA} owning every partition")
        # Then every partition's consumer was started at once, and a message on each is handled
        await _a_message_on_each_partition_is_handled(engine, bus)
    assert most_at_once[0] == PARTITIONS


@contextlib.asynccontextmanager
async def _replica(services) -> AsyncIterator[None]:  # type: ignore[no-untyped-def]
    """A worker replica in this process, wired as the services wire it (``consume_partitions``)."""
    settings = Settings.from_env(services.env(LONGRUN_INSTANCE_ID=REPLICA))
    stopping = asyncio.Event()
    replica = asyncio.create_task(consume_partitions(
        settings, service="worker", handler=make_handler(REPLICA), stopping=stopping, health=Health()))
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(replica, timeout=30)


async def _a_message_on_each_partition_is_handled(engine, bus) -> None:  # type: ignore[no-untyped-def]
    for run in _one_run_per_partition():
        await publish(bus, wakeup(run, "after-fault"))
    await eventually(lambda: _count_is(engine, PARTITIONS), timeout=20, what="a message handled on every partition")
    assert {c for _, _, c in await applied(engine)} == {REPLICA}
    # A fault that held up an ownership round past the TTL let the leases lapse; the next round renews them.
    await eventually(lambda: _owns_all(engine), what=f"{REPLICA} still owning every partition")


async def _owns_all(engine) -> bool:  # type: ignore[no-untyped-def]
    return await owners(engine) == {REPLICA: set(range(PARTITIONS))}


async def _true(value: bool) -> bool:
    return value


def _raw(body: bytes):  # type: ignore[no-untyped-def]
    import aio_pika

    return aio_pika.Message(body=body, message_id="raw", content_type="application/json")


def _one_run_per_partition() -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < PARTITIONS:
        found.setdefault(route(f"run-{i}")[2], f"run-{i}")
        i += 1
    return list(found.values())


async def _split_evenly(engine) -> bool:  # type: ignore[no-untyped-def]
    held = await owners(engine)
    return sorted(len(v) for v in held.values()) == [PARTITIONS // 2, PARTITIONS // 2]


async def _owners_are(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(DISTINCT owner) FROM partition_leases "
                                "WHERE service = 'worker' AND lease_until > now()") == n


async def _count_is(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM probe_handled") >= n


async def test_a_stopping_replica_hands_its_partitions_back_then_lets_go_of_its_work_as_a_member(
        clean, engine, services) -> None:  # type: ignore[no-untyped-def]
    # Given a replica in this process owning every partition
    seen: list[tuple[int, int]] = []

    async def before_leaving() -> None:
        seen.append((await scalar(engine, f"SELECT count(*) FROM service_members WHERE instance_id = '{REPLICA}'"),
                     await scalar(engine, f"SELECT count(*) FROM partition_leases WHERE owner = '{REPLICA}'")))

    # When it stops
    await _owning_all_then_stopped(engine, services, before_leaving)
    # Then what it let go of last (a worker's calls, and their tool permits) it let go of as a member,
    # its partitions already free for the others; and then it left the member list
    assert seen == [(1, 0)]
    assert await scalar(engine, f"SELECT count(*) FROM service_members WHERE instance_id = '{REPLICA}' "
                                "AND alive_until > now()") == 0


@pytest.mark.long
async def test_a_stopping_replica_stays_a_member_out_of_the_split_for_as_long_as_it_finishes_its_work(
        clean, engine, services) -> None:  # type: ignore[no-untyped-def]
    # Given a replica in this process owning every partition, whose work in hand (a worker's rounds) takes
    # longer than its membership TTL to finish as it stops
    ttl = Settings.from_env(services.env()).partition_lease_ttl
    seen: list[tuple[int, list[str]]] = []

    async def before_leaving() -> None:
        await asyncio.sleep(ttl * 1.5)
        live = await scalar(engine, f"SELECT count(*) FROM service_members WHERE instance_id = '{REPLICA}' "
                                    "AND alive_until > now() AND stopping")
        async with engine.begin() as conn:
            seen.append((live, await membership.heartbeat(conn, "worker", "peer", ttl)))

    # When it stops
    await _owning_all_then_stopped(engine, services, before_leaving)
    # Then it was still a live member while it finished (what it holds is not taken over from it), but
    # a peer's split left it out, so its partitions were the peer's; and then it left the member list
    assert seen == [(1, ["peer"])]
    assert await scalar(engine, f"SELECT count(*) FROM service_members WHERE instance_id = '{REPLICA}' "
                                "AND alive_until > now()") == 0


async def _owning_all_then_stopped(engine, services, before_leaving) -> None:  # type: ignore[no-untyped-def]
    """A worker replica in this process, wired as the services wire it, that owns every partition and
    is then stopped, running ``before_leaving`` as it stops."""
    settings = Settings.from_env(services.env(LONGRUN_INSTANCE_ID=REPLICA))
    stopping = asyncio.Event()
    replica = asyncio.create_task(consume_partitions(
        settings, service="worker", handler=make_handler(REPLICA), stopping=stopping, health=Health(),
        before_leaving=before_leaving))
    await eventually(lambda: _owns_all(engine), what=f"{REPLICA} owning every partition")
    stopping.set()
    await asyncio.wait_for(replica, timeout=30)
