"""Rows: the worker is SIGKILLed at a named crash point inside a step, and a fresh worker takes over.

The crash points (``longrun.faults``) are armed from outside through ``LONGRUN_CRASH_POINTS``
on the one worker process that should die; the replacement runs clean. The dead worker's
membership and run lease (3 s each) run out together: the replacement takes the run over, or the
reconciler re-wakes it, whichever comes first, and the new lease holder carries on from what
PostgreSQL recorded.
"""

from __future__ import annotations

import asyncio

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.infra import ctl

pytestmark = [pytest.mark.fault, pytest.mark.integration]

STEPS = ("scheduler", "relay", "reconciler")
"""What a ``steps`` run needs besides its worker: creation and admission, wakeups, re-waking."""


async def test_a_worker_killed_before_the_tool_request_has_the_step_sent_once_by_its_successor(
        scenario: Scenario) -> None:
    # Given a steps run of 4 pure tool steps and a worker armed to die right before its 2nd tool
    # request. A pure call is recorded with its answer, in one transaction: nothing of step:1 is
    # on record when it dies, and nothing was sent
    await scenario.up(*STEPS, forge=False)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="worker.before_tool_request:2")
    run_id = await scenario.create(workflow="steps", input_={"steps": 4})
    # When it dies there and a fresh worker is started
    await scenario.crashed(doomed, "worker.before_tool_request")
    assert list(await scenario.ledger(run_id)) == ["step:0"]
    scenario.start("worker")
    # Then the run completes: step:1 was sent by the successor under its key, once, and every
    # step was confirmed exactly once
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    assert [a.logical_action for a in done.snapshot.actions] == ["step:0", "step:1", "step:2", "step:3"]
    assert await scenario.trail(run_id, "step:1") == ["action.recorded"]
    ledger = await scenario.ledger(run_id)
    assert {name: row.status for name, row in ledger.items()} == dict.fromkeys(ledger, "CONFIRMED")
    assert ledger["step:1"].external_id == ledger["step:1"].idempotency_key  # the echo answers with the key it got
    assert ledger["step:1"].attempts == 1 and ledger["step:0"].attempts == 1
    # by a newer lease, after exactly one recovery of the abandoned run
    events = {(e["type"], e["data"].get("logical_action")): e["token"] for e in await scenario.events(run_id)}
    assert events[("action.recorded", "step:1")] > events[("action.recorded", "step:0")]
    assert await scenario.recoveries(run_id) == 1
    await scenario.finish()


async def test_a_worker_killed_after_the_request_before_the_answer_is_recorded_leaves_one_effect(
        scenario: Scenario) -> None:
    # Given the dependency upgrade, and a worker armed to die after the forge answered its 2nd
    # request (the commit exists on the forge) but before the answer was recorded
    await scenario.up("gateway", "scheduler", "relay", "timer", "reconciler")
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="worker.after_tool_response_before_record:2")
    run_id = await scenario.create()
    await scenario.crashed(doomed, "worker.after_tool_response_before_record")
    assert (await scenario.forge_counts())["commit"] == 1
    assert (await scenario.ledger(run_id))["commit:1"].status == "SUBMITTED"
    # When a fresh worker takes over and the run goes on to its end (the owner approves the merge)
    scenario.start("worker")
    done = await scenario.to_the_end(run_id)
    # Then it completed, and the forge holds one object per intent: the commit was asked for again
    # under its recorded key, and the forge answered with the commit it had already made
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    ledger = await scenario.ledger(run_id)
    commit = ledger["commit:1"]
    assert (commit.status, commit.attempts) == ("CONFIRMED", 2)
    assert await scenario.trail(run_id, "commit:1") == ["action.prepared", "action.submitted", "action.confirmed"]
    assert done.snapshot.fact("receipt:commit:1").value["sha"] == commit.external_id  # type: ignore[union-attr,index]
    await scenario.finish()


async def test_a_worker_killed_before_the_completion_event_completes_the_run_once(scenario: Scenario) -> None:
    # Given a steps run whose worker dies with every step confirmed, right before committing run.completed
    await scenario.up(*STEPS, forge=False)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="worker.before_completion")
    run_id = await scenario.create(workflow="steps", input_={"steps": 3})
    await scenario.crashed(doomed, "worker.before_completion")
    stuck = await scenario.stored(run_id)
    assert stuck.snapshot.status is RunStatus.RUNNING and stuck.lease_owner == doomed.name
    # When a fresh worker is started (the dead one's membership lapses as its lease runs out)
    scenario.start("worker")
    # Then the abandoned run is recovered once and completed once, from what was recorded:
    # no step ran again, and the acceptance check saw every step confirmed
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    types = [e["type"] for e in await scenario.events(run_id)]
    assert types.count("run.completed") == 1 and types[-2:] == ["run.completed", "run.summary"]
    assert types.count("action.recorded") == 3 and "action.submitted" not in types
    assert done.snapshot.budget.used.tool_calls == 3
    assert done.snapshot.acceptance is not None and done.snapshot.acceptance.unmet == ()
    assert await scenario.recoveries(run_id) == 1
    await scenario.finish()


async def test_a_relay_killed_between_publishing_and_marking_publishes_again_and_the_inbox_absorbs_it(
        scenario: Scenario, local_broker: None) -> None:
    # Given a steps run, and a relay armed to die after its first publish was confirmed by the
    # broker but before the outbox row was marked sent (the state and the outbox row are committed)
    await scenario.up("scheduler", "reconciler", "worker", forge=False)
    doomed = scenario.start("relay", LONGRUN_CRASH_POINTS="relay.after_publish_before_mark")
    run_id = await scenario.create(workflow="steps", input_={"steps": 2})
    await scenario.crashed(doomed, "relay.after_publish_before_mark")
    # When a fresh relay takes over the outbox
    scenario.start("relay")
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    await scenario.poll(lambda: _all_published(scenario), timeout=20, what="the outbox drained by the new relay")
    # Then the wakeup went out twice, and the second copy changed nothing: the worker's inbox
    # recognised it, so the run was taken once (one fencing token) and every step ran once
    admission = await scenario.scalar(
        "SELECT event_id FROM outbox WHERE aggregate_id = :r AND type = 'run.wakeup' ORDER BY id LIMIT 1", r=run_id)
    worker = scenario.running("worker")[0]
    await scenario.poll(lambda: _consumed(scenario, done.partition), timeout=20, what="the copy consumed")
    assert (await scenario.stored(run_id)).fencing_token == done.fencing_token == 1, "the copy took the run again"
    assert _said_now(worker, f"duplicate {admission} dropped")
    assert await scenario.scalar("SELECT count(*) FROM inbox_worker WHERE message_id = :m", m=admission) == 1
    types = [e["type"] for e in await scenario.events(run_id)]
    assert types.count("action.recorded") == 2 and types.count("run.completed") == 1
    await scenario.finish()


async def _all_published(scenario: Scenario) -> bool:
    return await scenario.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0


async def _consumed(scenario: Scenario, partition: int) -> bool:
    """Nothing ready or unacked on the run's work queue."""
    listing = await asyncio.to_thread(ctl, "list_queues", "-q", "-p", scenario.infra.vhost, "name", "messages")
    return f"longrun.worker.p{partition}\t0" in listing.stdout


def _said_now(proc, text: str) -> bool:  # type: ignore[no-untyped-def]
    return text in proc.output()
