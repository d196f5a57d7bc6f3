"""Model providers' endpoints in their own wire formats, answering recorded responses and counting the
requests they get (no network): OpenAI's Chat Completions (``POST /v1/chat/completions``) and
Anthropic's Messages (``POST /v1/messages``). The bodies are shaped as the providers answer, with
their error bodies and rate-limit headers. The answers go in order; once used up, the last repeats."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

INPUT_TOKENS, OUTPUT_TOKENS = 1200, 80
"""What every recorded answer reports it used."""
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds before it is sent."""


def proposal(provider: str, action: str, args: dict[str, Any] | None = None, rationale: str = "") -> Answer:
    """A recorded 200 whose text is the proposal's JSON."""
    text = json.dumps({"action": action, "args": args or {}, "rationale": rationale})
    if provider == "openai":
        return Answer(200, {
            "id": "chatcmpl-BQ4aNq6Xx1mQ9r0zS2bXkqAq6Vw1R", "object": "chat.completion", "created": 1745940000,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0392822090",
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []}}],
            "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                      "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
                      "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                    "accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
            "service_tier": "default"}, {"x-request-id": "req_5f3f0c2d9b1e4a7c8d6e2f1a0b9c8d7e"})
    return Answer(200, {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929", "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "service_tier": "standard"}},
        {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"})


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def error(provider: str, status: int, headers: dict[str, str] | None = None) -> Answer:
    """A recorded error answer with its provider's error body."""
    kind = _ERROR_TYPES.get(status, "api_error")
    if provider == "openai":
        body: dict[str, Any] = {"error": {"message": f"recorded {kind}", "type": kind, "param": None,
                                          "code": "rate_limit_exceeded" if status == 429 else None}}
    else:
        body = {"type": "error", "error": {"type": kind, "message": f"recorded {kind}"},
                "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
    return Answer(status, body, headers or {})


class RecordedModel:
    """One provider's endpoint answering ``answers``; ``requests`` holds each request's arrival time,
    headers and body."""

    def __init__(self, provider: str, *answers: Answer) -> None:
        self.provider = provider
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route(PATHS[provider], self._answer, methods=["POST"]),
                                     Route("/healthz", self._healthz, methods=["GET"])])

    async def _answer(self, request: Request) -> JSONResponse:
        self.requests.append({"at": time.time(), "headers": dict(request.headers), "body": await request.json()})
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        await asyncio.sleep(answer.delay)
        return JSONResponse(answer.body, answer.status, headers=answer.headers)

    async def _healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})


PRICE_PER_MTOK = {"input_per_mtok": 2.5, "output_per_mtok": 10.0}
"""What the tests' models cost: $2.50 per million input tokens and $10 per million output tokens."""
CALL_COST = (INPUT_TOKENS * PRICE_PER_MTOK["input_per_mtok"] + OUTPUT_TOKENS * PRICE_PER_MTOK["output_per_mtok"]) / 1e6
"""What a recorded answer costs at that price."""


def model_env(base_url: str, provider: str = "openai", name: str = "fake") -> dict[str, str]:
    """A worker's variables for the model ``name`` of ``provider`` at ``base_url``, priced at ``PRICE_PER_MTOK``."""
    return {"LONGRUN_MODEL": provider, "LONGRUN_MODEL_URL": base_url, "LONGRUN_MODEL_NAME": name,
            "LONGRUN_MODEL_API_KEY": "sk-test", "LONGRUN_MODEL_PRICES": json.dumps({name: PRICE_PER_MTOK})}
