"""A run kind whose one tool is rate limited, loaded by the real services (``LONGRUN_RUN_KINDS``).

``limited`` calls ``limited.call`` once and completes (``{"unlimited": true}``: it calls
``limited.free``, which declares no limit; ``{"ask": true}``: it asks the model once instead, and may
be told only "finish"). ``limited.call`` declares the limit ``forge-api``:
``LIMITED_PER_10S`` calls per 10 s (the per-minute limit, scaled), burst ``LIMITED_BURST``, one
bucket for every tenant (per key). The far side is a file (``LIMITED_CALLS``): every call appends
one line with its idempotency key and the time it arrived, so the test counts what the far side saw.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    AskModel,
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
from longrun.domain.rate_limit import RateLimit

LIMIT = "forge-api"


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limited:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if goal.get("ask"):
            if state.fact("proposal:plan:1") is None:
                return AskModel(purpose="plan")
            return Complete(evidence=freeze({"asked": True}))
        verb = "free" if goal.get("unlimited") else "call"
        if state.fact(RECEIPT_FACT_PREFIX + verb) is None:
            return CallTool(tool=f"limited.{verb}", args=freeze({}), logical_action=verb)
        return Complete(evidence=freeze({"called": verb}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    calls = os.environ["LIMITED_CALLS"]
    limit = RateLimit(LIMIT, amount=int(os.environ.get("LIMITED_PER_10S", "20")), period=10.0,
                      burst=int(os.environ.get("LIMITED_BURST", "2")))

    def tool(verb: str) -> Any:
        async def call(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
            with open(calls, "a") as far_side:
                far_side.write(json.dumps({"tool": verb, "key": idempotency_key, "at": time.time()}) + "\n")
            return ToolResult(f"{verb}:{idempotency_key}", {"done": True})
        return call

    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="limited-1")
    return [RunKind("limited", versions, Limited(), allowed_actions=lambda state, purpose: ("finish",), tools={
        "limited.call": Tool("limited.call", "1", EffectKind.IDEMPOTENT_WRITE, NoArgs, tool("call"),
                             rate_limits=(limit,)),
        "limited.free": Tool("limited.free", "1", EffectKind.IDEMPOTENT_WRITE, NoArgs, tool("free"))})]
