"""``ci_gate``: a run kind with a patch point, for the tests of ``ctx.patched`` at every tier.

Its first release failed a run as soon as CI failed. The fix, patch ``fix-ci-retry``, runs CI
again, up to ``RUNS`` runs, for the decisions that take the patch; a history recorded without it
replays through the first release's branch. ``kind(fixed=False)`` is that first release.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.domain import (
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    freeze,
    thaw,
)

KIND = "ci_gate"
PATCH = "fix-ci-retry"
VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="ci-v1")
RUNS = 3
"""CI fails every run before the third: the first release fails the run, the fix retries until it passes."""
GOAL = {"sha": "0a1b2c"}


class CiArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sha: str
    run: int


def ci(args: Mapping[str, Any], idempotency_key: str) -> ToolResult:
    """CI as the far side answers it: the tool's own call, and the kit's scripted answer."""
    return ToolResult(f"ci-{args['run']}", {"status": "passed" if args["run"] >= RUNS else "failed"})


async def _run_ci(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    return ci(args, idempotency_key)


CI = Tool("ci.run", "1", EffectKind.IDEMPOTENT_WRITE, CiArgs, _run_ci)


class CiGate:
    kind = KIND

    def __init__(self, *, fixed: bool = True) -> None:
        self.fixed = fixed

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        runs = sum(1 for a in state.actions if a.logical_action.startswith("ci:"))
        last = _result(state, runs)
        if last is None:  # none started yet, or the last one's answer is not on record
            return _ci(state, max(runs, 1))
        if last == "passed":
            return Complete(evidence=freeze({"ci": "passed", "runs": runs}))
        if self.fixed and runs < RUNS and ctx.patched(PATCH):
            return _ci(state, runs + 1)
        return Fail(reason=f"ci run {runs} failed")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        runs = int(thaw(evidence)["runs"])
        return () if _result(state, runs) == "passed" else (f"ci run {runs} did not pass",)


def _result(state: RunSnapshot, run: int) -> str | None:
    receipt = state.fact(f"receipt:ci:{run}")
    return None if receipt is None else str(thaw(receipt.value)["status"])


def _ci(state: RunSnapshot, run: int) -> CallTool:
    return CallTool(tool=CI.name, logical_action=f"ci:{run}", args=freeze({"sha": thaw(state.goal)["sha"], "run": run}))


def kind(*, fixed: bool = True) -> RunKind:
    return RunKind(KIND, VERSIONS, CiGate(fixed=fixed), {CI.name: CI})
