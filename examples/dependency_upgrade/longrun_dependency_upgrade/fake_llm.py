"""A fake OpenAI-compatible chat-completions server for the tests and the demo.

``POST /v1/chat/completions`` answers from a script of canned replies, in order. A
script entry is ``{"message": <assistant message>}`` (content or ``tool_calls``), or
``{"status": <HTTP status>}`` to fail, either with an optional ``"delay_seconds"``;
``content_reply``, ``tool_call_reply`` and ``error_reply`` build them. Once the script
is used up it proposes the first allowed action named in the system prompt. Every
request body is recorded for ``GET /_requests``; ``POST /_script`` replaces the script.

Run it with ``python -m longrun_dependency_upgrade.fake_llm --port 8082 [--script replies.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from longrun.model import ALLOWED_ACTIONS_MARKER


def content_reply(content: Mapping[str, Any] | str, *, delay_seconds: float = 0.0) -> dict[str, Any]:
    """A reply whose text is ``content``, JSON-encoded unless it is already text."""
    text = content if isinstance(content, str) else json.dumps(content)
    return {"message": {"role": "assistant", "content": text}, "delay_seconds": delay_seconds}


def tool_call_reply(name: str, arguments: Mapping[str, Any], rationale: str = "") -> dict[str, Any]:
    call = {"id": "call_0", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"message": {"role": "assistant", "content": rationale or None, "tool_calls": [call]}}


def error_reply(status: int, *, delay_seconds: float = 0.0) -> dict[str, Any]:
    return {"status": status, "delay_seconds": delay_seconds}


def _allowed_actions(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    for message in messages:
        content = message.get("content")
        if message.get("role") == "system" and isinstance(content, str) and ALLOWED_ACTIONS_MARKER in content:
            line = content.rsplit(ALLOWED_ACTIONS_MARKER, 1)[1].splitlines()[0]
            return [str(action) for action in json.loads(line)]
    return []


def _tokens(text: str) -> int:
    # Roughly four characters a token: deterministic, and good enough for budget tests.
    return max(1, len(text) // 4)


def create_app(replies: Sequence[Mapping[str, Any]] = ()) -> Starlette:
    script: list[Mapping[str, Any]] = list(replies)
    seen: list[dict[str, Any]] = []

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        messages = body.get("messages") or []
        entry: Mapping[str, Any]
        if script:
            entry = script.pop(0)
        else:
            allowed = _allowed_actions(messages)
            if not allowed:
                return JSONResponse({"error": {"message": "script used up, no allowed actions"}}, 400)
            entry = content_reply({"action": allowed[0], "args": {},
                                   "rationale": "fake LLM: first allowed action"})
        await asyncio.sleep(entry.get("delay_seconds", 0.0))
        if entry.get("status", 200) != 200:
            return JSONResponse({"error": {"message": "scripted failure"}}, entry["status"])
        message = entry["message"]
        prompt_tokens = _tokens(json.dumps(messages))
        completion_tokens = _tokens(json.dumps(message))
        return JSONResponse({
            "id": f"chatcmpl-fake-{len(seen)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    async def requests(request: Request) -> JSONResponse:
        return JSONResponse(seen)

    async def set_script(request: Request) -> JSONResponse:
        script[:] = (await request.json())["replies"]
        return JSONResponse({"replies": len(script)})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/_requests", requests, methods=["GET"]),
        Route("/_script", set_script, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m longrun_dependency_upgrade.fake_llm", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--script", type=Path, help="JSON file holding a list of script entries")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    replies = json.loads(args.script.read_text()) if args.script else []
    uvicorn.run(create_app(replies), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
