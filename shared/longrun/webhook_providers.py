"""The webhook providers a deployment accepts (``POST /webhooks/<provider>``), loaded from
configuration, so a run kind's package brings the providers of the far sides it waits on.

Two sources: ``LONGRUN_WEBHOOK_PROVIDERS`` (``name=package.module:attribute``, comma-separated) and
the ``longrun.webhook_providers`` entry points of the installed distributions (the entry point's
name is the provider's). A provider (``ports.webhooks.Provider``) declares how its deliveries are
signed and turns a verified payload into a ``Translated``. A reference that cannot be loaded, or one name given twice, stops the
process with a ``ConfigError`` naming where it came from, the reference and why.
"""

from __future__ import annotations

from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.ports.webhooks import Provider
from longrun.run_kinds import import_reference, installed_entry_points

VARIABLE = "LONGRUN_WEBHOOK_PROVIDERS"
ENTRY_POINT_GROUP = "longrun.webhook_providers"


def load(settings: Settings) -> dict[str, Provider]:
    """Every provider the configuration names, by name (none is fine: no webhooks are accepted)."""
    providers: dict[str, Provider] = {}
    for name, reference in settings.webhook_providers:
        _add(providers, name, import_reference(reference, VARIABLE), reference, VARIABLE)
    for installed in installed_entry_points(ENTRY_POINT_GROUP):
        _add(providers, installed.name, installed.target, installed.reference, installed.where)
    return providers


def secrets(settings: Settings, providers: dict[str, Provider]) -> dict[str, str]:
    """Each provider's HMAC secret, its own: from ``LONGRUN_WEBHOOK_SECRETS``, or ``LONGRUN_WEBHOOK_SECRET``
    when one provider alone is loaded. A ``ConfigError`` (naming providers, never a secret) for a
    secret of a provider not loaded, a provider without a secret, and providers given the same one:
    a sender of one provider must not be able to sign as another."""
    own = dict(settings.webhook_secrets)
    unknown = sorted(set(own) - set(providers))
    if unknown:
        raise ConfigError([("LONGRUN_WEBHOOK_SECRETS", f"no provider {', '.join(map(repr, unknown))}; known: "
                                                       f"{', '.join(sorted(providers)) or 'none'}")])
    if len(providers) == 1 and settings.webhook_secret:
        own.setdefault(next(iter(providers)), settings.webhook_secret)
    problems = []
    missing = sorted(set(providers) - set(own))
    if missing:
        problems.append(("LONGRUN_WEBHOOK_SECRETS", f"no secret for provider {', '.join(map(repr, missing))}: each "
                         "provider has its own (LONGRUN_WEBHOOK_SECRET serves a lone provider only)"))
    by_secret: dict[str, list[str]] = {}
    for name, secret in own.items():
        by_secret.setdefault(secret, []).append(name)
    problems += [("LONGRUN_WEBHOOK_SECRETS", f"providers {', '.join(map(repr, sorted(names)))} share a secret; "
                  "each needs its own") for names in by_secret.values() if len(names) > 1]
    if problems:
        raise ConfigError(problems)
    return own


def _add(providers: dict[str, Provider], name: str, target: object, reference: str, where: str) -> None:
    if not isinstance(target, Provider):
        raise ConfigError([(where, f"{reference!r} is not a provider (a longrun.ports.webhooks.Provider): "
                                   f"got {type(target).__name__}")])
    if name in providers and providers[name] is not target:
        raise ConfigError([(where, f"provider {name!r} is named twice, here as {reference!r}")])
    providers[name] = target
