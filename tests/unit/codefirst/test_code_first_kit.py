"""A code-first run kind under the testing kit: every await kind through the real engine in memory, a
worker killed at every ledger point, a replay that leaves its history stopping the run in
NEEDS_ATTENTION, patch points, and the replay harness."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from longrun.author import (
    Context,
    Kit,
    RunSnapshot,
    RunStatus,
    ToolFailed,
    ToolResult,
    every_crash,
    replay,
    workflow,
)
from longrun.codefirst import awaits
from longrun.codefirst.kind import CodeFirst
from longrun.domain import ActionStatus
from longrun.domain import events as ev
from longrun.model import ScriptedModel
from tests.integration.code_first_kinds import (
    ECHO,
    touring,
    MODEL_SCRIPT,
    PUBLISH,
    TourInput,
    TourOutput,
    steps_kind,
    tour,
    tour_kind,
)

NAME = "web"


def people(kit: Kit, run: RunSnapshot) -> bool:
    """CI reports, alice answers and approves, the operator sends the signal the run waits for."""
    if run.kind != "tour":
        return False
    wait = run.wait
    if run.status is RunStatus.WAITING_EVENT and wait is not None and wait.kind == "ci":
        kit.event(wait.correlation_key or "", f"ci_result:{NAME}", {"status": "passed"})
        return True
    if run.status is RunStatus.WAITING_EVENT and wait is not None and wait.kind == "signal":
        kit.signal(run.run_id, "go", {"by": "ana"})
        return True
    if run.status is RunStatus.WAITING_USER and kit.question(run.run_id) is not None:
        kit.answer(run.run_id, {"module": "billing"})
        return True
    if run.status is RunStatus.WAITING_USER:
        kit.decide(run.run_id)
        return True
    return False


def options() -> dict[str, Any]:
    publish = {PUBLISH.name: lambda args, key: ToolResult(f"pub-{key[:8]}", {"id": f"pub-{key[:8]}"})}
    return {"model": ScriptedModel(MODEL_SCRIPT), "children": [steps_kind()], "answers": publish}


def scenario(kit: Kit) -> None:
    kit.start({"name": NAME})
    kit.settle(people=people)


def the_tour(kit: Kit) -> RunSnapshot:
    (run_id,) = [r for r in kit.run_ids() if kit.snapshot(r).kind == "tour"]
    return kit.snapshot(run_id)


def test_every_await_is_journaled_and_the_output_completes_the_run() -> None:
    with Kit(tour_kind(), duplicate_deliveries=True, **options()) as kit:
        scenario(kit)
        run = the_tour(kit)
        assert run.status is RunStatus.COMPLETED, run.terminal_reason
        assert [a.logical_action for a in run.actions] == ["greet", "3.0:tour.echo", "3.1:tour.echo", "publish"]
        assert all(a.status is ActionStatus.CONFIRMED for a in run.actions)
        output = TourOutput.model_validate(dict(run.acceptance.evidence))  # type: ignore[union-attr]
        assert (output.greeting, output.plan, output.ci, output.parallel, output.module, output.signal) == (
            "hello web", "publish", "passed", ["a", "b"], "billing", {"by": "ana"})
        assert output.started_at == run.created_at and len(output.children) == 1
        assert kit.executions(PUBLISH.name) == 1 and kit.check() == []
        marks = [p.split(":")[1:3] for p in run.patches]
        assert marks == [["0", "call"], ["1", "model"], ["2", "event"], ["4", "question"], ["5", "signal"],
                         ["6", "timer"], ["7", "children_started"], ["8", "children"], ["9", "approval"],
                         ["10", "call"]]


def test_a_worker_killed_at_every_ledger_point_still_publishes_once() -> None:
    outcomes = every_crash(tour_kind(), scenario, **options())
    assert {o.point for o in outcomes} >= {"worker.before_tool_request", "worker.after_commit"}
    for o in outcomes:
        run = the_tour(o.kit)
        assert run.status is RunStatus.COMPLETED, (o.point, o.nth, run.terminal_reason)
        assert o.kit.executions(PUBLISH.name) == 1, (o.point, o.nth)
        assert o.kit.check() == [], (o.point, o.nth)


class Stamp(BaseModel):
    now: float


def test_time_ids_and_randomness_are_the_same_on_every_replay() -> None:
    seen: list[tuple[float, str, float]] = []

    @workflow("tour", input=TourInput, output=Stamp)
    async def stamped(value: TourInput, ctx: Context) -> Stamp:
        await ctx.call_tool(ECHO.name, {"text": "first"})
        await ctx.sleep(5)
        seen.append((ctx.now(), ctx.uuid(), ctx.random()))
        await ctx.call_tool(ECHO.name, {"text": "second"})
        return Stamp(now=ctx.now())

    with Kit(tour_kind(stamped), **options()) as kit:
        run_id = kit.start({"name": NAME})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED, run.terminal_reason
    assert len(seen) >= 2 and len(set(seen)) == 1
    assert seen[0][0] >= run.created_at + 5  # the clock moved to when the timer fired
    assert run.acceptance is not None and run.acceptance.evidence["now"] >= seen[0][0]


def _changed_greeting(workflow_: CodeFirst[Any, Any]) -> None:
    """New code deployed under the same version: the first call's arguments change."""
    async def greets_otherwise(value: TourInput, ctx: Context) -> TourOutput:
        return await touring(value, ctx, salutation="good day")

    workflow_.fn = greets_otherwise


