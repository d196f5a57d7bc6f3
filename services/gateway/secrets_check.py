"""The gateway's secrets, checked before it serves: it is the only service that holds any, so the
check belongs to its start rather than to the settings every service parses.

Secrets longrun owns (the bootstrap operator tokens, the console's session key,
``LONGRUN_WEBHOOK_SECRET``) must be random: one that is not set, is a known development or
placeholder string or is under ``OWNED_BYTES`` bytes is refused. Secrets a provider issues (a provider's own webhook secret,
the OIDC client secret) have the provider's format, so only an empty or known string is refused.
Every refusal names its variable and why, never the value. The bootstrap tokens may be switched
off (``off``) once named tokens or an OIDC issuer exist.
"""

from __future__ import annotations

from collections.abc import Collection

from longrun.config import Settings

OWNED_BYTES = 32
"""The least length of a secret longrun owns: 256 bits, as ``secrets.token_urlsafe(32)`` gives."""
KNOWN_PREFIXES = ("dev-", "test-", "change-me", "changeme", "example")
"""Lower-cased beginnings of the strings shipped in this repository's files and examples."""
KNOWN = frozenset({"secret", "password", "not-needed-locally", "sk-..."})
HOW = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def known(value: str) -> bool:
    lowered = value.strip().lower()
    return lowered in KNOWN or lowered.startswith(KNOWN_PREFIXES)


def refusals(settings: Settings, *, shared_webhook_secret_used: bool, provider_secrets: Collection[str]) -> list[str]:
    """Why the gateway may not start with these secrets, one line per variable; empty: it may.
    ``shared_webhook_secret_used``: a lone provider takes ``LONGRUN_WEBHOOK_SECRET`` (no secret is
    shared across providers: ``webhook_providers.secrets``); ``provider_secrets``: the
    providers named in ``LONGRUN_WEBHOOK_SECRETS``."""
    problems = [_owned("LONGRUN_CONSOLE_SECRET", settings.console_secret)]
    tokens = ("",) if settings.operator_tokens is None else settings.operator_tokens
    for i, token in enumerate(tokens, 1):
        why = _owned_why(token)
        if why is not None:
            which = "" if len(tokens) == 1 else f" (token {i} of {len(tokens)})"
            problems.append(f"LONGRUN_OPERATOR_TOKENS{which} {why}" + ("; or `off` once named tokens or OIDC exist"
                                                                        if settings.operator_tokens is None else ""))
    if shared_webhook_secret_used:
        problems.append(_owned("LONGRUN_WEBHOOK_SECRET", settings.webhook_secret))
    own = dict(settings.webhook_secrets)
    problems += [f"LONGRUN_WEBHOOK_SECRETS: the secret of provider {name!r} is empty or a known "
                 f"placeholder; set the one the provider issued" for name in sorted(provider_secrets)
                 if not own.get(name, "").strip() or known(own[name])]
    if settings.oidc_client_secret and known(settings.oidc_client_secret):
        problems.append("LONGRUN_OIDC_CLIENT_SECRET is a known placeholder; set the one the issuer gave the console "
                        "(or leave it empty for a public client)")
    return [p for p in problems if p]


def _owned(variable: str, value: str) -> str | None:
    why = _owned_why(value)
    return None if why is None else f"{variable} {why}"


def _owned_why(value: str) -> str | None:
    if not value.strip():
        return f"is not set: {HOW}"
    if known(value):
        return f"is a known development or placeholder value, which anyone can send; {HOW}"
    if len(value.encode()) < OWNED_BYTES:
        return f"is under {OWNED_BYTES} bytes; {HOW}"
    return None


def bootstrap_off_refusal(settings: Settings, *, named_tokens: bool) -> str | None:
    """Why the bootstrap tokens may not be off: with no OIDC issuer and no live named token, no one
    could ever call the operator API."""
    if settings.operator_tokens != () or settings.oidc_issuer or named_tokens:
        return None
    return ("LONGRUN_OPERATOR_TOKENS is off, yet no named token is live and no OIDC issuer is set "
            "(LONGRUN_OIDC_ISSUER): no one could call the operator API; set a bootstrap token to create the first one")
