"""Rows: a worker publishes its own messages right after their commit (``longrun.bus.eager``), and
fails at each point of it: killed before it published, killed after the broker confirmed and before
it marked the rows sent, its broker connection dropped under it; and an operator's row waits unsent
while the worker writes the run's next.

Each ends with every message of the run delivered, a consumer bound to the events exchange hearing
the run's status events in seq order (a duplicate may follow; the client's seq check drops it), and
every step's effect once. The test services' grace is 2 s (``tests.harness``): the relay's sweep comes soon.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aio_pika
import pytest

from longrun.bus.topology import EVENTS_EXCHANGE
from longrun.domain import RunStatus
from tests.fault.scenario import EVERYTHING, Scenario
from tests.infra import close_connections_named

pytestmark = [pytest.mark.fault, pytest.mark.integration]

STEPS = {"steps": 3}


class Heard:
    """The run events a consumer bound to the events exchange receives, in arrival order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []
        """(run_id, seq, event_id)"""

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        body = json.loads(message.body)
        if body.get("type") == "run.event":
            self.events.append((body["run_id"], body["payload"]["seq"], body["event_id"]))
        await message.ack()

    def of(self, run_id: str) -> list[tuple[int, str]]:
        return [(seq, event_id) for run, seq, event_id in self.events if run == run_id]


@pytest.fixture
async def heard(scenario: Scenario) -> AsyncIterator[Heard]:
    listener = Heard()
    connection = await aio_pika.connect(scenario.infra.amqp_url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "#")
        await queue.consume(listener.on_message)
        yield listener
    finally:
        await connection.close()


async def _heard_in_order(scenario: Scenario, heard: Heard, run_id: str) -> list[tuple[int, str]]:
    """Every run.event row of the run's outbox was heard, the first copies in rising seq; what was heard."""
    rows = await scenario.rows("SELECT event_id FROM outbox WHERE aggregate_id = :r AND type = 'run.event' ORDER BY id",
                               r=run_id)
    written = [r.event_id for r in rows]

    async def all_heard() -> bool:
        return set(written) <= {event_id for _, event_id in heard.of(run_id)}

    await scenario.poll(all_heard, timeout=20, what="every status event of the run heard on the bus")
    first: dict[str, int] = {}
    for seq, event_id in heard.of(run_id):
        first.setdefault(event_id, seq)
    assert list(first.values()) == sorted(first.values()), heard.of(run_id)
    assert list(first) == written, (list(first), written)
    return heard.of(run_id)


async def _steps_once(scenario: Scenario, run_id: str) -> None:
    types = [e["type"] for e in await scenario.events(run_id)]
    assert types.count("action.recorded") == STEPS["steps"] and types.count("run.completed") == 1, types


async def _left_to_the_relay(scenario: Scenario, run_id: str) -> int:
    """Eager rows of the run the relay published once their grace had passed."""
    return await scenario.scalar("SELECT count(*) FROM outbox WHERE aggregate_id = :r AND published_at >= eager_until",
                                 r=run_id)


async def _on_a_worker_killed_at(scenario: Scenario, point: str) -> str:
    """A steps run created on the only worker, armed to die at ``point``; its id once that worker died."""
    await scenario.up("scheduler", "reconciler", "relay", forge=False)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS=point)
    run_id = await scenario.create(workflow="steps", input_=STEPS)
    await scenario.crashed(doomed, point)
    return run_id


async def test_a_worker_killed_between_its_commit_and_its_publish_leaves_its_rows_to_the_relay(
        scenario: Scenario, heard: Heard) -> None:
    # Given a steps run on a worker armed to die after a commit whose rows it was to publish itself
    run_id = await _on_a_worker_killed_at(scenario, "worker.after_commit_before_eager_publish")
    assert await scenario.scalar("SELECT count(*) FROM outbox WHERE aggregate_id = :r AND eager_until IS NOT NULL "
                                 "AND published_at IS NULL", r=run_id) >= 1
    # When another worker goes on with the run
    scenario.start("worker")
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=60)
    # Then the rows the dead worker left went out through the relay once their grace passed, every
    # status event was heard in order, and every step ran once
    await _heard_in_order(scenario, heard, run_id)
    assert await _left_to_the_relay(scenario, run_id) >= 1
    await _steps_once(scenario, run_id)
    await scenario.finish()


