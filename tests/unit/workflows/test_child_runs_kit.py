"""Child runs in the testing kit: the parent and its children run in memory under the kit's clock, with
the engine's own worker, timers and operators (``tests/integration/child_kinds.py``)."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.domain import (
    Child,
    Decision,
    DecisionContext,
    FrozenMap,
    RunSnapshot,
    RunStatus,
    RunStatusChanged,
    StartChildren,
    WaitForChildren,
    children,
    freeze,
    thaw,
)
from longrun.model import ScriptedModel
from longrun.testing.kit import Kit
from tests.integration.child_kinds import ANSWER, LEAF, PARENT, VERSIONS


def _children_of(kit: Kit, parent: str) -> dict[str, children.ChildOutcome]:
    found = {c.name: c for c in children.started(kit.snapshot(parent))}
    return found


def test_a_parent_completes_with_the_outcomes_of_its_children() -> None:
    with Kit(PARENT, children=[LEAF]) as kit:
        parent = kit.start({"children": 3, "leaf": {"mode": "complete", "value": 1}})
        kit.settle()
        assert kit.status(parent) is RunStatus.COMPLETED
        kids = _children_of(kit, parent)
        assert sorted(kids) == ["c0", "c1", "c2"]
        assert {kit.status(c.run_id) for c in kids.values()} == {RunStatus.COMPLETED}
        assert {c.status for c in kids.values()} == {RunStatus.COMPLETED}
        evidence = thaw(kit.snapshot(parent).acceptance.evidence)  # type: ignore[union-attr]
        assert evidence["children"]["c1"]["evidence"] == {"value": 1}  # type: ignore[index]
        assert kit.check() == []


def test_a_failed_child_is_a_fact_and_any_ends_the_wait_at_the_first_end() -> None:
    with Kit(PARENT, children=[LEAF]) as kit:
        parent = kit.start({"children": 2, "leaf": {"mode": "fail"}, "until": "any"})
        kit.settle()
        assert kit.status(parent) is RunStatus.COMPLETED
        ended = [c for c in _children_of(kit, parent).values() if c.status is not None]
        assert ended and {c.status for c in ended} == {RunStatus.FAILED}
        assert {c.reason for c in ended} == {"the leaf was told to fail"}
        assert kit.check() == []


def test_cancelling_or_terminating_the_parent_cancels_its_children_and_abandon_leaves_them() -> None:
    with Kit(PARENT, children=[LEAF]) as kit:
        cancelled = kit.start({"children": 2, "leaf": {"mode": "wait"}})
        terminated = kit.start({"children": 2, "leaf": {"mode": "wait"}})
        abandoned = kit.start({"children": 1, "leaf": {"mode": "wait"}, "on_parent_cancel": "abandon"})
        kit.settle(timers=False)
        assert kit.status(cancelled) is RunStatus.WAITING_EVENT
        kit.world.operate(cancelled, "cancel", reason="not needed")
        kit.world.operate(terminated, "terminate", reason="not needed")
        kit.world.operate(abandoned, "cancel", reason="not needed")
        kit.settle(timers=False)
        assert kit.status(terminated) is RunStatus.TERMINATED
        assert {kit.status(c.run_id) for c in _children_of(kit, terminated).values()} == {RunStatus.CANCELLED}
        assert kit.status(cancelled) is RunStatus.CANCELLED
        assert {kit.status(c.run_id) for c in _children_of(kit, cancelled).values()} == {RunStatus.CANCELLED}
        assert kit.status(abandoned) is RunStatus.CANCELLED
        [left] = _children_of(kit, abandoned).values()
        assert kit.status(left.run_id) is RunStatus.WAITING_EVENT


def test_the_tree_never_spends_more_than_the_parents_budget() -> None:
    # The kit's runs may make 5 model calls: six children asking for one each get five between them.
    with Kit(PARENT, children=[LEAF], model=ScriptedModel({"think": ANSWER})) as kit:
        parent = kit.start({"children": 6, "leaf": {"mode": "think"},
                            "child_budget": {"model_calls": 1, "tool_calls": 1, "cost": 0.5}})
        kit.settle()
        kids = _children_of(kit, parent).values()
        spent = sum(kit.snapshot(c.run_id).budget.used.model_calls for c in kids)
        assert spent == 5 and kit.snapshot(parent).budget.used.model_calls == 5
        assert sorted(c.status.value for c in kids) == ["BUDGET_EXHAUSTED"] + ["COMPLETED"] * 5  # type: ignore[union-attr]


class _Asks:
    """A parent whose ``decide`` is given: to start a child of a kind nobody runs, or to wait wrongly."""

    kind = "asks"

    def __init__(self, decision: object) -> None:
        self.decision = decision

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        return self.decision  # type: ignore[return-value]

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def test_a_child_admission_refuses_or_a_wait_for_children_never_started_goes_to_a_person() -> None:
    refused = StartChildren(children=(Child(name="x", kind="nobody", input=freeze({})),))
    for decision, reason in ((refused, "child 'x' refused: unknown workflow 'nobody'"),
                             (WaitForChildren(names=("y",), deadline=2e9), "children y it never started")):
        with Kit(RunKind("asks", VERSIONS, _Asks(decision), {}), children=[LEAF]) as kit:
            run_id = kit.start({})
            kit.settle()
            assert kit.status(run_id) is RunStatus.NEEDS_ATTENTION
            assert reason in _last_reason(kit, run_id)
            assert kit.run_ids() == [run_id]  # nothing of the refused step was created


def _last_reason(kit: Kit, run_id: str) -> str:
    moves = [e for e in kit.world.store.history(run_id) if isinstance(e, RunStatusChanged)]
    return moves[-1].reason
