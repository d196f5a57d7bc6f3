"""Patch points through the real worker in memory (the kit): ``run.patch_taken`` is written once, in
the write of the first decision that takes the patch and ahead of its events, whatever that decision
is, across later decisions, and wherever a worker dies or loses a race."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from longrun.authoring import RunKind, Tool
from longrun.domain import (
    ActionStatus,
    AskModel,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PatchTaken,
    PinnedVersions,
    RunSnapshot,
    RunStatus,
    ScheduleRetry,
    WaitForEvent,
    freeze,
)
from longrun.domain import events as ev
from longrun.model import ScriptedModel
from longrun.ports.runs import Fence, Transition
from longrun.testing.kit import Kit, every_crash
from longrun.testing.workers import MemoryWorker, MemoryWorkerStore
from longrun.workflows.steps import ECHO, EchoArgs
from tests import ci_gate

PATCH = ci_gate.PATCH


def markers(kit: Kit, run_id: str) -> list[ev.RunEvent]:
    return [e for e in kit.world.store.history(run_id) if isinstance(e, PatchTaken)]


def after_marker(kit: Kit, run_id: str) -> ev.RunEvent:
    """The event written right after the run's patch marker: the first of the decision it changed."""
    history = kit.world.store.history(run_id)
    (i,) = [i for i, e in enumerate(history) if isinstance(e, PatchTaken)]
    return history[i + 1]


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The event types of each write the workers make, write by write."""
    seen: list[list[str]] = []
    original = MemoryWorkerStore.commit

    async def recording(self: MemoryWorkerStore, transition: Transition) -> Any:
        seen.append([e.type for e, _ in transition.planned.rows])
        return await original(self, transition)

    monkeypatch.setattr(MemoryWorkerStore, "commit", recording)
    return seen


def ci(kit: Kit) -> None:
    kit.start(ci_gate.GOAL)
    kit.settle()


def test_the_patch_is_written_once_with_the_first_decision_it_changed(writes: list[list[str]]) -> None:
    with Kit(ci_gate.kind(), answers={ci_gate.CI.name: ci_gate.ci}) as kit:
        ci(kit)
        (run_id,) = kit.run_ids()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert kit.check() == []
        # Asked at two decisions (after each failed CI run), recorded at the first, with it.
        assert [(m.patch, m.workflow_version) for m in markers(kit, run_id)] == [(PATCH, "1")]
        assert ["run.patch_taken", "action.prepared", "action.submitted", "budget.charged"] in writes
        assert kit.snapshot(run_id).patches == (PATCH,)
        assert kit.executions(ci_gate.CI.name) == 3


def test_the_first_release_fails_the_run_and_records_no_patch() -> None:
    with Kit(ci_gate.kind(fixed=False), answers={ci_gate.CI.name: ci_gate.ci}) as kit:
        ci(kit)
        (run_id,) = kit.run_ids()
        assert kit.status(run_id) is RunStatus.FAILED
        assert markers(kit, run_id) == [] and kit.snapshot(run_id).patches == ()


def test_a_worker_killed_anywhere_still_writes_the_patch_once_ahead_of_its_decision() -> None:
    outcomes = every_crash(ci_gate.kind(), ci, answers={ci_gate.CI.name: ci_gate.ci})
    assert len(outcomes) > 10
    for outcome in outcomes:
        kit = outcome.kit
        (run_id,) = kit.run_ids()
        assert kit.status(run_id) is RunStatus.COMPLETED, outcome.point
        assert len(markers(kit, run_id)) == 1, outcome.point
        first = after_marker(kit, run_id)
        assert isinstance(first, ev.ActionPrepared) and first.logical_action == "ci:2", outcome.point
        assert kit.check() == [], outcome.point


def test_a_decision_that_loses_its_write_to_an_operator_writes_its_patch_when_decided_again() -> None:
    with Kit(ci_gate.kind(), answers={ci_gate.CI.name: ci_gate.ci}) as kit:
        run_id = kit.start(ci_gate.GOAL)
        worker = MemoryWorker(kit.world, "w-1", lease_ttl=30.0)
        taken, _ = worker.on_wakeup(kit.world.pending.pop(0))
        steps = worker.advance(run_id, Fence(taken["owner"], taken["token"]))
        for point in steps:
            run = kit.snapshot(run_id)
            if point == "commit" and run.fact("receipt:ci:1") is not None and run.action("ci:2") is None:
                kit.world.operate(run_id, "pause")  # lands between the retry's decision and its write
        assert kit.status(run_id) is RunStatus.PAUSED and markers(kit, run_id) == []
        kit.world.operate(run_id, "resume")
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert len(markers(kit, run_id)) == 1
        first = after_marker(kit, run_id)
        assert isinstance(first, ev.ActionPrepared) and first.logical_action == "ci:2"
        assert kit.check() == []


# -- whatever the decision, the patch rides with its write ------------------------------------------------

WRITE = Tool("notes.write", "1", EffectKind.IDEMPOTENT_WRITE, EchoArgs, ECHO.execute)
MODEL = ScriptedModel({"triage": [{"action": "retry", "rationale": "flaky"}]})


class FirstDecision:
    """Asks for the patch at every decision; decides ``first`` until its work is on record, then completes."""

    kind = "first_decision"

    def __init__(self, first: Callable[[DecisionContext], Decision]) -> None:
        self.first = first

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if not ctx.patched(PATCH):
            return Fail(reason="never live: every patch is taken")
        untouched = state.last_wake is None and not state.actions and not state.facts
        if untouched or any(a.status is not ActionStatus.CONFIRMED for a in state.actions):
            return self.first(ctx)
        return Complete(evidence=freeze({}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


FIRST: dict[str, tuple[Callable[[DecisionContext], Decision], list[str]]] = {
    "model call": (lambda ctx: AskModel(purpose="triage"), ["budget.charged", "fact.recorded"]),
    "call recorded with its answer": (  # written with the next decision: here the completion
        lambda ctx: CallTool(tool=ECHO.name, logical_action="echo", args=freeze({"step": 1})),
        ["action.recorded", "run.completed", "run.summary"]),
    "write": (lambda ctx: CallTool(tool=WRITE.name, logical_action="note", args=freeze({"step": 1})),
              ["action.prepared", "action.submitted", "budget.charged"]),
    "wait": (lambda ctx: WaitForEvent(kind="ci", correlation_key="ci/1", deadline=ctx.now + 60),
             ["run.wait_started"]),
    "retry": (lambda ctx: ScheduleRetry(logical_action="note", delay=5.0), ["run.wait_started"]),
    "completion": (lambda ctx: Complete(evidence=freeze({})), ["run.completed", "run.summary"]),
    "failure": (lambda ctx: Fail(reason="no"), ["run.status_changed", "run.summary"]),
}


def first_decision(name: str) -> RunKind:
    versions = PinnedVersions(workflow="2", prompt="none", model_policy="none", tool_schemas="none")
    return RunKind(FirstDecision.kind, versions, FirstDecision(FIRST[name][0]), {ECHO.name: ECHO, WRITE.name: WRITE},
                   allowed_actions=lambda state, purpose: ("retry",))


@pytest.mark.parametrize("name", FIRST)
def test_the_patch_rides_ahead_of_whatever_the_decision_writes(name: str, writes: list[list[str]]) -> None:
    with Kit(first_decision(name), model=MODEL) as kit:
        run_id = kit.start({})
        kit.settle()
        assert kit.status(run_id) is (RunStatus.FAILED if name == "failure" else RunStatus.COMPLETED)
        assert [(m.patch, m.workflow_version) for m in markers(kit, run_id)] == [(PATCH, "2")]
        # A READY run's move to RUNNING is written with its first decision: the patch comes between.
        assert writes[0] == ["run.status_changed", "run.patch_taken", *FIRST[name][1]]
        assert kit.check() == []


@pytest.mark.parametrize("name", FIRST)
def test_a_worker_killed_anywhere_writes_the_patch_once_whatever_the_decision(name: str) -> None:
    def scenario(kit: Kit) -> None:
        kit.start({})
        kit.settle()

    for outcome in every_crash(first_decision(name), scenario, model=MODEL):
        (run_id,) = outcome.kit.run_ids()
        assert len(markers(outcome.kit, run_id)) == 1, outcome.point
        assert after_marker(outcome.kit, run_id).type == FIRST[name][1][0], outcome.point
        assert outcome.kit.check() == [], outcome.point
