"""A run kind for the slot tests, loaded by the real services (``LONGRUN_RUN_KINDS``).

``gated`` with ``{"gated": true}`` calls ``gate.open`` once (its far side ``gate``) and completes; with
``{"gated": false}`` it completes at once, calling nothing. ``gated_declared`` is the same, and
declares the gate as its next call's far side while it has not been through (``RunKind.next_far_side``).
Every decision asked for appends the run's id to the file ``GATE_DECIDED``. The gate is down while the file
``GATE_DOWN`` exists (every call answers unavailable, and did nothing); each call that gets through
appends its idempotency key to the file ``GATE_CALLS`` (once: the gate is idempotent by key), so a
test counts exactly what took effect.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    freeze,
    thaw,
)
from longrun.errors import ToolUnavailable

FAR_SIDE = "gate"


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _gate(down: str, calls: str) -> Tool:
    async def open_gate(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        if os.path.exists(down):
            raise ToolUnavailable("gate.open", "503: the gate is down")
        with open(calls, "a+") as far_side:  # idempotent: a key it has seen takes no effect again
            far_side.seek(0)
            if idempotency_key not in far_side.read().split():
                far_side.write(idempotency_key + "\n")
        return ToolResult(f"gate:{idempotency_key}", {"opened": True})

    return Tool("gate.open", "1", EffectKind.IDEMPOTENT_WRITE, NoArgs, open_gate, far_side=FAR_SIDE)


def _needs_the_gate(state: RunSnapshot) -> bool:
    goal = thaw(state.goal)
    assert isinstance(goal, dict)
    return bool(goal.get("gated")) and state.fact(RECEIPT_FACT_PREFIX + "open") is None


class Gated:
    def __init__(self, decided: str) -> None:
        self.decided = decided

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        with open(self.decided, "a") as seen:  # what the test counts: each decision asked for, by run
            seen.write(state.run_id + "\n")
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if _needs_the_gate(state):
            return CallTool(tool="gate.open", args=freeze({}), logical_action="open")
        return Complete(evidence=freeze({"gated": bool(goal.get("gated"))}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    tool = _gate(os.environ["GATE_DOWN"], os.environ["GATE_CALLS"])
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="gate-1")
    workflow = Gated(os.environ["GATE_DECIDED"])
    return [RunKind("gated", versions, workflow, {tool.name: tool}),
            RunKind("gated_declared", versions, workflow, {tool.name: tool},
                    next_far_side=lambda state: FAR_SIDE if _needs_the_gate(state) else None)]
