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

Roles are ordered, each allowing what the ones before it allow: a **viewer** reads runs, the audit
log, alerts and versions; an **operator** also acts on runs (cancel, pause, resume, terminate,
resolve, migrate, attach) and replays quarantined messages; an **approver** also approves, denies
and answers; an **admin** also manages tokens and tenant policies. Approving is one role higher than
steering because it lets a run act on the outside world with a person's consent.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.config import Settings
from longrun.db import tokens
from longrun.oidc import KeySet

logger = logging.getLogger(__name__)

ROLES = ("viewer", "operator", "approver", "admin")
"""From least to most: each role allows what the roles before it allow."""
EVERY_TENANT = "*"
"""In a token's tenants claim: the principal sees every tenant."""
ROLE_PREFIX = "role:"
GROUP_PREFIX = "group:"
"""An approval's owner is a subject, ``role:<role>`` (any principal whose roles include it) or
``group:<group>`` (any principal in that group)."""
BOOTSTRAP_SUBJECT = "bootstrap"
JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric only: the gateway holds no secret an identity provider's tokens could be forged with."""


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    roles: frozenset[str]
    tenants: frozenset[str] | None
    """None: every tenant."""
    groups: frozenset[str] = field(default_factory=frozenset)
    credential: str = ""
    """What vouched for the principal, recorded with its decisions: ``token:<id>`` (a named token),
    ``oidc:<issuer>`` or ``bootstrap``; empty for one made in code rather than from a request."""

    def may(self, role: str) -> bool:
        """Whether the principal holds ``role`` or a role above it."""
        rank = ROLES.index(role)
        return any(r in ROLES and ROLES.index(r) >= rank for r in self.roles)

    def sees(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def is_owner(self, owner: str | None) -> bool:
        """Whether the principal is who an approval or question names as its owner (None: anyone
        who may approve)."""
        if owner is None:
            return True
        if owner.startswith(ROLE_PREFIX):
            role = owner.removeprefix(ROLE_PREFIX)
            return role in ROLES and self.may(role)
        if owner.startswith(GROUP_PREFIX):
            return owner.removeprefix(GROUP_PREFIX) in self.groups
        return owner == self.subject


BOOTSTRAP = Principal(BOOTSTRAP_SUBJECT, frozenset({"admin"}), None, credential=BOOTSTRAP_SUBJECT)


def from_claims(claims: Mapping[str, Any], *, roles_claim: str, tenants_claim: str,
                groups_claim: str) -> Principal:
    """The principal a verified JWT names: roles it does not know are ignored, and a token without
    a tenants claim sees no tenant."""
    tenants = _names(claims.get(tenants_claim))
    return Principal(subject=str(claims["sub"]), roles=frozenset(_names(claims.get(roles_claim))) & set(ROLES),
                     tenants=None if EVERY_TENANT in tenants else frozenset(tenants),
                     groups=frozenset(_names(claims.get(groups_claim))), credential=f"oidc:{claims.get('iss')}")


def _names(value: Any) -> list[str]:
    """A claim holding names: a list of them, or one string of them separated by spaces."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


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
