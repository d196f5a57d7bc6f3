"""The same message delivered three times changes state once; the repeats get the first outcome."""

from __future__ import annotations

import pytest

from longrun.bus import topology
from longrun.bus.consumer import Outcome, QueueConsumer
from tests.fixtures import eventually
from tests.integration.bus_helpers import applied, create_probe_table, publish, route, wakeup
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
