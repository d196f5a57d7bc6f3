"""A run kind whose call streams its output, loaded by the real services (``LONGRUN_RUN_KINDS``).

``chatty`` makes one call, ``chat.say``, which emits the goal's ``chunks`` chunks (``"part <i>"``),
reports a heartbeat, writes ``<gate>.said`` once it emitted them, and then waits for the file
``gate`` before it emits one chunk more (``"last part"``), and for ``<gate>.done`` before it answers:
so a test can watch a call's output arrive while the call is still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult, heartbeat
from longrun.config import Settings
from longrun.domain import (RECEIPT_FACT_PREFIX, CallTool, Complete, Decision, DecisionContext, EffectKind,
                            FrozenMap, PinnedVersions, RunSnapshot, freeze, thaw)
from longrun.streaming import emit_chunk


class SayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chunks: int
    gate: str


async def say(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    for i in range(1, args["chunks"] + 1):
        await emit_chunk(f"part {i}")
    await heartbeat({"said": args["chunks"]})
    gate = Path(args["gate"])
    Path(f"{gate}.said").touch()
    await _opened(gate)
    await emit_chunk("last part")
    await _opened(Path(f"{gate}.done"))
    return ToolResult(f"said:{args['chunks']}", {"said": args["chunks"] + 1})


async def _opened(gate: Path) -> None:
    for _ in range(600):
        if gate.exists():
            return
        await asyncio.sleep(0.05)


class Chatty:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.fact(RECEIPT_FACT_PREFIX + "say") is None:
            return CallTool(tool="chat.say", args=freeze(thaw(state.goal)), logical_action="say")
        return Complete(evidence=freeze({"said": True}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    tool = Tool("chat.say", "1", EffectKind.READ, SayArgs, say, heartbeat_timeout=60)
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="chat-1")
    return [RunKind("chatty", versions, Chatty(), {tool.name: tool})]
