"""Model adapters: how a run asks a model for its next step, and the gate every answer passes.

A model only proposes. Its context is the JSON the runtime builds from structured state
(goal, stage, confirmed facts, actions and receipts, open questions, allowed next steps,
remaining budget), never chat memory, and its answer is a ``Proposal`` that the runtime
must pass through ``validate_proposal`` before anything acts on it. Adapters parse; they
do not judge, so a scripted model can deliberately propose something the gate refuses.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from longrun.errors import DomainError, ErrorCode, ToolRejected, ToolUnavailable

# The system prompt carries the allowed actions on one machine-readable line after this.
ALLOWED_ACTIONS_MARKER = "Allowed actions (JSON): "

_SYSTEM_PROMPT = """\
You are the planning step of a durable agent run. Propose exactly one next action; the \
runtime validates it and performs it, you never act yourself.
Use only the JSON context in the user message: goal, stage, confirmed facts, actions and \
their receipts, open questions, allowed next steps and remaining budget.
Answer with one JSON object and nothing else: \
{"action": <one of the allowed actions>, "args": {<a JSON object>}, "rationale": <one sentence>}.
"""


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class Proposal:
    action: str
    args: Mapping[str, Any]
    rationale: str
    usage: Usage


class ProposalRejected(DomainError):
    """The model's answer is unusable or not allowed here; nothing acts on it."""

    code = ErrorCode.PROPOSAL_REJECTED

    def __init__(self, reason: str, action: str | None = None) -> None:
        self.reason = reason
        self.action = action
        super().__init__(f"proposal rejected: {reason}")


class ModelRateLimited(ToolUnavailable):
    """The model server answered 429: too many requests or tokens for now."""

    def __init__(self, tool: str, message: str, retry_after: float | None) -> None:
        super().__init__(tool, message)
        self.retry_after = retry_after
        """Seconds the server asked for nothing more (``Retry-After``, or its rate-limit reset headers)."""


@dataclass(frozen=True)
class Price:
    """What a model's tokens cost, in US dollars per million (the providers' price lists' unit)."""

    input_per_mtok: float
    output_per_mtok: float

    def usage(self, input_tokens: int, output_tokens: int) -> Usage:
        """The usage of a call the provider reported these tokens for, at this price."""
        cost = (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1_000_000
        return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost)


RETRIED_STATUSES = frozenset({408, 409})
"""Answers below 500 that say "not now" rather than "never": a timeout and a conflict of the provider's."""


def status_error(tool: str, status: int, headers: Mapping[str, str], detail: str) -> ToolUnavailable | ToolRejected:
    """A model's HTTP error answer under the effect-kind rules. A model call is read-like (asking again
    changes nothing in the world): a 429 waits what the server asked (``ModelRateLimited``), a 5xx (529
    overloaded too), 408 or 409 is unavailable and retried by the run's retry policy, any other 4xx is
    a definite refusal that asking again will not change."""
    if status == 429:
        return ModelRateLimited(tool, f"HTTP 429: {detail}", retry_after(headers))
    if status >= 500 or status in RETRIED_STATUSES:
        return ToolUnavailable(tool, f"HTTP {status}: {detail}")
    return ToolRejected(tool, status, detail)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429 asks to wait: ``retry-after-ms``, else ``Retry-After`` (seconds or an HTTP date), else
    the longest of the providers' reset headers: OpenAI's ``x-ratelimit-reset-requests`` / ``-tokens``
    durations (``1s``, ``6m0s``, ``250ms``), Anthropic's ``anthropic-ratelimit-*-reset`` times (RFC 3339);
    None if none says."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            try:
                return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
            except (TypeError, ValueError):
                pass
    resets = [_reset_seconds(headers[h]) for h in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
              if h in headers]
    resets += [_reset_at(headers[h]) for h in _ANTHROPIC_RESETS if h in headers]
    known = [r for r in resets if r is not None]
    return max(known) if known else None


_ANTHROPIC_RESETS = tuple(f"anthropic-ratelimit-{limit}-reset"
                          for limit in ("requests", "tokens", "input-tokens", "output-tokens"))


def _reset_at(raw: str) -> float | None:
    try:
        return max(0.0, datetime.fromisoformat(raw.strip()).timestamp() - time.time())
    except ValueError:
        return None


