"""Anthropic's Messages API through the official ``anthropic`` SDK. The SDK makes no retry of its own
(``max_retries=0``): a call that fails is retried by the run's durable retry policy only, and a 429's
wait feeds the model's rate limits."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import anthropic

from longrun.errors import ToolRejected, ToolUnavailable
from longrun.model import Price, Proposal, ProposalRejected, answer_of, messages, proposal_of, status_error


class AnthropicModel:
    """A Messages endpoint asked for a JSON proposal, its answer priced at ``price``."""

    def __init__(self, *, base_url: str | None, api_key: str, model: str, price: Price, timeout: float,
                 max_tokens: int) -> None:
        """``base_url``: None for Anthropic's own; ``timeout``: seconds the whole call may take (its
        start-to-close); ``max_tokens``: the most an answer may use (the Messages API requires it)."""
        self.model = model
        self.max_tokens = max_tokens
        self._tool = f"model:{model}"
        self._price = price
        self._timeout = timeout
        self._client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)

    async def aclose(self) -> None:
        await self._client.close()

    async def propose(self, *, context: Mapping[str, Any], allowed_actions: Sequence[str]) -> Proposal:
        system, *conversation = messages(context, allowed_actions)
        try:
            # The SDK's timeout bounds each read; this bounds the whole call, however the answer trickles in.
            async with asyncio.timeout(self._timeout):
                reply = await self._client.messages.create(model=self.model, max_tokens=self.max_tokens,
                                                           system=system["content"], messages=conversation)
        except TimeoutError as exc:
            raise ToolUnavailable(self._tool, f"no answer within {self._timeout:g}s") from exc
        except anthropic.AnthropicError as exc:
            raise model_error(self._tool, exc) from exc
        usage = self._price.usage(reply.usage.input_tokens, reply.usage.output_tokens)
        return proposal_of(answer_of(_as_message(reply.content)), usage)


def _as_message(blocks: Sequence[Any]) -> dict[str, Any]:
    """A reply's content blocks as a chat message: its text, and its first tool use as a tool call."""
    text = "".join(block.text for block in blocks if block.type == "text")
    calls = [{"function": {"name": block.name, "arguments": block.input}} for block in blocks
             if block.type == "tool_use"]
    return {"content": text, "tool_calls": calls[:1]}


def model_error(tool: str, error: anthropic.AnthropicError) -> ToolUnavailable | ToolRejected | ProposalRejected:
    """What an SDK error is to the runtime: an HTTP answer by its status (``status_error``; 529
    overloaded is a 5xx), no answer (refused, reset, timed out) unavailable, an answer the SDK could not
    read a rejected proposal."""
    if isinstance(error, anthropic.APIStatusError):
        return status_error(tool, error.status_code, error.response.headers, str(error.message)[:500])
    if isinstance(error, anthropic.APIConnectionError):
        return ToolUnavailable(tool, f"{type(error).__name__}: {error}")
    return ProposalRejected(f"unreadable answer from {tool}: {error}")
