"""A run kind and a webhook provider for the tracing test, loaded by the real services
(``LONGRUN_RUN_KINDS=tests.integration.traced_kind:kinds``,
``LONGRUN_WEBHOOK_PROVIDERS=signal=tests.integration.traced_kind:signal``).

``traced`` calls a tool (which writes a log line), asks the model, naps (a wait whose deadline
timer wakes it), waits for a ``signal`` webhook on ``signal/<run_id>``, and completes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.ports.webhooks import Provider, Signature, Translated
from longrun.domain import (
    ActionStatus,
    AskModel,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    WaitForEvent,
    WakeReason,
    freeze,
)

NAP = 1.0
"""Seconds a run naps; the test starts the timer service only once both runs' naps are due."""
SIGNAL_FACT = "signal"
logger = logging.getLogger("tests.traced")


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str


async def _note(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    logger.info("noting run %s", args["run"])
    return ToolResult(idempotency_key, {"noted": args["run"]})


NOTE = Tool("traced.note", "1", EffectKind.PURE, NoteArgs, _note)


class Traced:
    kind = "traced"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        noted = state.action("note")
        if noted is None or noted.status is not ActionStatus.CONFIRMED:
            return CallTool(tool=NOTE.name, logical_action="note", args=freeze({"run": state.run_id}))
        if state.fact("proposal:plan:1") is None:
            return AskModel(purpose="plan")
        if state.fact(SIGNAL_FACT) is not None:
            return Complete(evidence=freeze({"signalled": True}))
        if state.last_wake is None or state.last_wake.reason is not WakeReason.DEADLINE:
            return WaitForEvent(kind="nap", correlation_key=f"nap/{state.run_id}", deadline=ctx.now + NAP)
        return WaitForEvent(kind="signal", correlation_key=f"signal/{state.run_id}", deadline=ctx.now + 600,
                            provider="signal")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    return [RunKind("traced", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="t-1"),
                    Traced(), {NOTE.name: NOTE}, allowed_actions=lambda state, purpose: ("proceed",),
                    model_script={"plan": [{"action": "proceed", "args": {}, "rationale": "nothing in the way"}]})]


def _signalled(payload: dict[str, Any]) -> Translated:
    return Translated(event_id=str(payload["id"]), correlation_key=str(payload["key"]), fact_key=SIGNAL_FACT,
                      fact={"id": payload["id"]})


signal = Provider(_signalled, Signature("x-forge-signature"))
