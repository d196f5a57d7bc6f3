"""A rate-limited tool under the testing kit: calls past the limit wait for their place in line,
uncharged, each woken once by its own timer, and every run completes."""

from __future__ import annotations

import dataclasses

from longrun.authoring import RunKind
from longrun.domain import RunStatus
from longrun.domain.rate_limit import RATE_LIMIT_PREFIX, RATE_LIMIT_WAIT, RateLimit
from longrun.testing.kit import Kit
from longrun.workflows import STEPS_VERSIONS, steps

ECHO = dataclasses.replace(steps.ECHO, rate_limits=(RateLimit("echo", amount=2, period=1.0, burst=1),))
KIND = RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {ECHO.name: ECHO})


def test_calls_past_the_limit_wait_uncharged_for_their_place_and_each_is_woken_once() -> None:
    with Kit(KIND) as kit:
        run_ids = [kit.start({"steps": 1}) for _ in range(4)]
        kit.settle(timers=False)
        # The bucket's one call went; the three others wait, one refill (half a second) apart, showing the limit
        waiting = [kit.snapshot(r) for r in run_ids if kit.status(r) is not RunStatus.COMPLETED]
        assert len(waiting) == 3
        assert {(r.wait.kind, r.wait.correlation_key) for r in waiting if r.wait} == {
            (RATE_LIMIT_WAIT, RATE_LIMIT_PREFIX + "echo")}
        now = kit.world.clock()
        assert sorted(round(r.wait.wake_at - now, 3) for r in waiting if r.wait) == [0.5, 1.0, 1.5]
        assert all(r.budget.used.tool_calls == 0 for r in waiting)  # waiting costs the run nothing
        kit.settle()
        for run_id in run_ids:
            run = kit.snapshot(run_id)
            assert run.status is RunStatus.COMPLETED and run.budget.used.tool_calls == 1
            wakes = [e for e in kit.world.store.history(run_id) if e.type == "run.woken"]
            assert len(wakes) <= 1  # one extra wake per limited call, and none for the one that went
        assert kit.executions(ECHO.name) == 4
        assert kit.check() == []
