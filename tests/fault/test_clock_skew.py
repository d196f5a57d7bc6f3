"""Row: one service's clock is off by minutes (``LONGRUN_CLOCK_SKEW``, the harness's ``clock_skew``).

Leases and timers compare in database time (``now()`` in PostgreSQL), so a service whose
wall clock is wrong must still take, keep and lose leases on time, and see timers fire on time.
"""

from __future__ import annotations

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import LEASE_TTL, Scenario

pytestmark = [pytest.mark.fault, pytest.mark.integration]

SKEW = 300.0
"""Five minutes fast."""


async def test_a_worker_whose_clock_is_five_minutes_fast_keeps_and_loses_leases_in_database_time(
        scenario: Scenario) -> None:
    # Given the worker service's clock five minutes fast, and its first replica armed to die
    # right before its 2nd tool request
    await scenario.up("gateway", "scheduler", "relay", "timer", "reconciler")
    doomed = scenario.start("worker", clock_skew=SKEW, LONGRUN_CRASH_POINTS="worker.before_tool_request:2")
    run_id = await scenario.create()
    # When it holds the run, its lease runs for the TTL by the database's clock, not by its own
    held = await scenario.poll(lambda: _lease_left(scenario, run_id), timeout=30, what="the run leased")
    assert 0 < held <= LEASE_TTL + 0.5, f"the lease runs {held:.1f}s ahead of the database's now()"
    # and when it dies mid-step and a replacement (as fast) is started
    await scenario.crashed(doomed, "worker.before_tool_request")
    scenario.start("worker", clock_skew=SKEW)
    # Then the dead worker's lease expires (or its membership lapses) within seconds, the run is
    # taken over and completes
    done = await scenario.to_the_end(run_id, timeout=45)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert await scenario.recoveries(run_id) == 1
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    # though every event the worker wrote says it happened five minutes from now
    skews = await scenario.rows(
        "SELECT extract(epoch FROM occurred_at - recorded_at) AS ahead, data->>'type' AS type FROM run_events "
        "WHERE run_id = :r AND type = 'action.confirmed'", r=run_id)
    assert skews and all(SKEW - 30 < float(s.ahead) < SKEW + 30 for s in skews)
    await scenario.finish()


async def test_a_retry_scheduled_by_a_worker_whose_clock_is_fast_fires_after_its_delay(scenario: Scenario) -> None:
    # Given a worker 20 s fast, and a forge that refuses the first branch request (nothing created: the
    # default retry policy tries again in 1 s, less up to 20 % of jitter)
    await scenario.up("gateway", "scheduler", "relay", "timer", "reconciler",
                      forge_faults=({"endpoint": "branches", "mode": "fail_before_commit", "times": 1},))
    scenario.start("worker", clock_skew=20)
    run_id = await scenario.create()
    await scenario.until(run_id, RunStatus.RETRY_SCHEDULED, timeout=30)
    # Then its retry timer is due about 1 s after it was written, by the database's clock (not 21 s)
    due_in = await scenario.scalar(
        "SELECT extract(epoch FROM wake_at - created_at) FROM timers WHERE run_id = :r AND kind = 'retry_backoff'",
        r=run_id)
    assert due_in is not None and 0.5 <= float(due_in) <= 2.0, f"the retry timer is due {due_in}s after it was written"
    # and when it comes due, its timer wakes the run within seconds
    retried = await scenario.until(run_id, RunStatus.WAITING_EVENT, RunStatus.RUNNING, timeout=8)
    assert retried.snapshot.last_wake is not None and retried.snapshot.last_wake.reason.value == "timer"
    done = await scenario.to_the_end(run_id, timeout=45)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    await scenario.finish()


async def _lease_left(scenario: Scenario, run_id: str) -> float | None:
    left = await scenario.scalar(
        "SELECT extract(epoch FROM lease_until - now()) FROM runs WHERE run_id = :r AND lease_owner IS NOT NULL",
        r=run_id)
    return None if left is None else float(left)
