"""A run kind whose one call is slow, loaded by the real services (``LONGRUN_RUN_KINDS``), for tool
concurrency (``tool_concurrency`` of the run's tenant).

``permitted`` calls ``forge.slow`` once and completes. The far side is a file (``PERMIT_CALLS``): each
call appends a line when it starts and one when it ends (its tenant, idempotency key and time), and
takes ``PERMIT_CALL_SECONDS`` in between, so a test reads how many calls of a tenant were in flight
at once as the far side saw them.
"""

from __future__ import annotations

import asyncio
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
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    freeze,
)

TOOL = "forge.slow"


class TenantArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str


class Permitted:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.fact(RECEIPT_FACT_PREFIX + "slow") is None:
            return CallTool(tool=TOOL, args=freeze({"tenant": state.tenant_id}), logical_action="slow")
        return Complete(evidence=freeze({"called": TOOL}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    calls = os.environ["PERMIT_CALLS"]
    seconds = float(os.environ.get("PERMIT_CALL_SECONDS", "1"))

    def note(edge: str, tenant: str, key: str) -> None:
        with open(calls, "a") as far_side:
            far_side.write(json.dumps({"edge": edge, "tenant": tenant, "key": key, "at": time.time()}) + "\n")

    async def slow(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        note("start", args["tenant"], idempotency_key)
        try:
            await asyncio.sleep(seconds)
        finally:  # a call cancelled by its worker ends there, as far as this far side is concerned
            note("end", args["tenant"], idempotency_key)
        return ToolResult(f"slow:{idempotency_key}", {"done": True})

    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="permit-1")
    return [RunKind("permitted", versions, Permitted(), allowed_actions=lambda state, purpose: ("finish",), tools={
        TOOL: Tool(TOOL, "1", EffectKind.IDEMPOTENT_WRITE, TenantArgs, slow, start_to_close=60.0)})]


def most_in_flight(lines: list[str], tenant: str, *, killed_at: float | None = None) -> int:
    """The most calls of ``tenant`` the far side had started and not ended at once. A call started
    before ``killed_at`` (when its worker was SIGKILLed) and not ended by then ended with its worker."""
    calls = [c for c in map(json.loads, lines) if c["tenant"] == tenant]
    edges = [(c["at"], 1 if c["edge"] == "start" else -1) for c in calls]
    if killed_at is not None:
        ended = {c["key"] for c in calls if c["edge"] == "end" and c["at"] < killed_at}
        edges += [(killed_at, -1) for c in calls if c["edge"] == "start" and c["at"] < killed_at
                  and c["key"] not in ended]
    most = now = 0
    for _, step in sorted(edges):
        now += step
        most = max(most, now)
    return most
