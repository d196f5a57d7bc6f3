"""``steps``: a run of K trivial tool steps — the workload the benchmarks and chaos tests drive.

Each step is its own logical action through the ledger (``step:<i>``) calling an
in-process tool, so a run costs what the runtime costs and nothing else: leases,
transitions, events, the ledger and the bus.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from longrun.authoring import Tool, ToolResult
from longrun.domain import (
    ActionStatus,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    RunSnapshot,
    freeze,
    thaw,
)

KIND = "steps"


class StepsInput(BaseModel):
    """A steps run's input: how many steps (other keys are carried along, unread)."""

    steps: int = Field(default=3, ge=0)


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int


async def _echo(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    return ToolResult(idempotency_key, {"step": args["step"]})


# Pure: nothing exists on a far side to look up or compare, so no lookup (drift checks skip it).
ECHO = Tool("bench.echo", "1", EffectKind.PURE, EchoArgs, _echo, public_receipt=("step",))


def _done(state: RunSnapshot, i: int) -> bool:
    record = state.action(f"step:{i}")
    return record is not None and record.status is ActionStatus.CONFIRMED


class Steps:
    kind = KIND

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        total = int(thaw(state.goal).get("steps", 3))
        for i in range(total):
            if not _done(state, i):
                return CallTool(tool=ECHO.name, logical_action=f"step:{i}", args=freeze({"step": i}))
        return Complete(evidence=freeze({"steps": total}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        total = int(thaw(evidence)["steps"])
        missing = [i for i in range(total) if not _done(state, i)]
        return (f"steps not confirmed: {missing}",) if missing else ()
