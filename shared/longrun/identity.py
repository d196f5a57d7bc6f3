"""Who calls the operator API, and what they may do.

A request's bearer token names a ``Principal``: the subject who acts (recorded as the actor of
everything they do), their roles and the tenants they see. Three kinds of token are taken
(``Authenticator.from_bearer``):

- a named API token (``longrunctl token create``), kept hashed in PostgreSQL: its name is the
  subject, its roles, permissions and tenants those it was created with;
- an OIDC bearer token (a JWT) from the configured issuer (``LONGRUN_OIDC_*``), verified against the
  issuer's JWKS (cached for a while, ``longrun.oidc``), for its audience: ``sub`` is the subject, the configured claims carry roles
  and permissions, tenants (``*``: every tenant) and groups;
- a bootstrap token (``LONGRUN_OPERATOR_TOKENS``): an admin of every tenant named ``bootstrap``,
  there so a fresh install can create its first named tokens.

Its roles and what each allows: ``longrun.principals``. A web console session keeps no token: it
keeps what ``Authenticator.vouched`` says of it, and asks ``Authenticator.still`` on every request
whether that still vouches for its principal.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass

import jwt
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.config import Settings
from longrun.db import console_sessions, tokens
from longrun.oidc import KeySet
from longrun.principals import BOOTSTRAP, Principal, from_claims

logger = logging.getLogger(__name__)

JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric only: the gateway holds no secret an identity provider's tokens could be forged with."""


@dataclass(frozen=True, slots=True)
class Vouched:
    """A bearer token's principal, and what is kept of the token in its place to ask again later
    whether it still vouches: a named token's id, a bootstrap token's SHA-256, or (an OIDC token) the
    principal alone until the token's expiry."""

    principal: Principal
    token_id: int | None = None
    bootstrap_sha256: str | None = None
    expires: float | None = None
    """Epoch seconds after which the token is refused (None: as long as it stays live)."""


class Authenticator:
    """Turns a bearer token into a ``Principal``; built once per gateway."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self._engine = engine
        self._settings = settings
        self._bootstrap = tuple(t.encode() for t in settings.operator_tokens or ())
        self._bootstrap_digests = tuple(tokens.digest(t).encode() for t in settings.operator_tokens or ())
        self._jwks = (KeySet(settings.oidc_jwks_url, ttl=settings.oidc_cache_ttl,
                             refresh_interval=settings.oidc_refresh_interval) if settings.oidc_issuer else None)

    async def from_bearer(self, token: str) -> Principal | None:
        """The principal the token names, or None: unknown, revoked, expired, forged or malformed."""
        vouched = await self.vouched(token)
        return None if vouched is None else vouched.principal

    async def vouched(self, token: str) -> Vouched | None:
        """What the token vouches for, or None: unknown, revoked, expired, forged or malformed."""
        if not token:
            return None
        presented = token.encode()
        if any(hmac.compare_digest(presented, t) for t in self._bootstrap):
            return Vouched(BOOTSTRAP, bootstrap_sha256=tokens.digest(token))
        if token.startswith(tokens.SECRET_PREFIX):
            async with self._engine.begin() as conn:
                stored = await tokens.find(conn, token)
            if stored is None:
                return None
            return Vouched(Principal(stored.name, frozenset(stored.roles),
                                     None if stored.tenants is None else frozenset(stored.tenants),
                                     credential=f"token:{stored.id}", permissions=frozenset(stored.permissions)),
                           token_id=stored.id,
                           expires=None if stored.expires_at is None else stored.expires_at.timestamp())
        if self._jwks is not None and token.count(".") == 2:
            return await asyncio.to_thread(self._verified, token)
        return None

    def still(self, kept: console_sessions.Kept) -> Principal | None:
        """The principal of a kept session if what signed it in still vouches for it: its named token
        is live, its bootstrap token still configured, its OIDC issuer still the configured one."""
        if kept.token_id is not None:
            return kept.principal if kept.token_live else None
        if kept.bootstrap_sha256 is not None:
            kept_digest = kept.bootstrap_sha256.encode()
            return BOOTSTRAP if any(hmac.compare_digest(kept_digest, d) for d in self._bootstrap_digests) else None
        issuer = self._settings.oidc_issuer
        return kept.principal if issuer and kept.principal.credential == f"oidc:{issuer}" else None

    def _verified(self, token: str) -> Vouched | None:
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
        return Vouched(from_claims(claims, roles_claim=settings.oidc_roles_claim,
                                   tenants_claim=settings.oidc_tenants_claim, groups_claim=settings.oidc_groups_claim),
                       expires=float(claims["exp"]))
