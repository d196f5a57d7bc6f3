"""A Pydantic AI agent in a code-first run kind, loaded by the real services (``LONGRUN_RUN_KINDS=
tests.integration.agent_kinds:kinds``) and by the kit (``briefing_kind``, ``briefer``).

``briefing`` asks an agent to brief the team on its input's topic. The agent's model is a
``FunctionModel`` script: read the topic's notes (``notes.read``, a read), write the brief
(``briefs.write``, a non-idempotent write, found by its idempotency key), answer with the brief's id.

The far side is a directory (``AGENT_FAR_SIDE``): ``notes/<topic>.txt`` to read, and ``briefs.jsonl``,
one line per brief written (the effects a test counts). A write holds its answer ``AGENT_WRITE_HOLD``
seconds after acting, having touched ``writing`` (a test kills the worker then).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.codefirst.context import Context
from longrun.codefirst.kind import workflow
from longrun.config import Settings
from longrun.domain import EffectKind, PinnedVersions
from longrun.model import Price
from longrun.pydantic_ai import AgentTool, LedgerAgent

VERSIONS = PinnedVersions(workflow="1", prompt="brief-v1", model_policy="function-model", tool_schemas="briefs-1")
PRICE = Price(input_per_mtok=3.0, output_per_mtok=15.0)


class Topic(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: str


class Brief(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: str
    text: str


class Briefed(BaseModel):
    answer: str


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: read the notes, write the brief from them, answer with its id."""
    prompt = next(p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart))
    topic = str(prompt).rpartition(" on ")[2]
    returned = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if "read_notes" not in returned:
        return ModelResponse(parts=[ToolCallPart("read_notes", {"topic": topic})])
    if "write_brief" not in returned:
        notes = returned["read_notes"]["text"]
        return ModelResponse(parts=[ToolCallPart("write_brief", {"topic": topic, "text": f"In short: {notes}"})])
    return ModelResponse(parts=[TextPart(f"briefed as {returned['write_brief']['id']}")])


def far_side_tools(root: Path, hold: float = 0.0) -> tuple[Tool, Tool]:
    briefs = root / "briefs.jsonl"

    def written() -> list[dict[str, Any]]:
        return [json.loads(line) for line in briefs.read_text().splitlines()] if briefs.exists() else []

    async def read(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        notes = root / "notes" / f"{args['topic']}.txt"
        return ToolResult(None, {"topic": args["topic"], "text": notes.read_text() if notes.exists() else ""})

    async def write(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        brief = {"id": f"brief-{len(written()) + 1}", "topic": args["topic"], "text": args["text"],
                 "key": idempotency_key}
        with briefs.open("a") as far_side:
            far_side.write(json.dumps(brief) + "\n")
        (root / "writing").touch()
        await asyncio.sleep(hold)
        return ToolResult(brief["id"], {k: brief[k] for k in ("id", "topic", "text")})

    async def find(idempotency_key: str) -> ToolResult | None:
        found = [b for b in written() if b["key"] == idempotency_key]
        return ToolResult(found[0]["id"], {k: found[0][k] for k in ("id", "topic", "text")}) if found else None

    return (Tool("notes.read", "1", EffectKind.READ, Topic, read),
            Tool("briefs.write", "1", EffectKind.NON_IDEMPOTENT_WRITE, Brief, write, lookup=find, start_to_close=10))


SCRIPTED = FunctionModel(script, model_name="briefing-script")


def briefer(read: Tool, write: Tool, model: Model = SCRIPTED, **options: Any) -> LedgerAgent:
    """The briefing agent on ``model`` (``options``: the ``Agent``'s others, e.g. instructions)."""
    return LedgerAgent(Agent(model, name="briefer", **options), [
        AgentTool(read, "Read the team's notes on a topic.", name="read_notes"),
        AgentTool(write, "Write the brief of a topic for the team.", name="write_brief"),
    ], price=PRICE)


def briefing_kind(agent: LedgerAgent, kind: str = "briefing") -> RunKind:
    """A kind whose function runs ``agent`` on its input's topic and answers with the agent's output."""

    @workflow(kind, input=Topic, output=Briefed)
    async def briefing(value: Topic, ctx: Context) -> Briefed:
        return Briefed(answer=await agent.run(ctx, f"Brief the team on {value.topic}"))

    return RunKind(kind, VERSIONS, briefing, agent.tools, model=agent.model, allowed_actions=agent.allowed_actions,
                   input_schema=Topic)


def kinds(settings: Settings) -> list[RunKind]:
    root = Path(os.environ["AGENT_FAR_SIDE"])
    return [briefing_kind(briefer(*far_side_tools(root, float(os.environ.get("AGENT_WRITE_HOLD", "0")))))]
