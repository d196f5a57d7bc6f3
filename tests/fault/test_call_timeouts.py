"""Rows: a tool call that overruns its limits, watched in the worker and by durable timers.

The run kind is ``tests.kinds:long_call``: one call, ``work``, that heartbeats its progress for a
few seconds (start-to-close 6 s, heartbeat timeout 2 s) and, as a write, creates a branch on the
forge, where effects are counted; it misbehaves once as its goal says. What a worker can watch
(its own call overrunning or going silent) it cancels; what it cannot (its own freeze, a call that
ignores cancellation) the call's ``start_to_close`` and ``heartbeat`` timers recover.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.integration.ensemble import OPERATOR_TOKEN

pytestmark = [pytest.mark.fault, pytest.mark.integration]

KINDS = {"LONGRUN_RUN_KINDS": "tests.kinds:long_call"}
MEMBERSHIP = {"LONGRUN_PARTITION_LEASE_TTL": "8"}
AROUND = ("scheduler", "relay", "timer", "reconciler")


def _goal(effect: str, *, beats: int = 4, stall: str = "", stall_file: Path | None = None,
          stall_seconds: float = 30.0) -> dict[str, Any]:
    return {"repo": "acme/payments", "branch": f"long-{uuid.uuid4().hex[:8]}", "effect": effect, "beats": beats,
            "every": 0.5, "stall": stall, "stall_file": str(stall_file or ""), "stall_seconds": stall_seconds}


def _armed(tmp: Path) -> Path:
    flag = tmp / f"stall-{uuid.uuid4().hex[:6]}"
    flag.touch()
    return flag


async def _shown(scenario: Scenario, run_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=scenario.ensemble.gateway_url, timeout=10) as gateway:
        response = await gateway.get(f"/runs/{run_id}", headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


async def _call_timers(scenario: Scenario, run_id: str) -> list[Any]:
    return await scenario.rows("SELECT kind, payload, fired_at, cancelled_at FROM timers WHERE run_id = :r "
                               "AND kind IN ('start_to_close', 'heartbeat') ORDER BY created_at", r=run_id)


async def test_a_long_call_shows_its_progress_and_its_answer_cancels_its_timers(scenario: Scenario) -> None:
    # Given a worker and a write that heartbeats its progress for four seconds
    await scenario.up("gateway", *AROUND, "worker", **KINDS)
    run_id = await scenario.create(workflow="long_call", input_={**_goal("write", beats=8), "rest": 8})

    # When the call is under way, its progress is on its ledger row, shown with the run's actions
    async def progress() -> Any:
        actions = (await _shown(scenario, run_id))["actions"]
        return actions and actions[0]["progress"] and actions[0]["progress"]["done"] >= 2 and actions[0]

    shown = await scenario.poll(progress, timeout=20, what="the call's progress shown")
    assert shown["logical_action"] == "work" and shown["status"] == "SUBMITTED"
    assert shown["progress"]["of"] == 8 and shown["heartbeat_at"]
    # and once it answered (the run then rests on a timer, still open), its last progress is kept,
    # never counted as the outcome
    await scenario.until(run_id, RunStatus.RETRY_SCHEDULED, timeout=30)
    row = (await scenario.ledger(run_id))["work"]
    assert row.status == "CONFIRMED" and row.progress == {"done": 8, "of": 8}
    # Then its timers, scheduled with its submission, were cancelled by its answer; none fires later
    timers = await _call_timers(scenario, run_id)
    assert {t.kind for t in timers} == {"start_to_close", "heartbeat"}
    assert all(t.cancelled_at is not None and t.fired_at is None for t in timers)
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    assert done.snapshot.action("work").attempts == 1  # type: ignore[union-attr]
    assert all(t.fired_at is None for t in await _call_timers(scenario, run_id))
    assert (await scenario.forge_counts())["branch"] == 1
    await scenario.finish()


async def test_a_frozen_worker_s_call_is_given_up_by_its_heartbeat_timer_and_its_late_write_refused(
        scenario: Scenario) -> None:
    # Given a worker whose run lease lasts two minutes, making a long write; every replica's membership
    # outlives the call's 2 s heartbeat timeout, so the heartbeat timer, not the takeover of a lapsed
    # member, is what gives the frozen worker's call up
    await scenario.up(*AROUND, **KINDS, **MEMBERSHIP)
    frozen = scenario.start("worker", LONGRUN_RUN_LEASE_TTL="120", **KINDS, **MEMBERSHIP)
    run_id = await scenario.create(workflow="long_call", input_=_goal("write", beats=8))
    await scenario.poll(lambda: scenario.scalar("SELECT progress FROM actions WHERE run_id = :r", r=run_id),
                        timeout=20, what="a recorded heartbeat")
    token = (await scenario.stored(run_id)).fencing_token
    # When it is frozen mid-call (SIGSTOP), and another worker is there
    frozen.pause()
    try:
        scenario.start("worker", LONGRUN_RUN_LEASE_TTL="120", **KINDS, **MEMBERSHIP)
        # Then, long before its lease would expire, the heartbeat timer gives the attempt up: the write
        # is UNKNOWN, the reconciler finds nothing made under its key, and the other worker completes it
        done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=40)
    finally:
        frozen.resume()
    trail = await scenario.trail(run_id, "work")
    assert trail[:6] == ["action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started",
                         "action.reconciled", "action.submitted"], trail
    unknown = next(e for e in await scenario.events(run_id) if e["type"] == "action.unknown")
    assert unknown["data"]["cause"].startswith("heartbeat: no heartbeat within 2s")
    assert done.snapshot.budget.used.tool_calls == 2  # the retry was charged
    # with one effect per key, made under the newer lease
    assert (await scenario.forge_counts())["branch"] == 1
    assert (await scenario.ledger(run_id))["work"].attempts == 2
    # and when the frozen worker wakes, its write is refused: nothing more is recorded under its lease
    events = await scenario.events(run_id)
    await scenario.poll(lambda: _said(frozen, f"lease {token} lost"), timeout=20, what="the stale worker fenced out")
    assert await scenario.events(run_id) == events
    assert (await scenario.forge_counts())["branch"] == 1
    await scenario.finish()


async def _said(proc: Any, text: str) -> bool:
    return text in proc.output()


async def test_a_call_that_ignores_cancellation_is_given_up_by_its_start_to_close_timer(
        scenario: Scenario) -> None:
    # Given a live worker whose write acts, then refuses to be cancelled for 12 s, heartbeating
    await scenario.up(*AROUND, "worker", **KINDS)
    worker = scenario.running("worker")[0]
    goal = _goal("write", beats=2, stall="ignore_cancel", stall_file=_armed(scenario.tmp), stall_seconds=12)
    run_id = await scenario.create(workflow="long_call", input_=goal)
    # When its start-to-close passes: the worker cancels the call, which goes on regardless
    # Then the durable timer gives the attempt up, the write is UNKNOWN, the reconciler finds the branch
    # made under its key, and the run completes while the call still hangs
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    trail = await scenario.trail(run_id, "work")
    assert trail == ["action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started",
                     "action.reconciled"], trail
    events = await scenario.events(run_id)
    unknown = next(e for e in events if e["type"] == "action.unknown")
    assert unknown["data"]["cause"].startswith("start_to_close: no answer within 6s")
    assert unknown["token"] is None  # written by the timer service, not a worker
    reconciled = next(e for e in events if e["type"] == "action.reconciled")
    assert reconciled["data"]["outcome"] == "CONFIRMED"
    assert done.snapshot.budget.used.tool_calls == 1
    # with exactly one effect, and the hung call's answer, when it comes, refused
    assert (await scenario.forge_counts())["branch"] == 1
    await scenario.poll(lambda: _said(worker, "lost; another worker owns it now"), timeout=20,
                        what="the hung call's answer refused")
    assert await scenario.events(run_id) == events
    await scenario.finish()


@pytest.mark.parametrize(("effect", "stall", "cause"), [
    ("read", "silent", "heartbeat: no heartbeat within 2s"),
    ("read", "overrun", "start_to_close: no answer within 6s"),
    ("write", "overrun", "start_to_close: no answer within 6s"),
], ids=["read-silent", "read-overrun", "write-overrun"])
async def test_a_live_worker_cancels_a_call_past_its_limits_by_effect_kind(
        scenario: Scenario, effect: str, stall: str, cause: str) -> None:
    # Given a worker whose call, once, goes silent or heartbeats past its start-to-close
    await scenario.up(*AROUND, "worker", **KINDS)
    run_id = await scenario.create(workflow="long_call",
                                   input_=_goal(effect, beats=2, stall=stall, stall_file=_armed(scenario.tmp)))
    # When the worker's watch cancels it, the run completes on a second attempt
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=40)
    trail = await scenario.trail(run_id, "work")
    events = await scenario.events(run_id)
    if effect == "read":
        # Then a read is asked again under its retry policy, the retry charged
        assert trail == ["action.prepared", "action.submitted", "action.unavailable", "action.submitted",
                         "action.confirmed"], trail
        given_up = next(e for e in events if e["type"] == "action.unavailable")
    else:
        # Then a write's outcome is UNKNOWN until the reconciler finds nothing under its key
        assert trail == ["action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started",
                         "action.reconciled", "action.submitted", "action.confirmed"], trail
        given_up = next(e for e in events if e["type"] == "action.unknown")
        assert (await scenario.forge_counts())["branch"] == 1
    assert given_up["data"]["cause"] == cause and given_up["token"] is not None  # the worker's own record
    assert done.snapshot.budget.used.tool_calls == 2
    # and no durable timer had to act: every call timer was cancelled by an outcome
    assert all(t.fired_at is None for t in await _call_timers(scenario, run_id))
    await scenario.finish()
