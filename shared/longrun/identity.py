"""Who calls the operator API, and what they may do.

A request's bearer token names a ``Principal``: the subject who acts (recorded as the actor of
everything they do), their roles and the tenants they see. Three kinds of token are taken
(``Authenticator.from_bearer``):

- a named API token (``longrunctl token create``), kept hashed in PostgreSQL: its name is the
  subject, its roles and tenants those it was created with;
- an OIDC bearer token (a JWT) from the configured issuer (``LONGRUN_OIDC_*``), verified against the
  issuer's JWKS (cached for a while, ``longrun.oidc``), for its audience: ``sub`` is the subject, the configured claims carry roles,
  tenants (``*``: every tenant) and groups;
- a bootstrap token (``LONGRUN_OPERATOR_TOKENS``): an admin of every tenant named ``bootstrap``,
  there so a fresh install can create its first named tokens.

Its roles and what each allows: ``longrun.principals``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

import jwt
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.config import Settings
from longrun.db import tokens
from longrun.oidc import KeySet
from longrun.principals import BOOTSTRAP, Principal, from_claims

logger = logging.getLogger(__name__)

JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric only: the gateway holds no secret an identity provider's tokens could be forged with."""


class Authenticator:
    """Turns a bearer token into a ``Principal``; built once per gateway."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self._engine = engine
        self._settings = settings
        self._bootstrap = tuple(t.encode() for t in settings.operator_tokens or ())
        self._jwks = (KeySet(settings.oidc_jwks_url, ttl=settings.oidc_cache_ttl,
                             refresh_interval=settings.oidc_refresh_interval) if settings.oidc_issuer else None)

    async def from_bearer(self, token: str) -> Principal | None:
        """The principal the token names, or None: unknown, revoked, expired, forged or malformed."""
        if not token:
            return None
        presented = token.encode()
        if any(hmac.compare_digest(presented, t) for t in self._bootstrap):
            return BOOTSTRAP
        if token.startswith(tokens.SECRET_PREFIX):
            async with self._engine.begin() as conn:
                stored = await tokens.find(conn, token)
            if stored is None:
                return None
            return Principal(stored.name, frozenset(stored.roles),
                             None if stored.tenants is None else frozenset(stored.tenants),
                             credential=f"token:{stored.id}")
        if self._jwks is not None and token.count(".") == 2:
            return await asyncio.to_thread(self._verified, token)
        return None

    def _verified(self, token: str) -> Principal | None:
        """A JWT's principal, if the issuer signed it for us and it is in date (blocking: fetches the
        JWKS when the key is not cached)."""
        assert self._jwks is not None
        settings = self._settings
        try:
            key = self._jwks.key(jwt.get_unverified_header(token).get("kid"))
            claims = jwt.decode(token, key.key, algorithms=list(JWT_ALGORITHMS), audience=settings.oidc_audience,
                                issuer=settings.oidc_issuer, options={"require": ["exp", "iss", "aud", "sub"]})
        except jwt.PyJWTError as e:
            logger.info("bearer JWT refused: %s", e)
            return None
        return from_claims(claims, roles_claim=settings.oidc_roles_claim, tenants_claim=settings.oidc_tenants_claim,
                           groups_claim=settings.oidc_groups_claim)
