"""Run kinds for the child-run tests, loaded by the real services
(``LONGRUN_RUN_KINDS=tests.integration.child_kinds:kinds``) and by the kit.

``parent`` starts ``goal.children`` children of kind ``leaf`` named ``c0``, ``c1``..., each with the input
``goal.leaf`` (and, with ``goal.child_budget``, that budget), waits for all of them (``goal.until``:
``all``, ``any`` or a count; until ``goal.wait_for`` seconds, default an hour) and completes with each
child's outcome as evidence: its status and its evidence or reason. A child that failed is a fact it
reports, not its own failure. Past its deadline it fails saying so.

``leaf`` does what its input's ``mode`` says: ``complete`` (with its input's ``value`` as evidence),
``fail``, ``think`` (asks the model once, spending a model call, then completes) or ``wait`` (waits an
hour for an event that never comes: a child to cancel).
"""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import (
    AskModel,
    Child,
    Complete,
    Decision,
    DecisionContext,
    Fail,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    StartChildren,
    Usage,
    WaitForChildren,
    WaitForEvent,
    WakeReason,
    children,
    freeze,
    thaw,
)

VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none")
ANSWER = [{"action": "proceed", "args": {}, "rationale": "thought it over"}]


def _goal(state: RunSnapshot) -> dict[str, object]:
    goal = thaw(state.goal)
    assert isinstance(goal, dict)
    return goal


class Parent:
    kind = "parent"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = _goal(state)
        names = tuple(f"c{i}" for i in range(int(goal.get("children", 1))))  # type: ignore[call-overload]
        if not children.started(state):
            asked = goal.get("child_budget")
            budget = Usage(**asked) if isinstance(asked, dict) else None
            return StartChildren(children=tuple(
                Child(name=name, kind="leaf", input=freeze(goal.get("leaf", {"mode": "complete"})), budget=budget,
                      on_parent_cancel=str(goal.get("on_parent_cancel", "cancel")))  # type: ignore[arg-type]
                for name in names))
        until = goal.get("until", "all")
        count = children.needed(names, until)  # type: ignore[arg-type]
        if not children.satisfied(state, names, count):
            if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
                return Fail(reason="the children did not end before the deadline")
            return WaitForChildren(names=names, until=until,  # type: ignore[arg-type]
                                   deadline=ctx.now + float(goal.get("wait_for", 3600)))  # type: ignore[arg-type]
        outcomes = {}
        for name in names:
            child = children.outcome(state, name)
            assert child is not None
            outcomes[name] = {"run_id": child.run_id, "status": None if child.status is None else child.status.value,
                              "evidence": thaw(child.evidence), "reason": child.reason}
        return Complete(evidence=freeze({"children": outcomes}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


class Leaf:
    kind = "leaf"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = _goal(state)
        mode = goal.get("mode", "complete")
        if mode == "fail":
            return Fail(reason="the leaf was told to fail")
        if mode == "think" and state.fact("proposal:think:1") is None:
            return AskModel(purpose="think")
        if mode == "wait":
            return WaitForEvent(kind="never", correlation_key=f"never/{state.run_id}", deadline=ctx.now + 3600)
        return Complete(evidence=freeze({"value": goal.get("value", state.run_id)}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


PARENT = RunKind("parent", VERSIONS, Parent(), {})
LEAF = RunKind("leaf", VERSIONS, Leaf(), {}, allowed_actions=lambda state, purpose: ("proceed",),
               model_script={"think": ANSWER})


def kinds(settings: Settings) -> list[RunKind]:
    return [PARENT, LEAF]
