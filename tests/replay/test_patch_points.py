"""Patch points on replay: ``ctx.patched`` is taken exactly where the history recorded the patch.

A history recorded before a patch existed replays through the old branch of a ``decide`` that has
the patch; a history that took it replays through the new one, from the decision written with
``run.patch_taken`` on. The histories are the stored ones (``histories/*.json``) and runs of
``tests.ci_gate`` recorded by the kit (the real worker in memory) under each release.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from longrun.authoring import Registry
from longrun.domain import (
    CallTool,
    Decision,
    DecisionContext,
    Fail,
    FrozenMap,
    RunSnapshot,
    Workflow,
    event_to_dict,
    evolve,
)
from longrun.domain import events as ev
from longrun.testing.kit import Kit
from tests import ci_gate
from tests.replay.replay import History, decide, decision_to_plain, divergences, kinds, record, replayed

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
FIRST_RELEASE, FIXED = Registry([ci_gate.kind(fixed=False)]), Registry([ci_gate.kind()])


def recorded(release: Registry) -> dict[str, Any]:
    """A ``ci_gate`` run made by the kit under ``release``, as a history file (its decisions derived and
    checked against what followed each)."""
    (run_kind,) = (release.get(name, version) for name, version in release.advertised())
    with Kit(run_kind, answers={ci_gate.CI.name: ci_gate.ci}) as kit:
        run_id = kit.start(ci_gate.GOAL)
        kit.settle()
        rows = sorted(kit.world.store.event_rows(run_id), key=lambda r: r.event.seq)
        return record(name="ci-gate", story="CI fails twice, then passes", source={"by": "the kit"},
                      rows=[(event_to_dict(r.event), r.applied) for r in rows],
                      snapshot=kit.snapshot(run_id).to_dict(), kinds=release)


def decisions(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [p["decision"] for p in data["decisions"]]


def test_a_history_recorded_before_the_patch_replays_through_the_old_branch() -> None:
    then = recorded(FIRST_RELEASE)
    assert [d["type"] for d in decisions(then)] == ["CallTool", "Fail"]
    assert replayed(FIXED, History("ci-gate", then)) == decisions(then)
    assert divergences(FIXED, then, why="the fix") == []


def test_the_old_branch_is_taken_for_want_of_the_marker() -> None:
    then = History("ci-gate", recorded(FIRST_RELEASE))
    failed_at = then.points[-1]
    state: RunSnapshot | None = None
    for event in then.events:
        if event.seq <= failed_at.after_seq:
            state = evolve(state, event)
    assert state is not None and state.patches == ()
    # Where the run had recorded the patch, the same state takes the fix.
    patched = decide(FIXED, state, failed_at.now, frozenset({ci_gate.PATCH}))
    assert isinstance(patched, CallTool) and patched.logical_action == "ci:2"
    assert decision_to_plain(decide(FIXED, state, failed_at.now)) == failed_at.decision


def test_a_history_that_took_the_patch_replays_through_the_new_branch_from_its_marker() -> None:
    now = recorded(FIXED)
    events = History("ci-gate", now).events
    (marker,) = [e for e in events if isinstance(e, ev.PatchTaken)]
    points = [(p["after_seq"], p["decision"]["type"], p["decision"].get("logical_action")) for p in now["decisions"]]
    # The decision written with the marker is decided just before it, not a decision of its own.
    assert marker.seq == 8
    assert points == [(2, "CallTool", "ci:1"), (7, "CallTool", "ci:2"), (13, "CallTool", "ci:3"),
                      (18, "Complete", None)]
    assert replayed(FIXED, History("ci-gate", now)) == decisions(now)
    # The first release, which knows no patch, fails wherever the run retried.
    assert [d["after_seq"] for d in divergences(FIRST_RELEASE, now, why="no fix")] == [7, 13]


class Patched:
    """``workflow`` with a patch whose branch would change every decision it takes."""

    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow
        self.kind = workflow.kind

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if ctx.patched(ci_gate.PATCH):
            return Fail(reason=ci_gate.PATCH)
        return self.workflow.decide(state, ctx)

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return self.workflow.accept(state, evidence)


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
def test_every_stored_history_replays_through_the_old_branch_of_a_patched_decide(path: Path) -> None:
    data = json.loads(path.read_text())
    today = kinds()
    patched = Registry([replace(today.get(name, version), workflow=Patched(today.get(name, version).workflow))
                        for name, version in today.advertised()])
    history = History(data["name"], data)
    assert replayed(patched, history) == replayed(today, history)
