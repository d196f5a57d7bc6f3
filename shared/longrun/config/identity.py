"""Who the operator API takes: bootstrap tokens and an OIDC issuer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, declared_variable, setting


@dataclass(frozen=True)
class IdentitySettings(Concern):
    """Identity: operator tokens and OIDC"""

    operator_tokens: tuple[str, ...] | None = setting("LONGRUN_OPERATOR_TOKENS", parse.bootstrap_tokens,
                                                      "comma-separated bearer tokens, or off", "", secret=True)
    """Bootstrap tokens, comma separated: each is taken by the operator API as the admin
    ``bootstrap`` of every tenant, so a fresh install can create named tokens
    (``longrunctl token create``); keep them secret and few, and use named tokens or OIDC for
    people. None is built in: the gateway refuses to start without them, or with one that is
    known or under 32 bytes; ``off`` switches them off once named tokens or OIDC exist."""
    oidc_issuer: str = setting("LONGRUN_OIDC_ISSUER", parse.optional_url, "an http(s) URL, or empty (off)", "")
    """The OIDC issuer (its ``iss``) whose bearer JWTs the operator API takes; empty: none is
    taken. Needs ``LONGRUN_OIDC_AUDIENCE`` and ``LONGRUN_OIDC_JWKS_URL``."""
    oidc_audience: str = setting("LONGRUN_OIDC_AUDIENCE", str, "the audience tokens are issued for", "")
    """The audience (``aud``) a JWT must be issued for."""
    oidc_jwks_url: str = setting("LONGRUN_OIDC_JWKS_URL", parse.optional_url, "an http(s) URL, or empty", "")
    """Where the issuer publishes its signing keys (JWKS), fetched when a token names a key not yet
    cached (see ``LONGRUN_OIDC_REFRESH_INTERVAL``) and when the cached ones run out
    (``LONGRUN_OIDC_CACHE_TTL``)."""
    oidc_cache_ttl: float = setting("LONGRUN_OIDC_CACHE_TTL", parse.duration, parse.DURATION, "15m")
    """How long the issuer's signing keys (JWKS) and discovery document are kept before they are
    fetched again: a key the issuer withdraws stops verifying tokens within this time."""
    oidc_refresh_interval: float = setting("LONGRUN_OIDC_REFRESH_INTERVAL", parse.duration, parse.DURATION, "30s")
    """The least time between two fetches of the JWKS that a token naming an unknown key id causes
    (the issuer rotated its keys): tokens with made-up key ids cannot make the gateway hammer it."""
    oidc_roles_claim: str = setting("LONGRUN_OIDC_ROLES_CLAIM", parse.word, "a claim name", "roles")
    """The JWT claim holding the operator's roles (viewer, operator, approver, admin)."""
    oidc_tenants_claim: str = setting("LONGRUN_OIDC_TENANTS_CLAIM", parse.word, "a claim name", "tenants")
    """The JWT claim holding the tenants the operator sees (``*``: every tenant; none: no tenant)."""
    oidc_groups_claim: str = setting("LONGRUN_OIDC_GROUPS_CLAIM", parse.word, "a claim name", "groups")
    """The JWT claim holding the operator's groups (an approval may name a group as its approver)."""
    oidc_client_id: str = setting("LONGRUN_OIDC_CLIENT_ID", str, "a client id, or empty (off)", "")
    """The web console's client id at the OIDC issuer: set, the console's sign-in page offers signing
    in there (the authorization-code flow with PKCE, redirecting back to ``/console/oidc/callback``);
    empty: named tokens only. The access token it gets must be one the operator API takes."""
    oidc_client_secret: str = setting("LONGRUN_OIDC_CLIENT_SECRET", str, "a client secret, or empty", "",
                                        secret=True)
    """The console's client secret at the issuer (empty for a public client, which PKCE protects)."""

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Problem]:
        problems: list[Problem] = []
        if values["oidc_issuer"]:
            for name in ("oidc_audience", "oidc_jwks_url"):
                if not values[name].strip():
                    declared = declared_variable(IdentitySettings, name)
                    problems.append((declared.env, "missing; expected it with LONGRUN_OIDC_ISSUER "
                                                   f"({declared.expected})"))
        if values["oidc_client_id"] and not values["oidc_issuer"]:
            problems.append(("LONGRUN_OIDC_CLIENT_ID", "set without LONGRUN_OIDC_ISSUER: the console has no issuer "
                             "to send operators to"))
        return problems
