"""RabbitMQ restarted in the middle of a stream: nothing lost, relay and consumers resume alone."""

from __future__ import annotations

import asyncio

import pytest

from tests.fixtures import eventually
from tests.infra import broker_stopped
from tests.integration.bus_helpers import applied, create_probe_table, enqueue, scalar, wakeup

pytestmark = [pytest.mark.integration, pytest.mark.fault]


@pytest.mark.long
async def test_broker_restart_mid_stream_loses_nothing(clean, infra, engine, services) -> None:
    if not infra.rabbitmqctl:
        pytest.skip("needs a local broker that rabbitmqctl can restart")
    # Given a relay and two consumers handling a steady stream
    await create_probe_table(engine)
    services.start("consumer", "tests.probe_consumer")
    services.start("consumer", "tests.probe_consumer")
    services.start("relay", "longrun.services.outbox_relay")
    total = 300

    async def produce() -> None:
        for i in range(total):
            async with engine.begin() as conn:
                await enqueue(conn, wakeup(f"run-{i % 30}", f"{i // 30:03d}"))
            await asyncio.sleep(0.02)

    producer = asyncio.create_task(produce())
    await eventually(lambda: _count_at_least(engine, 50), what="the stream flowing")
    # When the broker stops mid-stream and comes back
    async with broker_stopped():
        await asyncio.sleep(2)
    await producer
    # Then everything is applied exactly once, in order per run, without any restart of ours
    await eventually(lambda: _count_at_least(engine, total), timeout=90, what="all messages applied")
    rows = await applied(engine)
    assert len(rows) == total
    assert len({(r, w) for r, w, _ in rows}) == total
    for run in {r for r, _, _ in rows}:
        seqs = [w for r, w, _ in rows if r == run]
        assert seqs == sorted(seqs), f"{run} out of order: {seqs}"
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
    assert all(p.alive() for p in services.started)


async def _count_at_least(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM probe_handled") >= n
