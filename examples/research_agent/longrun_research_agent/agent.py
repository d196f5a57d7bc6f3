"""The research agent: a Pydantic AI ``Agent`` run by a code-first function, its report gated by an
editor's approval of the exact report (the hash of its arguments)."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from longrun.authoring import RunKind, Tool
from longrun.codefirst.context import Context
from longrun.codefirst.kind import workflow
from longrun.domain import PinnedVersions
from longrun.pydantic_ai import AgentTool, Approval, LedgerAgent

VERSIONS = PinnedVersions(workflow="1", prompt="research-v1", model_policy="offline-v1", tool_schemas="library-v1")
EDITOR = "editor"


class Question(BaseModel):
    topic: str


class Answer(BaseModel):
    answer: str


def offline_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """What a model would do, scripted: read the topic's notes, write a report of them, say what it did."""
    prompt = next(p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart))
    topic = str(prompt).rpartition(": ")[2]
    returned = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if "read_notes" not in returned:
        return ModelResponse(parts=[ToolCallPart("read_notes", {"topic": topic})])
    if "write_report" not in returned:
        notes = returned["read_notes"]["notes"].strip() or "nothing on record"
        return ModelResponse(parts=[ToolCallPart("write_report", {"title": f"What we know about {topic}",
                                                                   "body": f"From our notes: {notes}"})])
    written = returned["write_report"]
    if isinstance(written, str):  # the editor did not approve it
        return ModelResponse(parts=[TextPart(f"No report on {topic}: {written}")])
    return ModelResponse(parts=[TextPart(f"Wrote {written['id']}: {written['title']}")])


def research_kind(read_notes: Tool, write_report: Tool) -> RunKind:
    agent = LedgerAgent(Agent(FunctionModel(offline_model, model_name="offline-research"), name="researcher"), [
        AgentTool(read_notes, "Read the library's notes on a topic.", name="read_notes"),
        AgentTool(write_report, "Write a report to the library.", name="write_report", approval=Approval(EDITOR)),
    ])

    @workflow("research", input=Question, output=Answer)
    async def research(question: Question, ctx: Context) -> Answer:
        return Answer(answer=await agent.run(ctx, f"Research and report on: {question.topic}"))

    return RunKind("research", VERSIONS, research, agent.tools, model=agent.model,
                   allowed_actions=agent.allowed_actions, input_schema=Question)
