"""A schedule under a timer service SIGKILLed mid-firing: the timer dies at its crash point after
creating a due time's run and before committing (``timer.schedule_fired_before_commit``), is started
again, is SIGKILLed once more at an arbitrary moment and started again. Every due time is recorded once,
none left out; a time never has two runs; and the checker finds every run explained. Twice: overlap
"skip" with runs longer than the period (the runs never overlap), and overlap "allow" with short runs,
where no overlap key refuses a second run, so only the time's idempotency key and the run created in the
transaction that moves the schedule on keep a time to one run (every time makes its run)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.integration.ensemble import OPERATOR_TOKEN

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(180)]

KINDS = {"LONGRUN_RUN_KINDS": "tests.integration.keyed_kinds:kinds"}
POINT = "timer.schedule_fired_before_commit"
EVERY_TENANT = {"authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.mark.parametrize(("overlap", "hold"), [("skip", 1.6), ("allow", 0.2)], ids=["skip", "allow"])
async def test_a_timer_killed_mid_firing_never_makes_two_runs_for_one_due_time(
        scenario: Scenario, overlap: str, hold: float) -> None:
    # Given the services, a timer service that dies on its third schedule firing before committing it,
    # and a schedule every second: runs of 1.6 s with overlap skip, or of 0.2 s with overlap allow
    await scenario.up("gateway", "scheduler", "relay", "worker", forge=False, **KINDS)
    timer = scenario.start("timer", LONGRUN_CRASH_POINTS=f"{POINT}:3", **KINDS)
    async with httpx.AsyncClient(base_url=scenario.ensemble.gateway_url, timeout=10) as http:
        made = await http.post("/schedules", headers=EVERY_TENANT, json={
            "tenant_id": "acme", "run": {"workflow": "keyed_queue", "input": {"hold": hold}}, "every": 1.0,
            "overlap": overlap, "reason": "fault row"})
        assert made.status_code == 200, made.text
        schedule_id = made.json()["schedule_id"]
        # When it dies there and is started again, then is SIGKILLed once more a few seconds later
        await scenario.crashed(timer, POINT)
        scenario.start("timer", **KINDS)
        await asyncio.sleep(3.5)
        [again] = scenario.running("timer")
        again.kill()
        scenario.start("timer", **KINDS)
        await scenario.poll(lambda: _recorded(scenario, schedule_id, 10), timeout=60, what="ten due times recorded")
        assert (await http.post(f"/schedules/{schedule_id}/pause", headers=EVERY_TENANT,
                                json={"reason": "done"})).status_code == 200
    # Then each due time is recorded once, a second apart, none left out
    fires = await scenario.rows("SELECT due_at, outcome, run_id FROM schedule_fires WHERE schedule_id = :s "
                                "ORDER BY due_at", s=schedule_id)
    due = [f.due_at for f in fires]
    assert [b - a for a, b in zip(due, due[1:])] == [timedelta(seconds=1)] * (len(due) - 1)
    assert {f.outcome for f in fires} <= ({"created", "skipped"} if overlap == "skip" else {"created"})
    # and a time never has two runs: the runs are exactly those recorded, one per idempotency key
    runs = await scenario.rows("SELECT run_id FROM runs WHERE idempotency_key LIKE :k",
                               k=f"schedule:{schedule_id}:%")
    assert sorted(r.run_id for r in runs) == sorted(f.run_id for f in fires if f.outcome == "created")
    for run in runs:
        await scenario.until(run.run_id, RunStatus.COMPLETED, timeout=30)
    if overlap == "skip":
        # and with overlap skip they never overlapped: each started after the one before had ended
        runs = await scenario.rows(
            "SELECT r.run_id, (SELECT min(recorded_at) FROM run_events e WHERE e.run_id = r.run_id "
            "AND e.type = 'run.status_changed' AND e.data->>'to' = 'RUNNING') AS started, (SELECT max(recorded_at) "
            "FROM run_events e WHERE e.run_id = r.run_id AND e.type = 'run.completed') AS ended FROM runs r "
            "WHERE r.idempotency_key LIKE :k ORDER BY r.idempotency_key", k=f"schedule:{schedule_id}:%")
        assert all(later.started >= earlier.ended for earlier, later in zip(runs, runs[1:])), runs
    await scenario.finish()

async def _recorded(scenario: Scenario, schedule_id: str, n: int) -> Any:
    return await scenario.scalar("SELECT count(*) FROM schedule_fires WHERE schedule_id = :s",
                                 s=schedule_id) >= n
