"""A ledger agent's model requests as the run's model calls.

The agent's replay (``LedgerAgent.run``, inside ``decide``) turns each model request into
``ctx.ask_model(purpose, payload)``: the payload is the request as JSON (the messages, the model
settings, the request parameters with the tools' definitions). Answered in the history, the await
returns the recorded response; otherwise it is the step's ``AskModel``, and the worker asks the kind's
model (``RunKind(model=AgentModel(...))``), which makes the request with the agent's Pydantic AI model
and answers with the response as a proposal (action ``respond``, its args the ``ModelResponse`` as
JSON), charged to the run's budget with the response's tokens and cost.

The payload leaves out what differs between two replays of the same request (when each message was
built, the id of the agent's run), so that a replay asking the same thing is recognised as such: the
engine compares each replay's payload with the one recorded, and a request that changed is a
divergence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters

from longrun.errors import ToolUnavailable
from longrun.model import Price, Proposal, ProposalRejected, Usage, status_error
from longrun.pydantic_ai.bridge import ModelCall

RESPOND = "respond"
"""The one action an agent's model proposes: its response."""
VOLATILE = frozenset({"timestamp", "request_timestamp", "run_id", "conversation_id"})
"""Fields of a message (and of its parts) that say when and in which agent run it was built, not what
it says: left out of the request, they take their defaults when it is made."""

_parameters = TypeAdapter(ModelRequestParameters)


def payload_of(call: ModelCall) -> dict[str, Any]:
    """The request as the JSON the run's model call carries."""
    messages = ModelMessagesTypeAdapter.dump_python(call.messages, mode="json")
    return {"messages": [_steady(m) for m in messages], "settings": dict(call.settings or {}),
            "parameters": _parameters.dump_python(call.parameters, mode="json")}


def _steady(message: dict[str, Any]) -> dict[str, Any]:
    parts = [{k: v for k, v in part.items() if k not in VOLATILE} for part in message.get("parts", ())]
    return {**{k: v for k, v in message.items() if k not in VOLATILE}, "parts": parts}


def request_of(payload: Mapping[str, Any]) -> ModelCall:
    messages: list[ModelMessage] = ModelMessagesTypeAdapter.validate_python(payload["messages"])
    return ModelCall(messages, dict(payload["settings"]) or None, _parameters.validate_python(payload["parameters"]))


def response_of(value: Mapping[str, Any]) -> ModelResponse:
    """A recorded proposal's args as the ``ModelResponse`` they were dumped from."""
    (response,) = ModelMessagesTypeAdapter.validate_python([dict(value)])
    assert isinstance(response, ModelResponse)
    return response


class AgentModel:
    """The ``ModelAdapter`` of a kind whose functions run a ``LedgerAgent``: ``model`` makes each request,
    priced at ``price`` (None: the provider's published prices, or nothing for a model without any)."""

    def __init__(self, model: Model, *, price: Price | None = None) -> None:
        self.model = model.model_name
        self._model = model
        self._price = price
        self._tool = f"model:{model.model_name}"

    async def propose(self, *, context: Mapping[str, Any], allowed_actions: Sequence[str]) -> Proposal:
        payload = context.get("request")
        if not isinstance(payload, Mapping):
            raise ProposalRejected(f"the model of an agent's kind answers its agents' requests only; "
                                   f"{context.get('stage')!r} brought none")
        call = request_of(payload)
        try:
            response = await self._model.request(call.messages, call.settings, call.parameters)
        except ModelHTTPError as e:
            raise status_error(self._tool, e.status_code, {}, str(e.body)[:500]) from e
        except ModelAPIError as e:
            raise ToolUnavailable(self._tool, f"{type(e).__name__}: {e}") from e
        (answer,) = ModelMessagesTypeAdapter.dump_python([response], mode="json")
        return Proposal(RESPOND, answer, "", self._usage(response))

    def _usage(self, response: ModelResponse) -> Usage:
        tokens_in, tokens_out = response.usage.input_tokens, response.usage.output_tokens
        if self._price is not None:
            return self._price.usage(tokens_in, tokens_out)
        try:
            cost = float(response.cost().total_price)
        except LookupError:  # a model no price list knows (a local or a test model)
            cost = 0.0
        return Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)
