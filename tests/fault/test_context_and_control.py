"""Rows: a long run's context compacted before the model is asked; cancel during a tool call; a budget reached."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from longrun.db import runs
from longrun.domain import RunStatus, freeze
from longrun.domain import events as ev
from longrun_dependency_upgrade import workflow as dependency_upgrade
from tests.fault.scenario import EVERYTHING, Scenario
from tests.model_servers import model_env
from tests.ports import free_port

pytestmark = [pytest.mark.fault, pytest.mark.integration]

CONTEXT_ITEMS = 40
"""What the worker shows the model at most besides goal, permissions, pending actions and approvals."""
NOTES = 45


async def test_a_context_compacted_for_the_model_keeps_the_goal_and_the_run_continues_from_its_state(
        scenario: Scenario) -> None:
    # Given an OpenAI-compatible model (the fake one, answering the upgrade's script) and a run
    # that collected 45 notes from its owner before any step: more than the model may be shown
    port = free_port()
    script = scenario.tmp / "replies.json"
    script.write_text(json.dumps([
        {"message": {"role": "assistant", "content": json.dumps(entry)}}
        for entry in (dependency_upgrade.model_script()["plan"][0], dependency_upgrade.model_script()["fix"][0])]))
    scenario.services.start("llm", "longrun_dependency_upgrade.fake_llm", argv_extra=["--port", str(port), "--script", str(script)])
    await scenario.up("gateway", "scheduler", "relay", "timer", "reconciler")
    run_id = await scenario.create()
    await scenario.poll(lambda: _admitted(scenario, run_id), timeout=20, what="the run admitted")
    async with scenario.engine.begin() as conn:
        stored = await runs.load(conn, run_id, lock=True)
        assert stored is not None
        now = time.time()
        await runs.append(conn, stored, [
            ev.FactRecorded(seq=stored.seq(i + 1), at=now, key=f"note:{i:03d}", source="user:user_42",
                            value=freeze({"text": f"remark {i} from the owner"})) for i in range(NOTES)])
    goal = dict((await scenario.stored(run_id)).snapshot.goal)
    # When a worker backed by that model runs it to its end, asking the model twice (plan, fix)
    scenario.start("worker", **model_env(f"http://127.0.0.1:{port}/v1"))
    done = await scenario.to_the_end(run_id)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as llm:
        asked = [json.loads(r["messages"][1]["content"]) for r in (await llm.get("/_requests")).json()]
    # Then each time the model saw a compacted context: the goal whole, at most 40 droppable
    # items (the newest), and how many were left out
    assert [c["stage"] for c in asked] == ["plan", "fix"]
    for context in asked:
        shown_facts = [f["key"] for f in context["facts"]]
        settled = [a for a in context["actions"] if a["status"] in ("CONFIRMED", "FAILED", "COMPENSATED")]
        assert context["goal"] == goal
        assert len(shown_facts) + len(settled) == CONTEXT_ITEMS
        assert context["omitted"] > 0
        assert "note:000" not in shown_facts and f"note:{NOTES - 1:03d}" in shown_facts
    fix = asked[1]
    assert context["omitted"] == NOTES + 5 + 3 - CONTEXT_ITEMS  # notes, 5 facts of round 1, 3 receipts
    assert any(key.startswith("ci_result:") for key in (f["key"] for f in fix["facts"])), \
        "the CI failure the fix is about was compacted away"
    # and the run continued from its own state, which compaction never touched: every note is
    # still there, and nothing was done twice
    assert sum(1 for f in done.snapshot.facts if f.key.startswith("note:")) == NOTES
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    await scenario.finish()


async def test_a_run_cancelled_while_a_tool_call_runs_records_the_call_and_starts_nothing_new(
        scenario: Scenario) -> None:
    # Given the dependency upgrade whose first commit is in flight: the forge made it and holds the answer 3 s
    await scenario.up(*EVERYTHING, forge_faults=({"endpoint": "commits", "mode": "timeout_after_commit",
                                                   "times": 1, "hold_seconds": 3},), LONGRUN_FORGE_TIMEOUT="10")
    run_id = await scenario.create()
    await scenario.poll(lambda: _in_flight(scenario, run_id, "commit:1"), timeout=30, what="commit:1 in flight")
    # When the operator cancels the run through the API meanwhile
    response = await scenario.operate(run_id, "cancel", "the upgrade is no longer wanted")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLING", response.text
    # Then the run ends CANCELLED once every action is settled: the answer that came back was
    # recorded (the commit exists, so the ledger says so), and no new action started after the request
    done = await scenario.until(run_id, RunStatus.CANCELLED, timeout=30)
    assert done.snapshot.terminal_reason == "cancel requested; every action settled"
    assert done.snapshot.cancel_requested
    assert await scenario.trail(run_id, "commit:1") == ["action.prepared", "action.submitted", "action.confirmed"]
    types = [e["type"] for e in await scenario.events(run_id)]
    after_cancel = types[types.index("run.cancel_requested"):]
    assert "action.prepared" not in after_cancel and "action.submitted" not in after_cancel
    assert await scenario.forge_counts() == {"branch": 1, "commit": 1}
    audit = await scenario.rows("SELECT actor, action, reason FROM audit_log WHERE target = :r", r=run_id)
    assert [(a.actor, a.action, a.reason) for a in audit] == [("ops", "cancel", "the upgrade is no longer wanted")]
    await scenario.finish()


async def test_a_run_that_reaches_its_budget_stops_before_the_next_step(scenario: Scenario) -> None:
    # Given a steps run of 6 tool steps with a budget of 3 tool calls
    await scenario.up("scheduler", "relay", "reconciler", "worker", forge=False)
    run_id = await scenario.create(workflow="steps", input_={"steps": 6},
                                   budget={"model_calls": 1, "tool_calls": 3, "cost_usd": 1.0})
    # When it runs
    done = await scenario.until(run_id, RunStatus.BUDGET_EXHAUSTED, timeout=30)
    # Then it ends BUDGET_EXHAUSTED, naming the budget, after exactly 3 steps, each settled,
    # and no 4th step was even prepared
    assert done.snapshot.terminal_reason == "budget tool_calls exhausted"
    assert done.snapshot.budget.used.tool_calls == 3
    assert [(a.logical_action, a.status.value) for a in done.snapshot.actions] == [
        ("step:0", "CONFIRMED"), ("step:1", "CONFIRMED"), ("step:2", "CONFIRMED")]
    assert len(await scenario.ledger(run_id)) == 3
    await scenario.finish()


async def test_a_run_whose_last_step_uses_the_last_of_its_budget_completes(scenario: Scenario) -> None:
    # Given a steps run of 3 tool steps with a budget of exactly 3 tool calls (and no model calls: it needs none)
    await scenario.up("scheduler", "relay", "reconciler", "worker", forge=False)
    run_id = await scenario.create(workflow="steps", input_={"steps": 3},
                                   budget={"model_calls": 0, "tool_calls": 3, "cost_usd": 1.0})
    # When it runs
    done = await scenario.until(run_id, *(RunStatus.COMPLETED, RunStatus.BUDGET_EXHAUSTED), timeout=30)
    # Then it completes: finishing needs no budget, only new work does
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert done.snapshot.budget.used.tool_calls == 3
    await scenario.finish()


async def _admitted(scenario: Scenario, run_id: str) -> bool:
    return bool(await scenario.scalar("SELECT admitted_at IS NOT NULL FROM runs WHERE run_id = :r", r=run_id))


async def _in_flight(scenario: Scenario, run_id: str, action: str) -> bool:
    row = (await scenario.ledger(run_id)).get(action)
    return row is not None and row.status == "SUBMITTED"
