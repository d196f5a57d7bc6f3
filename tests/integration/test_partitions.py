"""Per-run order across partitions and replicas; poison isolation; failover after a SIGKILL."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from sqlalchemy import text

from tests.fixtures import PARTITIONS, eventually
from tests.integration.bus_helpers import applied, create_probe_table, enqueue, publish, route, scalar, wakeup

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
    services.start("relay", "services.outbox_relay")
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


async def _count_is(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM probe_handled") >= n
