"""OpenAI's Chat Completions through the official ``openai`` SDK (also any server speaking them: vLLM,
llama.cpp). The SDK makes no retry of its own (``max_retries=0``): a call that fails is retried by the
run's durable retry policy only, and a 429's wait feeds the model's rate limits."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import openai

from longrun.errors import ToolRejected, ToolUnavailable
from longrun.model import Price, Proposal, ProposalRejected, answer_of, messages, proposal_of, status_error


class OpenAIModel:
    """A Chat Completions endpoint asked for a JSON proposal, its answer priced at ``price``."""

    def __init__(self, *, base_url: str | None, api_key: str, model: str, price: Price, timeout: float,
                 max_tokens: int | None = None) -> None:
        """``base_url``: None for OpenAI's own; ``timeout``: seconds the whole call may take (its
        start-to-close); ``max_tokens``: the most an answer may use, sent with each call (None: the server's)."""
        self.model = model
        self.max_tokens = max_tokens
        self._tool = f"model:{model}"
        self._price = price
        self._timeout = timeout
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)

    async def aclose(self) -> None:
        await self._client.close()

    async def propose(self, *, context: Mapping[str, Any], allowed_actions: Sequence[str]) -> Proposal:
        request: dict[str, Any] = {"model": self.model, "temperature": 0, "response_format": {"type": "json_object"},
                                   "messages": messages(context, allowed_actions)}
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        try:
            # The SDK's timeout bounds each read; this bounds the whole call, however the answer trickles in.
            async with asyncio.timeout(self._timeout):
                completion = await self._client.chat.completions.create(**request)
        except TimeoutError as exc:
            raise ToolUnavailable(self._tool, f"no answer within {self._timeout:g}s") from exc
        except openai.OpenAIError as exc:
            raise model_error(self._tool, exc) from exc
        if not completion.choices:
            raise ProposalRejected("the chat completion has no choices")
        reported = completion.usage
        tokens_in, tokens_out = (reported.prompt_tokens, reported.completion_tokens) if reported else (0, 0)
        usage = self._price.usage(tokens_in, tokens_out)
        return proposal_of(answer_of(completion.choices[0].message.model_dump()), usage)


def model_error(tool: str, error: openai.OpenAIError) -> ToolUnavailable | ToolRejected | ProposalRejected:
    """What an SDK error is to the runtime: an HTTP answer by its status (``status_error``), no answer
    (refused, reset, timed out) unavailable, an answer the SDK could not read a rejected proposal."""
    if isinstance(error, openai.APIStatusError):
        return status_error(tool, error.status_code, error.response.headers, str(error.message)[:500])
    if isinstance(error, openai.APIConnectionError):
        return ToolUnavailable(tool, f"{type(error).__name__}: {error}")
    return ProposalRejected(f"unreadable answer from {tool}: {error}")