def a_run_whose_code_changed_in_flight() -> tuple[RunSnapshot, int]:
    """The run, and how many echo calls the far side made."""
    kind = tour_kind(CodeFirst("tour", tour.fn, input=TourInput, output=TourOutput))
    with Kit(kind, **options()) as kit:
        run_id = kit.start({"name": NAME})
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.WAITING_EVENT  # greeted, planned, waiting for CI
        _changed_greeting(kind.workflow)  # type: ignore[arg-type]
        kit.settle(people=people)
        return kit.snapshot(run_id), kit.executions(ECHO.name)


def test_new_code_that_leaves_the_recorded_path_stops_the_run_for_a_person() -> None:
    run, echoes = a_run_whose_code_changed_in_flight()
    assert run.status is RunStatus.NEEDS_ATTENTION and echoes == 1  # nothing more was called
    assert run.failure is not None and run.failure.attempt == 1  # not retried
    assert run.failure.error_type == "longrun.codefirst.journal.ReplayDiverged"
    assert run.failure.message.startswith("replay diverged at await #0: the code asks for a call of 'tour.echo'")
    assert "'good day web'" in run.failure.message and "logical action 'greet'" in run.failure.message


MUTANTS = {
    # A recorded call is no longer compared with the call the code asks for at that await.
    "tool-call-check": (awaits.ToolCall, "check", lambda self, journal, index, record, logical_action: None),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mutant_of_the_replay_check_lets_the_diverged_run_go_on(monkeypatch: pytest.MonkeyPatch,
                                                                   mutant: str) -> None:
    """Without the check, the run whose code changed is not stopped: it completes on a history its code
    does not match (the symptom the test above rules out)."""
    monkeypatch.setattr(*MUTANTS[mutant])
    run, _ = a_run_whose_code_changed_in_flight()
    assert run.status is RunStatus.COMPLETED, f"mutant {mutant} survived: {run.status}"


PATCH = "greet-twice"


def _patched_tour() -> CodeFirst[Any, Any]:
    async def patched(value: TourInput, ctx: Context) -> TourOutput:
        if ctx.patched(PATCH):
            await ctx.call_tool(ECHO.name, {"text": "and again"}, name="again")
        return await tour.fn(value, ctx)
    return CodeFirst("tour", patched, input=TourInput, output=TourOutput)


def test_a_patch_point_is_skipped_by_a_run_recorded_before_it_and_taken_by_a_new_one() -> None:
    kind = tour_kind(CodeFirst("tour", tour.fn, input=TourInput, output=TourOutput))
    with Kit(kind, **options()) as kit:
        old = kit.start({"name": NAME})
        kit.settle(timers=False)
        assert kit.status(old) is RunStatus.WAITING_EVENT
        kind.workflow.fn = _patched_tour().fn  # type: ignore[attr-defined]
        kit.settle(people=people)
        old_run = kit.snapshot(old)
        assert old_run.status is RunStatus.COMPLETED, old_run.terminal_reason
        assert PATCH not in old_run.patches and old_run.action("again") is None
    with Kit(tour_kind(_patched_tour()), **options()) as kit:
        scenario(kit)
        new_run = the_tour(kit)
        assert new_run.status is RunStatus.COMPLETED, new_run.terminal_reason
        assert PATCH in new_run.patches and new_run.action("again") is not None


def test_the_replay_harness_reports_where_new_code_leaves_a_recorded_history() -> None:
    with Kit(tour_kind(), **options()) as kit:
        scenario(kit)
        history = kit.history(the_tour(kit).run_id)
    assert any(e["type"] == ev.RunCompleted.type for e in history)
    assert replay(tour_kind(), history).divergence is None
    assert replay(tour_kind(_patched_tour()), history).divergence is None  # the patch is not taken there
    changed = CodeFirst("tour", tour.fn, input=TourInput, output=TourOutput)
    _changed_greeting(changed)
    divergence = replay(tour_kind(changed), history).divergence
    assert divergence is not None and divergence.startswith("replay diverged at await #0")


def test_a_code_first_run_out_of_tool_calls_stops_before_the_call_it_cannot_pay_for() -> None:
    with Kit(tour_kind(), **options()) as kit:
        run_id = kit.start({"name": NAME}, tool_calls=1)
        kit.settle(people=people)
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.BUDGET_EXHAUSTED, run.terminal_reason
        assert [a.logical_action for a in run.actions] == ["greet"]  # the parallel calls were never made
        assert kit.executions(ECHO.name) == 1 and kit.check() == []


class Outcome(BaseModel):
    refused: str


@workflow("tour", input=TourInput, output=Outcome)
async def tries(value: TourInput, ctx: Context) -> Outcome:
    try:
        await ctx.call_tool(ECHO.name, {"text": "first"}, name="first", raises=True)
    except ToolFailed as e:
        return Outcome(refused=e.logical_action)
    return Outcome(refused="")


@workflow("tour", input=TourInput, output=Outcome)
async def parks(value: TourInput, ctx: Context) -> Outcome:
    await ctx.call_tool(ECHO.name, {"text": "first"}, name="first")
    return Outcome(refused="")


def test_a_refused_call_raises_where_the_code_asks_for_it_and_else_waits_for_a_person() -> None:
    for workflow_, status, refused in ((tries, RunStatus.COMPLETED, "first"), (parks, RunStatus.NEEDS_ATTENTION, None)):
        with Kit(tour_kind(workflow_), **options()) as kit:
            kit.far_side.arm("rejected")
            run_id = kit.start({"name": NAME})
            kit.settle()
            run = kit.snapshot(run_id)
            assert run.status is status, (workflow_, run.terminal_reason)
            assert run.action("first").status is ActionStatus.FAILED  # type: ignore[union-attr]
            assert (run.acceptance.evidence["refused"] if run.acceptance else None) == refused
