"""A Pydantic AI agent in a code-first run kind (``tests/integration/agent_kinds.py``), in the kit: its
model requests are the run's model calls (charged with their tokens and cost), its tool calls ledger
actions, its loop replayed from the journal on every wake, and a crash anywhere leaves one write."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessEventStream
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from longrun.authoring import RunKind, ToolResult
from longrun.codefirst.context import Context
from longrun.codefirst.kind import workflow
from longrun.domain import RunStatus, thaw
from longrun.pydantic_ai import AgentTool, LedgerAgent
from longrun.testing.kit import Kit, every_crash
from longrun.testing.replay import replay
from tests.integration.agent_kinds import VERSIONS, Briefed, Topic, briefer, briefing_kind, far_side_tools, script

NOTES = "raise the starter plan to 12 EUR"


def _answers() -> dict[str, Any]:
    def read(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult(None, {"topic": args["topic"], "text": NOTES})

    def write(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult("brief-1", {"id": "brief-1", **args})

    return {"notes.read": read, "briefs.write": write}


READ, WRITE = far_side_tools(Path("/nonexistent"))
KIND = briefing_kind(briefer(READ, WRITE))


def brief(kit: Kit) -> None:
    kit.start({"topic": "pricing"})
    kit.settle()


def test_the_agent_reads_writes_and_answers_each_request_a_charged_model_call_each_call_a_ledger_action() -> None:
    with Kit(KIND, answers=_answers()) as kit:
        brief(kit)
        (run_id,) = kit.run_ids()
        run = kit.snapshot(run_id)
        assert kit.status(run_id) is RunStatus.COMPLETED, run.terminal_reason
        assert thaw(run.acceptance.evidence)["answer"] == "briefed as brief-1"  # type: ignore[union-attr]
        # the agent's tool calls are ledger actions in the order the model asked for them
        assert [(a.logical_action, a.tool, a.status.value) for a in run.actions] == [
            ("1:notes.read", "notes.read", "CONFIRMED"), ("3:briefs.write", "briefs.write", "CONFIRMED")]
        assert kit.executions("briefs.write") == 1
        assert run.fact("receipt:3:briefs.write").value["text"] == f"In short: {NOTES}"  # type: ignore[union-attr,index]
        # its three model requests are the run's model calls, charged with their tokens and cost
        proposals = [f.key for f in run.facts if f.key.startswith("proposal:")]
        assert proposals == ["proposal:agent:briefer:1", "proposal:agent:briefer:2", "proposal:agent:briefer:3"]
        assert run.budget.used.model_calls == 3 and run.budget.used.cost > 0
        assert kit.check() == []


def test_a_worker_killed_anywhere_still_writes_one_brief_and_completes() -> None:
    outcomes = every_crash(KIND, brief, answers=_answers())
    assert len(outcomes) >= 6
    for outcome in outcomes:
        (run_id,) = outcome.kit.run_ids()
        assert outcome.kit.status(run_id) is RunStatus.COMPLETED, outcome.point
        assert outcome.kit.executions("briefs.write") == 1, outcome.point
        assert outcome.kit.check() == [], outcome.point


def _two_at_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("read_notes", {"topic": "pricing"}),
                                    ToolCallPart("read_notes", {"topic": "hiring"})])
    return ModelResponse(parts=[TextPart(" / ".join(p.content["topic"] for p in returned))])


def test_tool_calls_of_one_response_are_made_one_after_the_other_in_the_models_order() -> None:
    agent = LedgerAgent(Agent(FunctionModel(_two_at_once), name="reader"),
                        [AgentTool(READ, "Read notes.", name="read_notes")])
    kind = briefing_kind(agent, "reading")
    with Kit(kind, answers=_answers()) as kit:
        run_id = kit.start({"topic": "x"})
        kit.settle()
        run = kit.snapshot(run_id)
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert [a.logical_action for a in run.actions] == ["1:notes.read", "2:notes.read"]
        assert [thaw(run.fact(f"receipt:{a.logical_action}").value)["topic"] for a in run.actions] == [  # type: ignore[union-attr,index]
            "pricing", "hiring"]
        assert thaw(run.acceptance.evidence)["answer"] == "pricing / hiring"  # type: ignore[union-attr]


def test_an_agent_with_tools_of_its_own_or_without_a_name_is_refused() -> None:
    owning = Agent(TestModel(), name="owning")

    @owning.tool_plain
    def shout(text: str) -> str:
        return text.upper()

    with pytest.raises(ValueError, match=r"has tools of its own \(shout\): their calls would not be journaled"):
        LedgerAgent(owning)
    with pytest.raises(ValueError, match="a ledger agent needs a name"):
        LedgerAgent(Agent(TestModel()))


def test_the_authoring_chapters_agent_runs_as_written() -> None:
    # Given the kind of docs/authoring.md's "Pydantic AI", as written (its model a TestModel, which calls
    # every tool at once)
    text = (Path(__file__).resolve().parents[3] / "docs" / "authoring.md").read_text()
    chapter = text.split("## Pydantic AI\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", chapter, re.DOTALL)
    names: dict[str, Any] = {}
    exec(compile(code, "authoring.md", "exec"), names)
    # When it runs in the kit and the editor approves the report
    with Kit(names["kind"]) as kit:
        run_id = kit.start({"topic": "pricing"})
        kit.settle(timers=False)
        waiting = kit.snapshot(run_id)
        assert waiting.status is RunStatus.WAITING_USER and waiting.wait is not None
        assert waiting.wait.owner == "editor" and kit.executions("library.write_report") == 0
        kit.decide(run_id)
        kit.settle()
        # Then the notes were read, the approved report written once, and the run completed
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert [a.tool for a in kit.snapshot(run_id).actions] == ["library.read_notes", "library.write_report"]
        assert kit.executions("library.write_report") == 1 and kit.check() == []


def test_a_recorded_run_replays_against_the_same_agent_and_diverges_where_the_agent_asks_otherwise() -> None:
    with Kit(KIND, answers=_answers()) as kit:
        brief(kit)
        (run_id,) = kit.run_ids()
        history = kit.history(run_id)
    assert replay(KIND, history).divergence is None
    # The same tools and model, but the agent's instructions changed: its first request is another one
    changed = briefing_kind(briefer(READ, WRITE, instructions="Be brief."))
    divergence = replay(changed, history).divergence
    assert divergence is not None and "await #0" in divergence, divergence


def test_a_model_that_answers_503_is_asked_again_after_the_retry_delay_and_the_run_completes() -> None:
    failures = [ModelHTTPError(503, "briefing-script", "overloaded")]

    def flaky(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if failures:
            raise failures.pop()
        return script(messages, info)

    kind = briefing_kind(briefer(READ, WRITE, FunctionModel(flaky, model_name="briefing-script")))
    with Kit(kind, answers=_answers()) as kit:
        run_id = kit.start({"topic": "pricing"})
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.RETRY_SCHEDULED and not failures
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED
        assert thaw(run.fact("model_retry:agent:briefer:1").value)["attempts"] == 1  # type: ignore[union-attr]
        assert run.budget.used.model_calls == 4 and kit.executions("briefs.write") == 1 and kit.check() == []


def test_arguments_that_fail_the_tools_model_are_sent_back_to_the_model_and_never_reach_the_ledger() -> None:
    def sloppy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answered = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        retried = [p for p in answered if p.outcome == "retried"]
        returned = [p for p in answered if p.outcome == "success"]
        if returned:
            return ModelResponse(parts=[TextPart(f"wrote {returned[0].content['id']}")])
        if not retried:  # the brief's text is missing
            return ModelResponse(parts=[ToolCallPart("write_brief", {"topic": "pricing"})])
        return ModelResponse(parts=[ToolCallPart("write_brief", {"topic": "pricing", "text": "in short"})])

    agent = LedgerAgent(Agent(FunctionModel(sloppy), name="writer"), [AgentTool(WRITE, "Write.", name="write_brief")])
    kind = briefing_kind(agent, "writing")
    with Kit(kind, answers=_answers()) as kit:
        run_id = kit.start({"topic": "pricing"})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED and thaw(run.acceptance.evidence)["answer"] == "wrote brief-1"  # type: ignore[union-attr]
        assert [a.logical_action for a in run.actions] == ["2:briefs.write"] and kit.executions("briefs.write") == 1
        assert run.budget.used.model_calls == 3


def test_an_agent_that_streams_its_responses_fails_the_run_saying_why() -> None:
    async def follow(ctx: Any, events: Any) -> None:
        async for _ in events:
            pass

    agent = LedgerAgent(Agent(TestModel(), name="streamer", capabilities=[ProcessEventStream(follow)]))

    kind = briefing_kind(agent, "streaming")
    with Kit(kind) as kit:
        run_id = kit.start({"topic": "x"})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.FAILED and "recorded once: use agent.run" in (run.terminal_reason or "")
        assert run.budget.used.model_calls == 0


def test_the_runs_options_reach_the_agent_and_its_instructions_the_model() -> None:
    agent = LedgerAgent(Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart(info.instructions or "")])),
                              name="greeter", deps_type=str, instructions=lambda run: f"Greet {run.deps}."))

    @workflow("greeting", input=Topic, output=Briefed)
    async def greeting(value: Topic, ctx: Context) -> Briefed:
        return Briefed(answer=await agent.run(ctx, "hello", deps=value.topic))

    kind = RunKind("greeting", VERSIONS, greeting, agent.tools, model=agent.model, allowed_actions=agent.allowed_actions)
    with Kit(kind) as kit:
        run_id = kit.start({"topic": "ana"})
        kit.settle()
        assert thaw(kit.snapshot(run_id).acceptance.evidence) == {"answer": "Greet ana."}  # type: ignore[union-attr]
