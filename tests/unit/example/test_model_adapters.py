"""Model adapters: OpenAICompatibleModel against the fake LLM over HTTP, ScriptedModel, the gate."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from longrun_dependency_upgrade.fake_llm import content_reply, create_app, error_reply, tool_call_reply
from longrun.errors import ToolRejected, ToolUnavailable
from longrun.model import (
    ALLOWED_ACTIONS_MARKER,
    OpenAICompatibleModel,
    Proposal,
    ProposalRejected,
    ScriptedModel,
    Usage,
    validate_proposal,
)

ALLOWED = ["edit_files", "run_ci", "request_approval"]
CONTEXT = {
    "goal": "upgrade payments-sdk to 3.0",
    "stage": "fix_ci",
    "stage_attempt": 0,
    "facts": {"ci_run": 1, "failing_test": "PaymentClientTest.testRefund"},
    "remaining_budget": {"usd": 4.5},
}
FIX = {"action": "edit_files", "args": {"files": {"payments/client.py": "create_charge"}},
       "rationale": "Client.charge was removed; use Client.create_charge."}


@pytest.fixture
def llm(serve):
    def start(*replies):
        return serve(create_app(replies)).url

    return start


@pytest.fixture
async def adapter_for() -> AsyncIterator:
    opened: list[OpenAICompatibleModel] = []

    def make(url: str, timeout: float = 2.0, **prices: float) -> OpenAICompatibleModel:
        opened.append(OpenAICompatibleModel(url, "test-key", "fake-model", timeout, **prices))
        return opened[-1]

    yield make
    for model in opened:
        await model.aclose()


async def test_content_json_reply_becomes_a_proposal(llm, adapter_for) -> None:
    url = llm(content_reply(FIX))
    model = adapter_for(url, usd_per_input_token=1e-6, usd_per_output_token=2e-6)

    proposal = await model.propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert validate_proposal(proposal, ALLOWED) is proposal
    assert (proposal.action, dict(proposal.args), proposal.rationale) == (FIX["action"], FIX["args"],
                                                                          FIX["rationale"])
    assert proposal.usage.input_tokens > 0 and proposal.usage.output_tokens > 0
    expected_cost = proposal.usage.input_tokens * 1e-6 + proposal.usage.output_tokens * 2e-6
    assert proposal.usage.cost_usd == pytest.approx(expected_cost)

    async with httpx.AsyncClient() as http:
        seen = (await http.get(f"{url}/_requests")).json()
    assert len(seen) == 1
    system, user = seen[0]["messages"]
    assert system["role"] == "system"
    assert f"{ALLOWED_ACTIONS_MARKER}{json.dumps(ALLOWED)}" in system["content"]
    assert json.loads(user["content"]) == CONTEXT
    assert seen[0]["response_format"] == {"type": "json_object"} and seen[0]["model"] == "fake-model"


async def test_tool_call_reply_becomes_a_proposal(llm, adapter_for) -> None:
    model = adapter_for(llm(tool_call_reply("run_ci", {"sha": "abc123"}, rationale="fix is committed")))

    proposal = await model.propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert (proposal.action, dict(proposal.args), proposal.rationale) == ("run_ci", {"sha": "abc123"},
                                                                          "fix is committed")


async def test_json_in_a_markdown_fence_is_accepted(llm, adapter_for) -> None:
    model = adapter_for(llm(content_reply(f"```json\n{json.dumps(FIX)}\n```")))

    assert (await model.propose(context=CONTEXT, allowed_actions=ALLOWED)).args == FIX["args"]


async def test_exhausted_script_proposes_first_allowed_action(llm, adapter_for) -> None:
    model = adapter_for(llm())

    proposal = await model.propose(context=CONTEXT, allowed_actions=["request_approval", "run_ci"])

    assert proposal.action == "request_approval" and dict(proposal.args) == {}


async def test_unparseable_reply_is_rejected(llm, adapter_for) -> None:
    model = adapter_for(llm(content_reply("I think you should run CI again."),
                            content_reply({"args": {}, "rationale": "no action"})))

    with pytest.raises(ProposalRejected, match="not JSON"):
        await model.propose(context=CONTEXT, allowed_actions=ALLOWED)
    with pytest.raises(ProposalRejected, match='string "action"'):
        await model.propose(context=CONTEXT, allowed_actions=ALLOWED)


async def test_disallowed_action_or_non_object_args_never_pass_the_gate(llm, adapter_for) -> None:
    model = adapter_for(llm(content_reply({"action": "merge_to_main", "args": {}, "rationale": "ship"}),
                            content_reply({"action": "run_ci", "args": ["abc"], "rationale": "x"})))

    disallowed = await model.propose(context=CONTEXT, allowed_actions=ALLOWED)
    with pytest.raises(ProposalRejected) as rejected:
        validate_proposal(disallowed, ALLOWED)
    assert rejected.value.action == "merge_to_main"
    with pytest.raises(ProposalRejected, match="JSON object"):
        validate_proposal(await model.propose(context=CONTEXT, allowed_actions=ALLOWED), ALLOWED)


async def test_transport_failures_map_to_transient_or_definite_errors(llm, adapter_for) -> None:
    url = llm(error_reply(503), error_reply(401), content_reply(FIX, delay_seconds=0.6))
    model, impatient = adapter_for(url), adapter_for(url, timeout=0.2)

    with pytest.raises(ToolUnavailable):
        await model.propose(context=CONTEXT, allowed_actions=ALLOWED)
    with pytest.raises(ToolRejected) as rejected:
        await model.propose(context=CONTEXT, allowed_actions=ALLOWED)
    assert rejected.value.status == 401
    with pytest.raises(ToolUnavailable, match="Timeout"):
        await impatient.propose(context=CONTEXT, allowed_actions=ALLOWED)


SCRIPT = {
    "fix_ci": [FIX, {"action": "run_ci", "args": {}, "rationale": "verify the fix"}],
    "approval": [{"action": "request_approval", "args": {"reviewer": "lead"}, "rationale": "CI green"}],
}


async def test_scripted_model_is_deterministic_from_the_context_alone() -> None:
    usage = Usage(input_tokens=10, output_tokens=5, cost_usd=0.01)
    first = await ScriptedModel(SCRIPT, usage=usage).propose(context=CONTEXT, allowed_actions=ALLOWED)
    # A fresh instance (a restarted worker) with the same context gives the same answer.
    again = await ScriptedModel(SCRIPT, usage=usage).propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert first == again == Proposal(FIX["action"], FIX["args"], FIX["rationale"], usage)


async def test_scripted_model_follows_stage_attempts() -> None:
    model = ScriptedModel(SCRIPT)

    async def answer(stage: str, attempt: int) -> str:
        proposal = await model.propose(context={**CONTEXT, "stage": stage, "stage_attempt": attempt},
                                       allowed_actions=ALLOWED)
        return proposal.action

    assert [await answer("fix_ci", n) for n in (0, 1, 5)] == ["edit_files", "run_ci", "run_ci"]
    assert await answer("approval", 0) == "request_approval"
    with pytest.raises(ProposalRejected, match="no scripted proposal"):
        await answer("deploy", 0)


async def test_scripted_proposals_cannot_change_the_script() -> None:
    model = ScriptedModel(SCRIPT)
    proposal = await model.propose(context=CONTEXT, allowed_actions=ALLOWED)
    proposal.args["files"]["payments/client.py"] = "tampered"

    assert (await model.propose(context=CONTEXT, allowed_actions=ALLOWED)).args == FIX["args"]
