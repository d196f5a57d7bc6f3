"""The ``steps`` run kind under the testing kit: no PostgreSQL, no RabbitMQ, milliseconds."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.domain import ActionStatus, RunStatus
from longrun.testing.kit import Kit, every_crash
from longrun.workflows import STEPS_VERSIONS, steps

KIND = RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO})


def three_steps(kit: Kit) -> None:
    kit.start({"steps": 3})
    kit.settle()


def test_a_run_of_three_steps_completes_each_delivered_twice() -> None:
    with Kit(KIND, duplicate_deliveries=True) as kit:
        three_steps(kit)
        (run_id,) = kit.run_ids()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED
        assert [(a.logical_action, a.status) for a in run.actions] == [
            (f"step:{i}", ActionStatus.CONFIRMED) for i in range(3)]
        assert kit.executions(steps.ECHO.name) == 3
        assert kit.check() == []


def test_a_worker_killed_at_every_ledger_point_completes_every_step_once_on_record() -> None:
    outcomes = every_crash(KIND, three_steps)
    assert len(outcomes) >= 3 * 3  # each step: before the request, after the answer, after the commit
    for o in outcomes:
        (run_id,) = o.kit.run_ids()
        run = o.kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED, (o.point, o.nth)
        assert run.budget.used.tool_calls == 3, (o.point, o.nth)  # a pure call re-run is charged once
        assert o.kit.executions(steps.ECHO.name) <= 4, (o.point, o.nth)  # at most the one lost answer again
        assert o.kit.check() == [], (o.point, o.nth)


def test_the_budget_stops_a_run_that_runs_out_of_tool_calls() -> None:
    with Kit(KIND) as kit:
        run_id = kit.start({"steps": 3}, tool_calls=2)
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.BUDGET_EXHAUSTED and run.budget.used.tool_calls == 2
        assert kit.check() == []
