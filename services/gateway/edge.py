"""What the gateway answers before any route runs: a request body past its route's limit, and HEAD.

A body is counted while it is read: one whose ``Content-Length`` is past the limit is refused (413)
before a byte of it is read, and one sent in chunks is refused as soon as the chunks read pass the
limit, so no route ever holds more than its limit in memory whatever the client sends. A
``Content-Length`` that is not a number is refused (400). HEAD is answered as GET without a body.

A pure ASGI middleware: it wraps ``receive`` and, for HEAD alone, ``send``; every other response,
streamed or not, passes through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

JSON_BYTES = 1024 * 1024
"""The largest JSON body of an operator request: bodies are a reason and a few fields; answers to
questions are the largest, and far below this."""
FORM_BYTES = 64 * 1024
"""The largest console form: a token, a reason, a CSRF token, an answer."""
WEBHOOK_BYTES = 1024 * 1024
"""The largest webhook delivery: providers' events are a few kilobytes; what an event refers to
(logs, diffs) the run reads from its source, not from the delivery."""


@dataclass(frozen=True, slots=True)
class Limit:
    """Requests whose path matches ``path`` (and whose method is ``method``, if given) carry at most
    ``limit`` bytes, named ``what`` in the refusal."""

    path: re.Pattern[str]
    limit: int
    what: str
    method: str | None = None

    def applies(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.path.fullmatch(path) is not None


class BodyTooLarge(HTTPException):
    def __init__(self, limit: Limit) -> None:
        super().__init__(413, f"{limit.what} is at most {limit.limit} bytes")


class Edge:
    """The gateway's app behind the body limits: the first of ``limits`` that applies, else ``default``."""

    def __init__(self, app: ASGIApp, *, limits: Sequence[Limit], default: Limit) -> None:
        self.app = app
        self.limits = tuple(limits)
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope["method"] == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}
            send = _without_body(send)
        limit = next((rule for rule in self.limits if rule.applies(scope["method"], scope["path"])), self.default)
        declared = [value for name, value in scope["headers"] if name == b"content-length"]
        if declared:
            if len(declared) > 1 or not declared[0].isdigit() or len(declared[0]) > 18:
                await _refuse(send, 400, "Content-Length is not a number of bytes")
                return
            if int(declared[0]) > limit.limit:
                await _refuse(send, 413, BodyTooLarge(limit).detail)
                return
        await self.app(scope, _counted(receive, limit), send)


def _counted(receive: Receive, limit: Limit) -> Receive:
    read = 0

    async def counting() -> Message:
        nonlocal read
        message = await receive()
        if message["type"] == "http.request":
            read += len(message.get("body", b""))
            if read > limit.limit:
                raise BodyTooLarge(limit)
        return message
    return counting


def _without_body(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)
    return sending


async def _refuse(send: Send, status: int, error: str) -> None:
    body = orjson.dumps({"error": error})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
