"""The security headers on every answer of the web console, pages, redirects and errors alike.

The Content-Security-Policy allows nothing but the console's own origin, and its one inline style
and one inline script only with the nonce drawn for the request (``request.state.csp_nonce``, which
the templates put on them), so markup injected into a page runs no script and loads nothing.
``connect-src 'self'`` lets the run page poll its live view (and would let server-sent events in).
Framing is refused (clickjacking), content types are not sniffed, no referrer leaves a page (a
run's URL names it), and no page is cached (each shows what a signed-in operator may see).
A pure ASGI middleware: it adds headers to the response's start and passes the body through.
"""

from __future__ import annotations

import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NONCE_BYTES = 16


def policy(nonce: str) -> str:
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src 'self'; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


HEADERS = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer", "cache-control": "no-store",
           "x-frame-options": "DENY"}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(NONCE_BYTES)
        scope.setdefault("state", {})["csp_nonce"] = nonce

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["content-security-policy"] = policy(nonce)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)
        await self.app(scope, receive, sending)
