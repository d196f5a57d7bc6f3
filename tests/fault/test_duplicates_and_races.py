"""Rows: the same message more than once, two workers on one run, and wakeups that come late and out of order."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from longrun.bus import topology
from longrun.db import outbox
from longrun.domain import RunStatus
from longrun.envelope import make
from longrun_dependency_upgrade import workflow as dependency_upgrade
from tests.fault.scenario import EVERYTHING, Scenario
from tests.model_servers import model_env
from tests.infra import close_connections_named
from tests.ports import free_port

pytestmark = [pytest.mark.fault, pytest.mark.integration]


async def test_the_same_webhook_delivered_three_times_moves_the_run_once(scenario: Scenario) -> None:
    # Given the dependency upgrade, and a forge that delivers every CI result three times
    await scenario.up(*EVERYTHING, deliver_times=3)
    run_id = await scenario.create()
    # When the run goes through both CI rounds to its end
    done = await scenario.to_the_end(run_id)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    gateway = scenario.running("gateway")[0].output()
    messages = [json.loads(line).get("message", "") for line in gateway.splitlines() if line.startswith("{")]
    assert sum(m.endswith('"POST /webhooks/forge HTTP/1.1" 202') for m in messages) == 6
    # Then each CI result was taken once: one event row, one inbox row naming the run it woke,
    # one fact and one wake in the run's history, one wakeup on the bus
    webhooks = await scenario.rows(
        "SELECT e.event_id, e.correlation_key, e.matched_run_id, i.outcome FROM webhook_events e "
        "JOIN inbox_gateway i ON i.message_id = 'webhook:forge:' || e.event_id ORDER BY e.received_at")
    assert len(webhooks) == 2
    assert [w.matched_run_id for w in webhooks] == [run_id, run_id]
    assert [w.outcome.get("matched_run_id") for w in webhooks] == [run_id, run_id]
    events = await scenario.events(run_id)
    for hook in webhooks:
        woken = [e for e in events if e["type"] == "run.woken" and e["data"].get("correlation_key") == hook.correlation_key]
        assert [e["applied"] for e in woken] == [True], f"{hook.correlation_key} woke the run {len(woken)} times"
        facts = [e for e in events if e["type"] == "fact.recorded" and e["data"]["source"] == "webhook:forge"
                 and e["data"]["key"] == hook.outcome["correlation_key"].replace("ci/acme/payments/", "ci_result:")]
        assert len(facts) == 1
        assert await scenario.wakeups(run_id, f"webhook forge:{hook.event_id}") == 1
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    await scenario.finish()


async def test_two_workers_woken_for_one_run_at_once_only_the_lease_holder_writes(scenario: Scenario) -> None:
    async with scenario.database_setting("idle_in_transaction_session_timeout", FROZEN_TRANSACTION_LIMIT):
        await _two_workers_on_one_run(scenario)


FROZEN_TRANSACTION_LIMIT = "3s"
"""A process frozen inside a transaction (SIGSTOP, a VM pause) holds the run's row lock, and every
other writer of that run (the successor's lease take, the reconciler, webhooks, operators) waits
on it, whatever the lease says. Only the database can break such a lock: its
``idle_in_transaction_session_timeout``, which longrun sets on its connections from
``LONGRUN_IDLE_TRANSACTION_TIMEOUT`` (docs/configuration.md)."""


async def _two_workers_on_one_run(scenario: Scenario) -> None:
    # Given worker A in the middle of a step: it asked the model for the plan, whose answer takes 2 s
    llm = _fake_model(scenario, [("plan", 2.0), ("plan", 3.0), ("fix", 0.0)])
    await scenario.up("gateway", "scheduler", "relay", "timer", "reconciler")
    model = model_env(f"{llm}/v1")
    a = scenario.start("worker", **model)
    run_id = await scenario.create()
    await scenario.poll(lambda: _asked(llm, 1), timeout=30, what="A asking the model")
    first = await scenario.stored(run_id)
    assert first.lease_owner == a.name
    # When A stops dead (SIGSTOP: no heartbeat, no ack) and the broker drops it, a second worker B
    # starts, takes the run over and asks the model in turn, and then A wakes up again with its
    # answer in hand while B still waits for its own: two workers on one run at once
    a.pause()
    try:
        assert await asyncio.to_thread(close_connections_named, scenario.infra.vhost, f"worker/{a.name}") >= 1
        b = scenario.start("worker", **model)
        await scenario.poll(lambda: _asked(llm, 2), timeout=30, what="B taking the run over and asking the model")
        taken = await scenario.stored(run_id)
        assert taken.lease_owner == b.name and taken.fencing_token > first.fencing_token
        assert taken.snapshot.revision == first.snapshot.revision, "B wrote before A came back"
    finally:
        a.resume()
    await scenario.poll(lambda: _said(a, f"lease {first.fencing_token} lost"), timeout=30,
                        what="A told it lost the run")
    done = await scenario.to_the_end(run_id)
    # Then A's answer was refused though nothing else had changed the run since A read it:
    # the plan is B's, written under B's fencing token, and every later event too
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    events = await scenario.events(run_id)
    plans = [e for e in events if e["type"] == "fact.recorded" and e["data"]["key"].startswith("proposal:plan:")]
    assert [(p["data"]["key"], p["token"]) for p in plans] == [("proposal:plan:1", taken.fencing_token)]
    tokens = [e["token"] for e in events if e["token"] is not None]
    assert tokens == sorted(tokens), f"a stale lease wrote after a newer one: {tokens}"
    assert all(e["token"] >= taken.fencing_token for e in events[first.stored_seq:] if e["token"] is not None)
    assert done.snapshot.budget.used.model_calls == 2  # B's plan and fix; A's answer was never recorded
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    assert a.alive() and b.alive()
    await scenario.finish()


async def test_wakeups_delayed_and_delivered_out_of_order_change_nothing(scenario: Scenario) -> None:
    # Given a run waiting for approval, whose first CI wait ended long ago when its webhook came;
    # the timer service is armed to die once between firing a timer and marking it fired
    await scenario.up("gateway", "scheduler", "relay", "reconciler", "worker")
    timer = scenario.start("timer", LONGRUN_CRASH_POINTS="timer.after_fire_before_mark")
    run_id = await scenario.create()
    waiting = await scenario.until(run_id, RunStatus.WAITING_USER, timeout=40)
    events_before = await scenario.events(run_id)
    first_ci_wait = next(e["data"]["wait"]["wait_id"] for e in events_before if e["type"] == "run.wait_started")
    # (the webhook that ended it cancelled its deadline timer: closure)
    old_deadline = f"{run_id}:{first_ci_wait}:deadline"
    assert await scenario.scalar("SELECT cancelled_at IS NOT NULL AND fired_at IS NULL FROM timers "
                                 "WHERE timer_key = :k", k=old_deadline)
    # When that old wait's deadline wake arrives now all the same, after the newer wait started (the
    # timer reopened and made due, as one another timer replica had claimed when the wait ended is
    # left), and the timer service dies at the crash point on the way and is restarted
    await scenario.execute("UPDATE timers SET wake_at = now(), cancelled_at = NULL WHERE timer_key = :k",
                           k=old_deadline)
    await scenario.crashed(timer, "timer.after_fire_before_mark")
    scenario.start("timer")
    await scenario.poll(lambda: _fired(scenario, old_deadline), timeout=20,
                        what="the old deadline fired")
    # and two stale wakeups reach the worker: the admission wakeup once more (a redelivery), and a
    # copy of it under a new id (a late duplicate from another producer), both for revision 1
    admitted = outbox.envelope_of("run.wakeup", await scenario.scalar(
        "SELECT payload FROM outbox WHERE aggregate_id = :r AND type = 'run.wakeup' ORDER BY id LIMIT 1", r=run_id))
    stale = make("run.wakeup", {"wakeup_id": str(uuid.uuid4()), "reason": "delayed copy"}, producer="fault-tests",
                 tenant_id="acme", run_id=run_id, expected_state_version=admitted["expected_state_version"])
    redelivered = stale.model_copy(update={"event_id": admitted["event_id"]})
    partition = topology.partition_key(waiting.partition)
    for message in (redelivered, stale):
        await scenario.publish(topology.work_exchange("worker"), partition, message)
    await scenario.poll(lambda: _handled(scenario, run_id, stale.event_id), timeout=20,
                        what="the stale wakeup handled and the lease given back")
    # Then the run still waits for the same approval: the old wake is stored as late, the stale
    # wakeups only took and gave back the lease, and nothing else happened
    after = await scenario.until(run_id, RunStatus.WAITING_USER)
    assert after.snapshot.wait == waiting.snapshot.wait
    assert after.snapshot.revision == waiting.snapshot.revision
    assert after.lease_owner is None
    new = (await scenario.events(run_id))[len(events_before):]
    assert [(e["type"], e["data"]["wait_id"], e["data"]["reason"], e["applied"]) for e in new] == [
        ("run.woken", first_ci_wait, "deadline", False)]
    outcome = await scenario.scalar("SELECT outcome FROM inbox_worker WHERE message_id = :m", m=stale.event_id)
    assert outcome["taken"] is True
    # and once the owner approves, the run completes as if nothing had happened
    done = await scenario.to_the_end(run_id)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    await scenario.finish()


def _fake_model(scenario: Scenario, replies: list[tuple[str, float]]) -> str:
    """An OpenAI-compatible model answering the upgrade's script in order, each after a delay; its URL."""
    port = free_port()
    script = scenario.tmp / "replies.json"
    script.write_text(json.dumps([
        {"message": {"role": "assistant", "content": json.dumps(dependency_upgrade.model_script()[stage][0])},
         "delay_seconds": delay} for stage, delay in replies]))
    scenario.services.start("llm", "longrun_dependency_upgrade.fake_llm", argv_extra=["--port", str(port), "--script", str(script)])
    return f"http://127.0.0.1:{port}"


async def _asked(llm: str, n: int) -> bool:
    try:
        async with httpx.AsyncClient(base_url=llm, timeout=2) as http:
            return len((await http.get("/_requests")).json()) >= n
    except httpx.HTTPError:
        return False


async def _said(proc, text: str) -> bool:  # type: ignore[no-untyped-def]
    return text in proc.output()


async def _fired(scenario: Scenario, timer_key: str) -> bool:
    return bool(await scenario.scalar("SELECT fired_at IS NOT NULL FROM timers WHERE timer_key = :k", k=timer_key))


async def _handled(scenario: Scenario, run_id: str, message_id: str) -> bool:
    handled = await scenario.scalar("SELECT count(*) FROM inbox_worker WHERE message_id = :m", m=message_id)
    return bool(handled) and (await scenario.stored(run_id)).lease_owner is None
