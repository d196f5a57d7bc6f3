"""Model adapters: the providers' SDKs against endpoints in their wire formats over HTTP (the example's
fake LLM, and recorded answers that count the requests), ScriptedModel, the gate."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from longrun_dependency_upgrade.fake_llm import content_reply, create_app, tool_call_reply
from longrun.errors import ToolRejected, ToolUnavailable
from longrun.model import (
    ALLOWED_ACTIONS_MARKER,
    ModelRateLimited,
    Price,
    Proposal,
    ProposalRejected,
    ScriptedModel,
    Usage,
    validate_proposal,
)
from longrun.model_anthropic import AnthropicModel
from longrun.model_openai import OpenAIModel
from tests.model_servers import INPUT_TOKENS, OUTPUT_TOKENS, RecordedModel, error, proposal
from tests.ports import free_port

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


PRICE = Price(input_per_mtok=2.5, output_per_mtok=10.0)
ADAPTERS = {"openai": OpenAIModel, "anthropic": AnthropicModel}


@pytest.fixture
async def adapter_for() -> AsyncIterator:
    opened: list[OpenAIModel | AnthropicModel] = []

    def make(url: str, timeout: float = 2.0, price: Price = PRICE,
             provider: str = "openai") -> OpenAIModel | AnthropicModel:
        base_url = f"{url}/v1" if provider == "openai" else url
        opened.append(ADAPTERS[provider](base_url=base_url, api_key="test-key", model="fake-model", price=price,
                                         timeout=timeout, max_tokens=256))
        return opened[-1]

    yield make
    for model in opened:
        await model.aclose()


async def test_content_json_reply_becomes_a_proposal(llm, adapter_for) -> None:
    url = llm(content_reply(FIX))
    model = adapter_for(url, price=Price(input_per_mtok=1.0, output_per_mtok=2.0))

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


@pytest.fixture
def recorded(serve):
    def start(provider: str, *answers) -> tuple[RecordedModel, str]:
        server = RecordedModel(provider, *answers)
        return server, serve(server.app).url

    return start


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])


@PROVIDERS
async def test_a_provider_s_answer_is_a_proposal_charged_at_its_price(recorded, adapter_for, provider) -> None:
    server, url = recorded(provider, proposal(provider, "run_ci", {"sha": "abc123"}, "fix is committed"))

    answer = await adapter_for(url, provider=provider).propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert (answer.action, dict(answer.args), answer.rationale) == ("run_ci", {"sha": "abc123"}, "fix is committed")
    assert answer.usage == Usage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                                 cost_usd=pytest.approx((INPUT_TOKENS * 2.5 + OUTPUT_TOKENS * 10.0) / 1e6))
    (sent,) = server.requests
    assert sent["body"]["model"] == "fake-model" and sent["body"]["max_tokens"] == 256
    assert json.loads(sent["body"]["messages"][-1]["content"]) == CONTEXT
    assert sent["headers"].get("x-stainless-retry-count") == "0"
    assert "test-key" in (sent["headers"].get("x-api-key"), sent["headers"].get("authorization", "")[7:])
    if provider == "anthropic":
        assert "anthropic-version" in sent["headers"] and ALLOWED_ACTIONS_MARKER in sent["body"]["system"]


async def test_an_anthropic_tool_use_is_a_proposal_its_text_the_rationale(recorded, adapter_for) -> None:
    answer = proposal("anthropic", "unused")
    answer.body["content"] = [{"type": "text", "text": "fix is committed"},
                              {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "run_ci",
                               "input": {"sha": "abc123"}}]
    _, url = recorded("anthropic", answer)

    got = await adapter_for(url, provider="anthropic").propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert (got.action, dict(got.args), got.rationale) == ("run_ci", {"sha": "abc123"}, "fix is committed")


@PROVIDERS
@pytest.mark.parametrize("headers, wait", [({"retry-after": "7"}, 7.0), ({"retry-after-ms": "1500"}, 1.5),
                                           ({"x-ratelimit-reset-requests": "6m0s"}, 360.0)])
async def test_a_429_is_rate_limited_for_what_the_server_asked_and_not_retried_by_the_sdk(
        recorded, adapter_for, provider, headers, wait) -> None:
    server, url = recorded(provider, error(provider, 429, headers), proposal(provider, "run_ci"))

    with pytest.raises(ModelRateLimited) as limited:
        await adapter_for(url, provider=provider).propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert limited.value.retry_after == pytest.approx(wait)
    assert len(server.requests) == 1


async def test_anthropic_s_rate_limit_reset_time_says_how_long_a_429_waits(recorded, adapter_for) -> None:
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    _, url = recorded("anthropic", error("anthropic", 429, {"anthropic-ratelimit-tokens-reset": reset}))

    with pytest.raises(ModelRateLimited) as limited:
        await adapter_for(url, provider="anthropic").propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert 28 <= limited.value.retry_after <= 30


@PROVIDERS
@pytest.mark.parametrize("status", [500, 503, 529, 408])
async def test_a_server_error_or_overload_is_unavailable_and_asked_once(recorded, adapter_for, provider,
                                                                         status) -> None:
    server, url = recorded(provider, error(provider, status), proposal(provider, "run_ci"))

    with pytest.raises(ToolUnavailable) as unavailable:
        await adapter_for(url, provider=provider).propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert not isinstance(unavailable.value, ModelRateLimited) and f"HTTP {status}" in str(unavailable.value)
    assert len(server.requests) == 1


@PROVIDERS
async def test_no_server_or_no_answer_in_time_is_unavailable(recorded, adapter_for, provider) -> None:
    refused = adapter_for(f"http://127.0.0.1:{free_port()}", provider=provider)
    with pytest.raises(ToolUnavailable, match="APIConnectionError"):
        await refused.propose(context=CONTEXT, allowed_actions=ALLOWED)

    _, url = recorded(provider, dataclasses.replace(proposal(provider, "run_ci"), delay=0.6))
    with pytest.raises(ToolUnavailable, match="no answer within 0.2s|APITimeoutError"):
        await adapter_for(url, timeout=0.2, provider=provider).propose(context=CONTEXT, allowed_actions=ALLOWED)


@PROVIDERS
@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refused_request_is_rejected_not_retried(recorded, adapter_for, provider, status) -> None:
    server, url = recorded(provider, error(provider, status), proposal(provider, "run_ci"))

    with pytest.raises(ToolRejected) as rejected:
        await adapter_for(url, provider=provider).propose(context=CONTEXT, allowed_actions=ALLOWED)

    assert rejected.value.status == status and len(server.requests) == 1


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