def _reset_seconds(raw: str) -> float | None:
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", raw.strip())
    if not parts or "".join(n + u for n, u in parts) != raw.strip():
        return None
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def messages(context: Mapping[str, Any], allowed_actions: Sequence[str]) -> list[dict[str, str]]:
    """The chat messages a call sends for ``context``."""
    system = _SYSTEM_PROMPT + ALLOWED_ACTIONS_MARKER + json.dumps(list(allowed_actions))
    return [{"role": "system", "content": system}, {"role": "user", "content": json.dumps(context, sort_keys=True)}]


MESSAGE_OVERHEAD_TOKENS = 8
"""Tokens a chat template adds around each message, at most (role markers, separators)."""


def input_tokens_bound(context: Mapping[str, Any], allowed_actions: Sequence[str]) -> int:
    """At most the input tokens a call for ``context`` uses: its messages' UTF-8 bytes (a byte-level
    tokenizer's token covers at least one byte) plus the template's tokens around each message."""
    sent = messages(context, allowed_actions)
    return sum(len(m["content"].encode()) + MESSAGE_OVERHEAD_TOKENS for m in sent) + MESSAGE_OVERHEAD_TOKENS


class ModelAdapter(Protocol):
    async def propose(self, *, context: Mapping[str, Any], allowed_actions: Sequence[str]) -> Proposal: ...


def validate_proposal(proposal: Proposal, allowed_actions: Sequence[str]) -> Proposal:
    """Return ``proposal`` if the runtime may act on it, else raise ``ProposalRejected``."""
    action = proposal.action
    if not isinstance(action, str) or action not in allowed_actions:
        raise ProposalRejected(f"action {action!r} is not one of {list(allowed_actions)}", str(action))
    if not isinstance(proposal.args, Mapping) or not all(isinstance(k, str) for k in proposal.args):
        raise ProposalRejected(f"args must be a JSON object, got {type(proposal.args).__name__}", action)
    try:
        json.dumps(proposal.args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProposalRejected(f"args are not JSON-compatible: {exc}", action) from exc
    if not isinstance(proposal.rationale, str):
        raise ProposalRejected("rationale must be a string", action)
    return proposal


def proposal_of(answer: Any, usage: Usage) -> Proposal:
    # Only what is needed to build a Proposal is checked here; validate_proposal judges the rest.
    if not isinstance(answer, Mapping) or not isinstance(answer.get("action"), str):
        raise ProposalRejected('the answer must be a JSON object with a string "action"')
    return Proposal(answer["action"], answer.get("args", {}), answer.get("rationale", ""), usage)


class ScriptedModel:
    """Deterministic stand-in: the n-th scripted proposal for the context's stage.

    The cursor is ``context["stage_attempt"]`` (how often the stage was already answered),
    not state in this object, so a restarted worker rebuilding the same context gets the
    same proposal. Attempts past the end of a stage's script repeat its last entry.
    """

    def __init__(
        self,
        script: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        usage: Usage = Usage(input_tokens=200, output_tokens=50, cost_usd=0.001),
    ) -> None:
        self._script = {stage: copy.deepcopy(list(entries)) for stage, entries in script.items()}
        self._usage = usage

    async def propose(self, *, context: Mapping[str, Any], allowed_actions: Sequence[str]) -> Proposal:
        stage = context.get("stage")
        entries = self._script.get(stage) if isinstance(stage, str) else None
        if not entries:
            raise ProposalRejected(f"no scripted proposal for stage {stage!r}")
        attempt = context.get("stage_attempt", 0)
        if not isinstance(attempt, int) or attempt < 0:
            raise ProposalRejected(f"stage_attempt must be a non-negative integer, got {attempt!r}")
        # A copy, so a caller mutating its proposal's args cannot change the script.
        return proposal_of(copy.deepcopy(entries[min(attempt, len(entries) - 1)]), self._usage)


def answer_of(message: Mapping[str, Any]) -> Any:
    """The ``{"action", "args", "rationale"}`` object in a reply, as content or as a tool call."""
    calls = message.get("tool_calls") or []
    if calls:
        function = calls[0].get("function") or {}
        arguments = function.get("arguments", {})
        args = _decode(arguments, "tool call arguments") if isinstance(arguments, str) else arguments
        return {"action": function.get("name"), "args": args, "rationale": message.get("content") or ""}
    content = message.get("content")
    if not isinstance(content, str):
        raise ProposalRejected("the reply has neither text content nor a tool call")
    # Some models wrap JSON in a Markdown fence even when asked not to.
    text = content.strip().removeprefix("```json").removeprefix("```").removesuffix("```")
    return _decode(text, "content")


def _decode(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ProposalRejected(f"{what} is not JSON: {text[:200]!r}") from exc
