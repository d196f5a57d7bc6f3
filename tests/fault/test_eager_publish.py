"""Rows 26-26d: a worker publishes its own transitions' outbox rows right after the commit
(``longrun.eager_publish``), broken between the commit and the publish, between the confirm and the
mark, by the broker going away during the publish, and by an operator's row left unsent ahead of
the worker's next one.

Each row reads what a downstream consumer got: a durable queue bound to the events exchange with
``#`` before the run starts, drained at the end. Every status event the run's history caused must
be there, and a consumer that drops an event whose seq is not above the last it saw (as the client
does) must see all of them, in seq order. The hold is 1 s (``LONGRUN_EAGER_PUBLISH_GRACE``), so the
relay publishes what a worker left within seconds.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from longrun.bus import topology
from longrun.domain import RunStatus
from tests.fault.scenario import EVERYTHING, Scenario
from tests.infra import broker_stopped

pytestmark = [pytest.mark.fault, pytest.mark.integration]

GRACE = {"LONGRUN_EAGER_PUBLISH_GRACE": "1"}
STEPS = ("scheduler", "relay", "reconciler")


class Tap:
    """A durable queue bound to every run event: what a consumer downstream receives, kept across a
    broker restart."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.name = f"tap-{uuid.uuid4().hex[:8]}"

    async def open(self) -> None:
        channel = await self.scenario.bus.channel(prefetch=1)
        exchange = await channel.get_exchange(topology.EVENTS_EXCHANGE, ensure=False)
        queue = await channel.declare_queue(self.name, durable=True)
        await queue.bind(exchange, "#")
        await channel.close()

    async def seqs(self, run_id: str) -> list[int]:
        """The seqs of the run's status events, in the order they arrived (copies included)."""
        await self.scenario.bus.ensure_connected()
        channel = await self.scenario.bus.channel(prefetch=1)
        queue = await channel.declare_queue(self.name, durable=True)
        got = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            body = json.loads(message.body)
            if body["type"] == "run.event" and body["run_id"] == run_id:
                got.append(body["payload"]["seq"])
        await channel.close()
        return got


def as_a_consumer_sees(arrived: list[int]) -> list[int]:
    """What a consumer that drops an event whose seq is not above the last it saw keeps."""
    kept: list[int] = []
    for seq in arrived:
        if not kept or seq > kept[-1]:
            kept.append(seq)
    return kept


async def written(scenario: Scenario, run_id: str) -> list[dict[str, Any]]:
    """The run's status event rows in the outbox, in id order: seq, held by a worker, published."""
    rows = await scenario.rows("SELECT payload, hold_until IS NOT NULL AS held, published_at IS NOT NULL AS sent "
                               "FROM outbox WHERE aggregate_id = :r AND type = 'run.event' ORDER BY id", r=run_id)
    return [{"seq": r.payload["payload"]["seq"], "status": r.payload["payload"]["status"], "held": r.held,
             "sent": r.sent} for r in rows]


async def delivered_in_order(scenario: Scenario, tap: Tap, run_id: str) -> list[int]:
    """Once the outbox is drained: every status event reached the consumer, in seq order. Returns what arrived."""
    await scenario.poll(lambda: scenario.scalar("SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"),
                        timeout=30, what="every outbox row published")
    seqs = [row["seq"] for row in await written(scenario, run_id)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    arrived = await tap.seqs(run_id)
    assert as_a_consumer_sees(arrived) == seqs, arrived
    return arrived


async def every_step_once(scenario: Scenario, run_id: str, steps: int) -> None:
    ledger = await scenario.ledger(run_id)
    assert {name: (row.status, row.attempts) for name, row in ledger.items()} == {
        f"step:{i}": ("CONFIRMED", 1) for i in range(steps)}


async def test_a_worker_killed_between_its_commit_and_its_eager_publish_leaves_the_row_to_the_relay(
        scenario: Scenario) -> None:
    # Given a steps run, a consumer of its events, and a worker armed to die right after the commit
    # of its first held rows (the run's move to RUNNING), before publishing them
    tap = Tap(scenario)
    await tap.open()
    await scenario.up(*STEPS, forge=False, **GRACE)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="eager.after_commit_before_publish", **GRACE)
    run_id = await scenario.create(workflow="steps", input_={"steps": 3})
    await scenario.crashed(doomed, "eager.after_commit_before_publish")
    # the row is committed, held by the dead worker, and not on the bus
    assert [(r["status"], r["held"], r["sent"]) for r in await written(scenario, run_id)][-1] == (
        "RUNNING", True, False)
    # When a fresh worker takes the run over once its lease expired
    scenario.start("worker", **GRACE)
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    # Then the relay published the dead worker's row once its hold lapsed, and every event reached
    # the consumer in seq order; every step was made once
    await delivered_in_order(scenario, tap, run_id)
    await every_step_once(scenario, run_id, 3)
    await scenario.finish()


