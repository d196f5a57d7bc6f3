"""Eager publish after commit (``longrun.eager_publish``): a worker's own rows reach the bus without
the relay; the relay leaves a held row (and everything after it in its partition) alone until its
hold lapses, then publishes it first."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import text

from longrun.bus import topology
from longrun.bus.codec import to_message
from longrun.db import outbox
from longrun.relay import Relay
from tests.fixtures import PARTITIONS, eventually
from tests.integration.bus_helpers import enqueue, scalar, wakeup
from tests.integration.ensemble import Ensemble, new_key, publish_create, run_id_for, status_of

pytestmark = pytest.mark.integration


async def _tap(bus, exchange_name: str, key: str) -> Any:  # type: ignore[no-untyped-def]
    """A queue of this test's bound to ``exchange_name`` with ``key``."""
    channel = await bus.channel(prefetch=100)
    exchange = await channel.get_exchange(exchange_name, ensure=False)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, key)
    return queue


async def _drain(queue: Any) -> list[dict[str, Any]]:
    got = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(json.loads(message.body))
    return got


async def test_a_lone_run_s_events_reach_the_bus_from_its_worker_with_no_relay_running(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the scheduler and a worker, no relay anywhere, and a consumer of every run event
    events = await _tap(bus, topology.EVENTS_EXCHANGE, "#")
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("scheduler", "longrun.services.scheduler")
    ensemble.start("worker", "longrun.services.worker")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_={"steps": 3}, workflow="steps")
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    # When the creation's rows (written by the scheduler: the relay's) are published as a relay
    # would, once: its acceptance and the worker's wakeup
    async with engine.begin() as conn:
        created = (await conn.execute(text(
            "UPDATE outbox SET published_at = now() WHERE aggregate_id = :r "
            "RETURNING type, exchange, routing_key, payload"), {"r": run_id})).all()
    assert sorted(row.type for row in created) == ["run.accepted", "run.wakeup"]
    for row in created:
        await bus.publish(row.exchange, row.routing_key, to_message(outbox.envelope_of(row.type, row.payload)))
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), what="the run completed")
    # Then the worker held its status events and published them itself, in seq order, each once
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT payload -> 'payload' ->> 'seq' AS seq, payload -> 'payload' ->> 'status' AS status, "
            "hold_until IS NOT NULL AS held FROM outbox WHERE aggregate_id = :r AND type = 'run.event' "
            "ORDER BY id"), {"r": run_id})).all()
    assert [(r.status, r.held) for r in rows] == [("RUNNING", True), ("COMPLETED", True)]
    received: list[dict[str, Any]] = []

    async def both_on_the_bus() -> bool:
        received.extend(e for e in await _drain(events) if e["type"] == "run.event" and e["run_id"] == run_id)
        return len(received) >= 2

    await eventually(both_on_the_bus, what="both events on the bus")
    assert [e["payload"]["seq"] for e in received] == [int(r.seq) for r in rows]
    # and marked them sent: nothing is left for a relay
    await eventually(lambda: _unpublished_is(engine, 0), what="the worker's marks")


async def _is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status


async def test_the_relay_leaves_a_held_row_and_what_follows_it_until_the_hold_lapses_then_publishes_it_first(
        clean, engine, statements, bus) -> None:
    # Given three wakeups of one run in one partition, the first held by its writer for 1.5 s (a
    # worker that died before publishing it), and one of another run in another partition
    held_run = "run-held"
    other_run = next(f"run-other-{i}" for i in range(100)
                     if topology.partition_of(f"run-other-{i}", PARTITIONS) != topology.partition_of(held_run, PARTITIONS))
    async with engine.begin() as conn:
        for i in range(3):
            await enqueue(conn, wakeup(held_run, f"w-{i}"))
        await enqueue(conn, wakeup(other_run, "o-0"))
        await conn.execute(text("UPDATE outbox SET hold_until = now() + interval '1.5 seconds' "
                                "WHERE id = (SELECT min(id) FROM outbox)"))
    queues = {run: await _tap(bus, topology.work_exchange("worker"),
                              topology.partition_key(topology.partition_of(run, PARTITIONS)))
              for run in (held_run, other_run)}
    # When a relay owns every partition
    relay = Relay(statements, bus, batch=200, poll_interval=0.2)
    stopping = asyncio.Event()
    task = asyncio.create_task(relay.run(stopping))
    await relay.acquire(set(range(PARTITIONS)))
    try:
        # Then the other partition is published at once, and nothing of the held one while it is held
        await eventually(lambda: _unpublished_is(engine, 3), what="the other partition's row published")
        await asyncio.sleep(0.8)
        assert await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 3
        assert await _drain(queues[held_run]) == []
        # and once the hold lapsed, the held row first, then the rest, in order
        await eventually(lambda: _unpublished_is(engine, 0), timeout=10, what="the held row published")
    finally:
        stopping.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [m["payload"]["reason"] for m in await _drain(queues[held_run])] == ["w-0", "w-1", "w-2"]
    assert [m["payload"]["reason"] for m in await _drain(queues[other_run])] == ["o-0"]


async def _unpublished_is(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == n


async def test_many_runs_at_once_mark_their_rows_without_deadlocking(clean, engine, bus, services, tmp_path) -> None:
    # Given the scheduler (32 slots: finishing runs hand theirs on), the relay and two workers whose
    # run leases outlast the test (a step that failed would wait its lease out), and a consumer of
    # every run event
    events = await _tap(bus, topology.EVENTS_EXCHANGE, "#")
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("scheduler", "longrun.services.scheduler", LONGRUN_TENANT_SLOTS="32")
    ensemble.start("relay", "longrun.services.outbox_relay")
    workers = [ensemble.start("worker", "longrun.services.worker", LONGRUN_RUN_LEASE_TTL="120") for _ in range(2)]
    # When 150 runs step, 32 at once, their transitions marking what their worker got confirmed
    keys = [new_key() for _ in range(150)]
    for key in keys:
        await publish_create(bus, tenant="acme", key=key, input_={"steps": 3}, workflow="steps")
    # Then every run completes without a step failing, and each run's events reach the consumer in seq order
    await eventually(lambda: _completed(engine, 150), timeout=60, what="150 runs completed")
    for worker in workers:
        assert "deadlock" not in worker.output() and "step failed" not in worker.output()
    await eventually(lambda: _unpublished_is(engine, 0), what="every row published")
    seqs: dict[str, list[int]] = {}
    for event in await _drain(events):
        if event["type"] == "run.event":
            seqs.setdefault(event["run_id"], []).append(event["payload"]["seq"])
    assert len(seqs) == 150 and all(s == sorted(set(s)) for s in seqs.values()), seqs
    async with engine.connect() as conn:
        held = (await conn.execute(text(
            "SELECT count(*) FILTER (WHERE hold_until IS NOT NULL) FROM outbox WHERE type = 'run.event'"))).scalar()
    assert held > 0


async def _completed(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM runs WHERE status = 'COMPLETED'") == n
