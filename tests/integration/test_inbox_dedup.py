"""The same message delivered three times changes state once; the repeats get the first outcome."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from sqlalchemy import text

from longrun.bus import topology
from longrun.bus.consumer import QueueConsumer
from longrun.ports.inbox import Outcome
from tests.fixtures import eventually
from tests.integration.bus_helpers import applied, create_probe_table, publish, route, scalar, wakeup
from tests.probe_consumer import make_handler

pytestmark = pytest.mark.integration


async def test_a_message_delivered_three_times_changes_state_once(clean, engine, bus) -> None:
    # Given one wakeup published three times onto its partition
    await create_probe_table(engine)
    message = wakeup("run-dedup", "w-1")
    for _ in range(3):
        await publish(bus, message)
    outcomes: list[Outcome] = []

    async def record(outcome: Outcome) -> None:
        outcomes.append(outcome)

    _, _, k = route("run-dedup")
    consumer = QueueConsumer(bus=bus, engine=engine, service="worker",
                             queue=topology.partition_queue("worker", k), handler=make_handler("in-test"),
                             prefetch=10, max_attempts=3, on_outcome=record)
    # When the consumer handles all three deliveries
    await consumer.start()
    await eventually(lambda: _count(outcomes, 3), what="three outcomes")
    await consumer.stop()
    # Then state changed once, and the second and third got the first outcome
    assert await applied(engine) == [("run-dedup", "w-1", "in-test")]
    assert [o.duplicate for o in outcomes] == [False, True, True]
    assert outcomes[1].outcome == outcomes[2].outcome == outcomes[0].outcome == {
        "applied_by": "in-test", "wakeup_id": "w-1"}


async def _count(items: list[Outcome], n: int) -> bool:
    return len(items) >= n


async def test_messages_waiting_together_are_handled_in_one_transaction_and_a_failing_one_is_isolated(
        clean, engine, bus) -> None:
    # Given a consumer handling up to 10 waiting messages together, held on a first message until the
    # others wait behind it: two wakeups, a copy of one, a copy of the message already handled, a body
    # that is not JSON and a third wakeup
    await create_probe_table(engine)
    gates = {"gate-1": asyncio.Event(), "gate-2": asyncio.Event()}
    probe = make_handler("in-test")

    async def handle(conn, envelope):  # type: ignore[no-untyped-def]
        wakeup_id = envelope.payload.wakeup_id
        if wakeup_id in gates:
            await gates[wakeup_id].wait()
        if wakeup_id == "boom":
            raise RuntimeError("this message always fails")
        return await probe(conn, envelope)

    outcomes: list[Outcome] = []

    async def record(outcome: Outcome) -> None:
        outcomes.append(outcome)

    exchange, key, k = route("run-batch")
    consumer = QueueConsumer(bus=bus, engine=engine, service="worker", queue=topology.partition_queue("worker", k),
                             handler=handle, prefetch=20, max_attempts=2, on_outcome=record, batch=10)
    gate, first, second, third = (wakeup("run-batch", w) for w in ("gate-1", "w-1", "w-2", "w-3"))
    await consumer.start()
    try:
        for envelope in (gate, first, second, first, gate):
            await publish(bus, envelope)
        await bus.publish(exchange, key, aio_pika.Message(body=b"not json", message_id="garbage"))
        await publish(bus, third)
        await eventually(lambda: _waiting(consumer, 6), what="six messages waiting behind the first")
        gates["gate-1"].set()
        await eventually(lambda: _count(outcomes, 6), what="six outcomes")
        # Then each distinct message changed state once, the three new ones in one transaction
        assert await applied(engine) == [("run-batch", w, "in-test") for w in ("gate-1", "w-1", "w-2", "w-3")]
        assert len(await _transactions(engine, ["w-1", "w-2", "w-3"])) == 1
        # and the copies got the recorded outcomes, in delivery order; the body that is not JSON is quarantined
        assert [(o.envelope.payload.wakeup_id, o.duplicate) for o in outcomes] == [
            ("gate-1", False), ("w-1", False), ("w-2", False), ("w-1", True), ("gate-1", True), ("w-3", False)]
        assert outcomes[3].outcome == outcomes[1].outcome == {"applied_by": "in-test", "wakeup_id": "w-1"}
        assert await scalar(engine, "SELECT count(*) FROM quarantine WHERE error_code = 'decode_error'") == 1

        # When a message of a batch fails every time
        for w in ("gate-2", "w-4", "boom", "w-5"):
            await publish(bus, wakeup("run-batch", w))
        await eventually(lambda: _waiting(consumer, 3), what="three messages waiting behind the first")
        gates["gate-2"].set()
        await eventually(lambda: _count(outcomes, 9), what="the messages around the failing one handled")
        # Then the batch was rolled back and handled one at a time: the others applied, the failing
        # one quarantined after its attempts, nothing left unacked
        assert [w for _, w, _ in await applied(engine)][-3:] == ["gate-2", "w-4", "w-5"]
        assert len(await _transactions(engine, ["w-4", "w-5"])) == 2
        await eventually(lambda: _quarantined(engine, "boom"), what="the failing message quarantined")
    finally:
        await consumer.stop()
    queue = await (await bus.channel(prefetch=1)).get_queue(topology.partition_queue("worker", k), ensure=False)
    assert (await queue.declare()).message_count == 0


async def _waiting(consumer: QueueConsumer, n: int) -> bool:
    return consumer._inbox.qsize() >= n


async def _transactions(engine, wakeup_ids: list[str]) -> set[str]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return set((await conn.execute(text("SELECT xmin::text FROM probe_handled WHERE wakeup_id = ANY(:w)"),
                                       {"w": wakeup_ids})).scalars())


async def _quarantined(engine, wakeup_id: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        bodies = (await conn.execute(text("SELECT body FROM quarantine"))).scalars().all()
    return any(f'"wakeup_id":"{wakeup_id}"'.encode() in b for b in bodies)