async def test_a_worker_killed_between_the_confirm_and_the_mark_has_its_rows_published_again(
        scenario: Scenario, heard: Heard) -> None:
    # Given a steps run on a worker armed to die once the broker confirmed its own publish, before it
    # marked the rows sent
    run_id = await _on_a_worker_killed_at(scenario, "worker.after_eager_publish_before_mark")
    # When another worker goes on with the run
    scenario.start("worker")
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=60)
    # Then the relay published the confirmed but unmarked rows again after their grace: a consumer heard a
    # copy twice, the first copies in seq order; every step ran once
    await scenario.finish()
    events = await _heard_in_order(scenario, heard, run_id)
    assert len(events) > len({event_id for _, event_id in events}), events
    assert await _left_to_the_relay(scenario, run_id) >= 1
    await _steps_once(scenario, run_id)


async def test_a_worker_whose_broker_connection_drops_under_its_publish_leaves_its_rows_to_the_relay(
        scenario: Scenario, heard: Heard) -> None:
    # Given a worker whose connection for its own publishes the broker has just closed
    await scenario.up("scheduler", "reconciler", "relay", "worker", forge=False)
    worker = scenario.running("worker")[0]

    async def dropped() -> bool:
        return await asyncio.to_thread(close_connections_named, scenario.infra.vhost, f"worker-eager/{worker.name}") == 1

    await scenario.poll(dropped, timeout=30, what="the worker's publishing connection closed by the broker")
    # When a run steps on it meanwhile
    run_id = await scenario.create(workflow="steps", input_=STEPS)
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=60)
    # Then what it could not publish went out through the relay after its grace, in order, and the
    # worker, reconnected, goes on publishing its own rows
    await _heard_in_order(scenario, heard, run_id)
    assert await _left_to_the_relay(scenario, run_id) >= 1
    await _steps_once(scenario, run_id)
    await scenario.poll(lambda: _published_eagerly(scenario), timeout=30, what="a later run's rows published eagerly")
    assert worker.alive()
    await scenario.finish()


async def _published_eagerly(scenario: Scenario) -> bool:
    await scenario.create(workflow="steps", input_={"steps": 1})
    return bool(await scenario.scalar("SELECT count(*) FROM outbox WHERE published_at < eager_until"))


async def test_an_operators_row_left_unsent_keeps_the_workers_next_row_behind_it(
        scenario: Scenario, heard: Heard) -> None:
    # Given the dependency upgrade whose first commit is in flight: the forge holds the answer 3 s
    await scenario.up(*EVERYTHING, forge_faults=({"endpoint": "commits", "mode": "timeout_after_commit",
                                                   "times": 1, "hold_seconds": 3},),
                      LONGRUN_FORGE_TIMEOUT="10")
    run_id = await scenario.create()
    await scenario.poll(lambda: _in_flight(scenario, run_id, "commit:1"), timeout=30, what="commit:1 in flight")
    # When the relay is frozen, the operator cancels the run (its CANCELLING event waits unsent), and the
    # worker, the answer in, records it and ends the run
    relay = scenario.running("relay")[0]
    relay.pause()
    try:
        response = await scenario.operate(run_id, "cancel", "the upgrade is no longer wanted")
        assert response.status_code == 200, response.text
        await scenario.until(run_id, RunStatus.CANCELLED, timeout=30)
        # Then the worker did not publish its rows past the operator's: they wait for the relay too
        unsent = await scenario.rows("SELECT eager_until FROM outbox WHERE aggregate_id = :r AND type = 'run.event' "
                                     "AND published_at IS NULL ORDER BY id", r=run_id)
        assert len(unsent) >= 2 and all(r.eager_until is None for r in unsent), unsent
    finally:
        relay.resume()
    # and once the relay is back, a consumer hears the operator's event, then the worker's, in seq order
    await _heard_in_order(scenario, heard, run_id)
    assert await scenario.forge_counts() == {"branch": 1, "commit": 1}
    await scenario.finish()


async def _in_flight(scenario: Scenario, run_id: str, action: str) -> bool:
    row = (await scenario.ledger(run_id)).get(action)
    return row is not None and row.status == "SUBMITTED"