async def test_a_worker_killed_between_the_confirm_and_the_mark_has_its_row_published_again_harmlessly(
        scenario: Scenario) -> None:
    # Given a steps run and a worker armed to die once the broker confirmed its first held rows,
    # before they are marked
    tap = Tap(scenario)
    await tap.open()
    await scenario.up(*STEPS, forge=False, **GRACE)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="eager.after_confirm_before_mark", **GRACE)
    run_id = await scenario.create(workflow="steps", input_={"steps": 3})
    await scenario.crashed(doomed, "eager.after_confirm_before_mark")
    running = (await written(scenario, run_id))[-1]
    assert (running["status"], running["held"], running["sent"]) == ("RUNNING", True, False)
    # When a fresh worker takes the run over
    scenario.start("worker", **GRACE)
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    # Then the row went out twice (the dead worker's confirmed copy, the relay's after the hold),
    # and the consumer still sees each event once, in seq order
    arrived = await delivered_in_order(scenario, tap, run_id)
    assert arrived.count(running["seq"]) == 2, arrived
    await every_step_once(scenario, run_id, 3)
    await scenario.finish()


async def test_the_broker_gone_during_the_eager_publish_leaves_the_row_to_the_relay_once_it_is_back(
        scenario: Scenario, local_broker: None) -> None:
    # Given a run making a five-second read, its worker publishing eagerly
    kinds = {"LONGRUN_RUN_KINDS": "tests.kinds:long_call", **GRACE}
    tap = Tap(scenario)
    await tap.open()
    await scenario.up(*STEPS, forge=False, **kinds)
    scenario.start("worker", **kinds)
    run_id = await scenario.create(workflow="long_call", input_={
        "repo": "acme/payments", "branch": "unused", "effect": "read", "beats": 10, "every": 0.5, "stall": "",
        "stall_file": "", "stall_seconds": 0})
    await scenario.poll(lambda: scenario.scalar("SELECT progress FROM actions WHERE run_id = :r", r=run_id),
                        timeout=20, what="the read under way")
    # When the broker stops while the read runs, and the worker commits the run's end meanwhile
    async with broker_stopped():
        done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
        # the terminal event is committed, held, and could not be published
        last = (await written(scenario, run_id))[-1]
        assert (last["status"], last["held"], last["sent"]) == ("COMPLETED", True, False)
    # Then once the broker is back the relay publishes it, after the run's earlier events
    assert done.snapshot.status is RunStatus.COMPLETED
    await delivered_in_order(scenario, tap, run_id)
    await scenario.finish()


async def test_an_operator_s_row_unsent_keeps_the_worker_s_next_row_behind_it(scenario: Scenario) -> None:
    # Given the dependency upgrade whose first commit is in flight (the forge holds its answer 3 s),
    # a consumer of its events, and the relay gone: whatever an operator writes stays unsent
    tap = Tap(scenario)
    await tap.open()
    await scenario.up(*EVERYTHING, forge_faults=({"endpoint": "commits", "mode": "timeout_after_commit",
                                                   "times": 1, "hold_seconds": 3},),
                      LONGRUN_FORGE_TIMEOUT="10", **GRACE)
    run_id = await scenario.create()
    await scenario.poll(lambda: scenario.scalar(
        "SELECT status = 'SUBMITTED' FROM actions WHERE run_id = :r AND logical_action = 'commit:1'", r=run_id),
        timeout=30, what="commit:1 in flight")
    for relay in scenario.running("relay"):
        relay.kill()
    # When an operator cancels the run meanwhile (its CANCELLING event is the relay's to publish)
    response = await scenario.operate(run_id, "cancel", "no longer wanted")
    assert response.status_code == 200, response.text
    # and the worker records the answer and ends the run
    await scenario.until(run_id, RunStatus.CANCELLED, timeout=30)
    # Then the worker did not publish its CANCELLED event ahead of the operator's unsent one: both
    # wait for the relay, while what it wrote before went out eagerly
    rows = await written(scenario, run_id)
    assert [(r["status"], r["held"], r["sent"]) for r in rows[-2:]] == [
        ("CANCELLING", False, False), ("CANCELLED", False, False)]
    assert [(r["held"], r["sent"]) for r in rows if r["status"] == "RUNNING"] == [(True, True)]
    # and once a relay is back, the consumer gets both, the operator's first
    scenario.start("relay", **GRACE)
    await delivered_in_order(scenario, tap, run_id)
    await scenario.finish()
