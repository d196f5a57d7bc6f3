"""Permissions: what a run may call (tools) and act on (resources), and the check before each call.

Responsibility: the ``Scope`` value and the pure functions on it. A run's scope is computed once,
when it is created (``narrow``: the run kind's declared maximum, narrowed by its tenant's policy and
by what the producer asked for), recorded in ``run.created`` and kept in the snapshot; the worker
checks every call against it (``refusal``) before the call is prepared.

Patterns: a name (``forge.open_merge_request``), or a prefix ending in ``*`` (``forge.*``; ``*``
alone is everything). ``*`` anywhere else is refused, so that every question below (does this
pattern cover that one, what do two sets have in common) has an exact answer.

Invariants:
- Narrowing never widens: ``narrow(m, *limits)`` allows nothing ``m`` or any limit refuses.
- ``intersect`` is exact: a name is allowed by the result iff both sets allow it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

EVERYTHING = ("*",)


def check_pattern(pattern: str) -> str:
    """``pattern`` itself, or ValueError naming it and what a pattern may be."""
    if not pattern or "*" in pattern[:-1]:
        raise ValueError(f"scope pattern {pattern!r} is not a name or a prefix ending in '*' "
                         "(e.g. 'forge.open_merge_request', 'forge.*', 'repo:acme/*', '*')")
    return pattern


def covers(pattern: str, other: str) -> bool:
    """Whether everything ``other`` (a name or a pattern) names is named by ``pattern``."""
    if pattern.endswith("*"):
        return other.startswith(pattern[:-1])
    return pattern == other


def allowed(patterns: Iterable[str], name: str) -> bool:
    return any(covers(p, name) for p in patterns)


def intersect(a: Iterable[str], b: Iterable[str]) -> tuple[str, ...]:
    """The patterns that name exactly what both ``a`` and ``b`` name (prefix patterns are nested or
    disjoint, so each pair meets in the narrower one or not at all), without redundant ones, sorted."""
    met = set()
    b = tuple(b)
    for x in a:
        for y in b:
            if covers(x, y):
                met.add(y)
            elif covers(y, x):
                met.add(x)
    return tuple(sorted(p for p in met if not any(q != p and covers(q, p) for q in met)))


@dataclass(frozen=True, slots=True)
class Scope:
    """Tools and resources a run may use: a call needs its tool allowed and, for a tool that
    declares the resource it acts on, that resource allowed."""

    tools: tuple[str, ...] = EVERYTHING
    resources: tuple[str, ...] = EVERYTHING
    policy_version: int | None = None
    """The version of the tenant policy this scope was narrowed by; None when the tenant had none."""

    def __post_init__(self) -> None:
        for pattern in (*self.tools, *self.resources):
            check_pattern(pattern)

    def describe(self) -> str:
        version = "" if self.policy_version is None else f", tenant policy v{self.policy_version}"
        return f"tools {list(self.tools)}, resources {list(self.resources)}{version}"


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """What a tenant lets its runs do, whatever their kind allows; each change has a new version."""

    tenant_id: str
    version: int
    scope: Scope


def narrow(maximum: Scope, policy: TenantPolicy | None = None, requested: Scope | None = None) -> Scope:
    """A run's scope: its kind's ``maximum``, narrowed by its tenant's ``policy`` and by the producer's
    ``requested`` scope. What is asked beyond the others is dropped, never granted."""
    tools, resources = maximum.tools, maximum.resources
    for limit in (policy.scope if policy is not None else None, requested):
        if limit is not None:
            tools, resources = intersect(tools, limit.tools), intersect(resources, limit.resources)
    return Scope(tools, resources, policy.version if policy is not None else None)


def refusal(scope: Scope, tool: str, resource: str | None) -> str | None:
    """Why ``scope`` does not allow calling ``tool`` on ``resource`` (None: the tool declares no
    resource); None when it does."""
    if not allowed(scope.tools, tool):
        return f"tool {tool!r} is outside the run's scope ({scope.describe()})"
    if resource is not None and not allowed(scope.resources, resource):
        return f"resource {resource!r} of tool {tool!r} is outside the run's scope ({scope.describe()})"
    return None


def revalidated(scope: Scope, policy: TenantPolicy | None) -> Scope:
    """``scope`` under the tenant's current ``policy``: unchanged while the policy version it was
    narrowed by still holds, else narrowed by the current policy too (a change never widens it)."""
    if policy is None or policy.version == scope.policy_version:
        return scope  # a policy removed leaves the run as narrow as it was
    return Scope(intersect(scope.tools, policy.scope.tools), intersect(scope.resources, policy.scope.resources),
                 policy.version)
