"""What one decision costs the store: the real worker over a counting memory store (the kit), each of
its rounds told apart. Besides the take and the lease renewals, a decision that calls nothing is one
store call; a call is one before it (two-phase effect kinds only: a write is on record before it is
sent) and one after it. A pure or read call's record rides with the next write: the next decision's
own, or, if that one asks the world for more, a write just before it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from longrun.app.worker import loop
from longrun.authoring import RunKind, Tool
from longrun.domain import (
    AskModel,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    RunStatus,
    freeze,
)
from longrun.model import ScriptedModel
from longrun.testing.kit import Kit
from longrun.testing.workers import MemoryWorkerStore
from longrun.workflows.steps import ECHO, EchoArgs

WRITE = Tool("notes.write", "1", EffectKind.IDEMPOTENT_WRITE, EchoArgs, ECHO.execute)
NOT_PER_ROUND = frozenset({"take_on_wakeup", "adopt", "extend_lease"})
"""The take and the lease renewals: per run, not per decision."""


class Script:
    """Decides a write, a pure call, a model call, a pure call, then completes."""

    kind = "per_round"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        done = {a.logical_action for a in state.actions}
        if "note" not in done:
            return CallTool(tool=WRITE.name, logical_action="note", args=freeze({"step": 1}))
        if "echo:1" not in done:
            return CallTool(tool=ECHO.name, logical_action="echo:1", args=freeze({"step": 2}))
        if state.fact("proposal:triage:1") is None:
            return AskModel(purpose="triage")
        if "echo:2" not in done:
            return CallTool(tool=ECHO.name, logical_action="echo:2", args=freeze({"step": 3}))
        return Complete(evidence=freeze({}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def script_kind() -> RunKind:
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none")
    return RunKind(Script.kind, versions, Script(), {ECHO.name: ECHO, WRITE.name: WRITE},
                   allowed_actions=lambda state, purpose: ("retry",))


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """The store calls of each round the workers play, round by round."""
    seen: list[list[str]] = []
    for name in ("load", "hand_over", "release_lease", "commit", "tenant_policy", "resend", "beat",
                 *NOT_PER_ROUND):
        original = getattr(MemoryWorkerStore, name)

        async def counted(self: MemoryWorkerStore, *args: Any, _name: str = name, _original: Any = original,
                          **kwargs: Any) -> Any:
            if _name not in NOT_PER_ROUND and seen:
                seen[-1].append(_name)
            return await _original(self, *args, **kwargs)

        monkeypatch.setattr(MemoryWorkerStore, name, counted)
    play = loop.play

    async def round_(*args: Any, **kwargs: Any) -> Any:
        seen.append([])
        return await play(*args, **kwargs)

    monkeypatch.setattr(loop, "play", round_)
    yield seen


def test_a_decision_costs_one_store_call_and_a_call_one_more_only_when_it_is_two_phase(
        rounds: list[list[str]]) -> None:
    with Kit(script_kind(), model=ScriptedModel({"triage": [{"action": "retry", "rationale": "r"}]})) as kit:
        run_id = kit.start({})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert kit.check() == []
    assert rounds == [
        ["commit", "commit"],  # the write: on record before it is sent, and its answer
        [],                    # a pure call: recorded with its answer, in the next write
        ["commit", "commit"],  # that write, before the model is asked; then the model's answer
        [],                    # a pure call again
        ["commit"],            # the completion, the pure call's record with it
    ]
