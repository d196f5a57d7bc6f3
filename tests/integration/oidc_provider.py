"""A small OIDC identity provider for tests, served from the test's own event loop: discovery, an
authorization endpoint that signs in one configured user at once (no login page), a token endpoint
that checks the client's credentials, the redirect URI and the PKCE verifier, and the JWKS its
RS256 access tokens are verified with."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.ports import free_port

KID = "test-key-1"


@dataclass
class Provider:
    url: str
    client_id: str
    client_secret: str
    audience: str
    user: dict[str, Any]
    """The claims of whoever signs in (``sub``, roles, tenants)."""
    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(public_exponent=65537,
                                                                                   key_size=2048))
    codes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Codes given out, not yet exchanged: their redirect URI and PKCE challenge."""
    kid: str = KID
    """The id of ``key``, the only key the JWKS publishes."""
    claimed_issuer: str | None = None
    """The issuer the discovery document names, when it is not ``url`` (an impostor's document)."""
    fetches: dict[str, int] = field(default_factory=lambda: {"discovery": 0, "jwks": 0})
    """How often the discovery document and the JWKS were served."""

    def rotate(self) -> None:
        """A new signing key under a new id; the JWKS publishes it alone from now on."""
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = f"test-key-{secrets.token_hex(4)}"

    def sign(self, claims: dict[str, Any], *, kid: str | None = None) -> str:
        """An access token for ``claims`` (issuer, audience and a 5-minute life added), signed with ``key``."""
        now = int(time.time())
        return jwt.encode({"iss": self.url, "aud": self.audience, "iat": now, "exp": now + 300, **claims}, self.key,
                          algorithm="RS256", headers={"kid": kid or self.kid})

    def gateway_env(self) -> dict[str, str]:
        return {"LONGRUN_OIDC_ISSUER": self.url, "LONGRUN_OIDC_AUDIENCE": self.audience,
                "LONGRUN_OIDC_JWKS_URL": f"{self.url}/jwks", "LONGRUN_OIDC_CLIENT_ID": self.client_id,
                "LONGRUN_OIDC_CLIENT_SECRET": self.client_secret}

    def app(self) -> Starlette:
        async def discovery(request: Request) -> Response:
            self.fetches["discovery"] += 1
            return JSONResponse({"issuer": self.claimed_issuer or self.url, "authorization_endpoint": f"{self.url}/authorize",
                                 "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks"})

        async def authorize(request: Request) -> Response:
            q = request.query_params
            if q.get("client_id") != self.client_id or q.get("response_type") != "code" or \
                    q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
                return JSONResponse({"error": "invalid_request"}, status_code=400)
            code = secrets.token_urlsafe(16)
            self.codes[code] = (q["redirect_uri"], q["code_challenge"])
            return RedirectResponse(f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}",
                                    status_code=302)

        async def token(request: Request) -> Response:
            form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
            given = self.codes.pop(str(form.get("code")), None)
            verifier = str(form.get("code_verifier", ""))
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
            if given is None or form.get("grant_type") != "authorization_code" or \
                    (form.get("client_id"), form.get("client_secret")) != (self.client_id, self.client_secret) or \
                    given != (form.get("redirect_uri"), challenge):
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            return JSONResponse({"access_token": self.sign(self.user), "token_type": "Bearer", "expires_in": 300})

        async def jwks(request: Request) -> Response:
            self.fetches["jwks"] += 1
            public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
            return JSONResponse({"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]})

        return Starlette(routes=[Route("/.well-known/openid-configuration", discovery), Route("/authorize", authorize),
                                 Route("/token", token, methods=["POST"]), Route("/jwks", jwks)])


@asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[Provider]:
    port = free_port()
    provider = Provider(url=f"http://127.0.0.1:{port}", **settings)
    server = uvicorn.Server(uvicorn.Config(provider.app(), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield provider
    finally:
        server.should_exit = True
        await task
