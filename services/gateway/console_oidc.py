"""Signing in to the web console at the OIDC issuer: the authorization-code flow with PKCE.

The console sends the browser to the issuer's authorization endpoint with a fresh ``state`` and a
PKCE challenge, both remembered in a short-lived sealed cookie; the issuer sends it back to
``/console/oidc/callback`` with a code, which the gateway exchanges (with the PKCE verifier and the
client's credentials) for an access token, verified like any bearer token of the operator API
(``longrun.identity``). The console session keeps the principal it names, never the token, and ends
when the token expires. The endpoints come from the issuer's discovery document, cached, and taken only
when it names the configured issuer.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

from longrun.config import Settings
from longrun.oidc import Discovery, DiscoveryFailed
from longrun.services.gateway import console_session as sessions

COOKIE = "longrun_console_oidc"
PATIENCE = 600
"""Seconds an operator has at the issuer before the sign-in they started there is void."""
TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Attempt:
    """One sign-in at the issuer, between leaving for it and coming back."""

    state: str
    verifier: str

    @staticmethod
    def new() -> Attempt:
        return Attempt(secrets.token_urlsafe(24), secrets.token_urlsafe(48))

    def challenge(self) -> str:
        digest = hashlib.sha256(self.verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def seal(key: str, attempt: Attempt, now: float) -> str:
    return sessions.seal_values(key, "oidc", [attempt.state, attempt.verifier, int(now) + PATIENCE])


def unseal(key: str, raw: str | None, now: float) -> Attempt | None:
    """The sign-in the cookie ``raw`` remembers, or None if it is missing, altered or too old."""
    values = sessions.unseal_values(key, "oidc", raw)
    if values is None or len(values) != 3 or values[2] <= now:
        return None
    return Attempt(values[0], values[1])


class SignInFailed(Exception):
    """The issuer could not be asked, or did not give an access token; the message says which."""


def offered(settings: Settings) -> bool:
    return bool(settings.oidc_issuer and settings.oidc_client_id)


async def endpoints(settings: Settings) -> dict[str, Any]:
    """The issuer's discovery document, cached and checked to name the configured issuer (``longrun.oidc``)."""
    found = _discovery.get(settings.oidc_issuer)
    if found is None or found.ttl != settings.oidc_cache_ttl:
        found = _discovery[settings.oidc_issuer] = Discovery(settings.oidc_issuer, ttl=settings.oidc_cache_ttl)
    try:
        return await found.document()
    except DiscoveryFailed as e:
        raise SignInFailed(str(e)) from e


_discovery: dict[str, Discovery] = {}
"""The gateway's one cache of each issuer's discovery document."""


def authorization_url(endpoint: str, settings: Settings, attempt: Attempt, redirect_uri: str) -> str:
    query = urlencode({"response_type": "code", "client_id": settings.oidc_client_id, "scope": "openid",
                       "redirect_uri": redirect_uri, "state": attempt.state,
                       "code_challenge": attempt.challenge(), "code_challenge_method": "S256"})
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


async def access_token(endpoint: str, settings: Settings, attempt: Attempt, code: str, redirect_uri: str) -> str:
    """The access token the issuer gives for ``code``."""
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "client_id": settings.oidc_client_id, "code_verifier": attempt.verifier}
    if settings.oidc_client_secret:
        form["client_secret"] = settings.oidc_client_secret
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            answer = await http.post(endpoint, data=form)
        token = answer.json().get("access_token") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise SignInFailed(f"the issuer's token endpoint could not be asked: {e}") from e
    if not isinstance(token, str):
        raise SignInFailed(f"the issuer gave no access token (HTTP {answer.status_code}: {answer.text[:200]})")
    return token
