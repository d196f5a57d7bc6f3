"""Ceilings: how far a tenant's own admins may set what their tenant's runs may do.

Responsibility: the pure check of a change that an admin of one tenant asks for against that tenant's
ceiling, setting by setting. A ceiling is a document of settings (``tools`` and ``resources``: the
tenant policy's scope; ``run_slots``, ``token_budget``, ``cost_budget``, ``tool_concurrency``: the
tenant's limits) and each setting is compared by the comparison ``COMPARISONS`` declares for
it, so a new per-tenant setting adds a comparison and a maximum, not a new mechanism.

Which ceiling holds (``effective``), per setting:

1. the one an admin of every tenant set (a row in ``tenant_ceilings``; the migration that brought
   ceilings recorded each policy then in force as its tenant's ceiling);
2. else the tenant's value in force, so its own admins can only narrow what they were given;
3. else the setting's maximum (``MAXIMUM``). For the scope that is ``*``: the kinds' maximum, since a
   policy only ever narrows each run's kind (``scope.narrow``), and a kind that declares no scope is
   unrestricted. For the tenant's limits (``domain.tenant_limits``) the value in force is the tenant's
   own or the platform's default, so a tenant's admins may lower its slots and budgets, never raise
   them past what the platform gave it.

Invariants:
- ``beyond`` is None exactly when every setting asked is within its ceiling; otherwise it names the
  setting, the value asked, the ceiling's value and where that ceiling comes from.
- A pattern list is within another when each of its patterns is covered by one of the other's (exact:
  patterns are names or prefixes, so a prefix is never covered by any set of narrower patterns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun.domain.scope import EVERYTHING, Scope, covers
from longrun.domain.tenant_limits import bound_beyond, groups_beyond

Limits = Mapping[str, Any]
"""A document of settings, as JSON holds it: ``{"tools": [...], "resources": [...]}``."""


def patterns_beyond(asked: Sequence[str], ceiling: Sequence[str]) -> tuple[str, ...]:
    """The patterns of ``asked`` that no pattern of ``ceiling`` covers (empty: ``asked`` is within it)."""
    return tuple(p for p in asked if not any(covers(c, p) for c in ceiling))


COMPARISONS: dict[str, Callable[[Any, Any], tuple[Any, ...]]] = {
    "tools": patterns_beyond,
    "resources": patterns_beyond,
    "run_slots": bound_beyond,
    "token_budget": bound_beyond,
    "cost_budget": bound_beyond,
    "tool_concurrency": groups_beyond,
}
"""Per setting: what of the value asked lies beyond the ceiling's value (empty: nothing)."""

MAXIMUM: Limits = {"tools": list(EVERYTHING), "resources": list(EVERYTHING)}
"""Each setting of the tenant policy's ceiling when nothing narrower holds."""
LIMITS_MAXIMUM: Limits = {"run_slots": None, "token_budget": None, "cost_budget": None, "tool_concurrency": {}}
"""Each setting of the tenant limits' ceiling (``domain.tenant_limits``) when nothing narrower holds:
unbounded (though the value in force always holds for them: the tenant's own, else the platform's)."""

SET = "set by an admin of every tenant"
IN_FORCE = "the value in force: no ceiling is set"
KINDS_MAXIMUM = "the kinds' maximum: no ceiling or value is set"


def scope_limits(scope: Scope) -> dict[str, list[str]]:
    """A tenant policy's scope as a document of settings."""
    return {"tools": list(scope.tools), "resources": list(scope.resources)}


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A tenant's ceiling as it holds: every setting's value and where it comes from."""

    tenant_id: str
    limits: Limits
    origins: Mapping[str, str]
    """Per setting: ``SET``, ``IN_FORCE`` or ``KINDS_MAXIMUM``."""
    version: int | None
    """The version of the ceiling that was set; None when none was."""


def effective(tenant_id: str, stored: Limits | None, in_force: Limits | None, *,
              version: int | None = None, maximum: Limits = MAXIMUM) -> Ceiling:
    """The ceiling of ``tenant_id`` over the settings of ``maximum`` (the policy's, or
    ``LIMITS_MAXIMUM``): per setting, the ``stored`` ceiling's value, else the value ``in_force``, else
    the maximum. ``version``: the stored ceiling's."""
    limits, origins = {}, {}
    for setting, most in maximum.items():
        if stored is not None and setting in stored:
            limits[setting], origins[setting] = stored[setting], SET
        elif in_force is not None and setting in in_force:
            limits[setting], origins[setting] = in_force[setting], IN_FORCE
        else:
            limits[setting], origins[setting] = most, KINDS_MAXIMUM
    return Ceiling(tenant_id, limits, origins, version if stored is not None else None)


def beyond(asked: Limits, ceiling: Ceiling) -> str | None:
    """Why ``asked`` (a value for each setting it names) goes beyond ``ceiling`` (every setting that
    does, with both values), or None."""
    problems = []
    for setting, compare in COMPARISONS.items():
        if setting not in asked:
            continue
        over = compare(asked[setting], ceiling.limits[setting])
        if over:
            origin = ceiling.origins[setting]
            if origin == SET:
                origin = f"{origin}, v{ceiling.version}"
            problems.append(f"{setting} {_shown(asked[setting])} go beyond the ceiling's "
                            f"{_shown(ceiling.limits[setting])} ({origin}): {', '.join(repr(p) for p in over)} "
                            "not within it")
    if not problems:
        return None
    return f"tenant {ceiling.tenant_id!r}: " + "; ".join(problems)


def _shown(value: Any) -> str:
    if value is None:
        return "unlimited"
    return str(list(value)) if isinstance(value, (list, tuple)) else str(value)
