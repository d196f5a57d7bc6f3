"""A tenant's policy within its ceiling: the platform sets how far a tenant may go, the tenant narrows.

An admin of every tenant sets each tenant's ceiling (``set_ceiling``) and may set any policy; an admin
of one tenant may only set its tenant's policy within the ceiling that holds (``domain.ceiling``):
a change beyond it is refused (``BeyondCeiling``, naming both values) and nothing is written. Both
changes take the tenant's ceiling lock first, so a policy is checked against the ceiling in force
when it is written, and each is audited (``tenant_policy.set``, ``tenant_ceiling.set``).

Setting a ceiling does not change the policy in force: an admin of every tenant who lowers a ceiling
below it narrows the policy too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import audit as audit_log
from longrun.db import ceilings, policies
from longrun.domain import Scope, TenantPolicy
from longrun.domain.ceiling import Ceiling, beyond, effective, scope_limits


class BeyondCeiling(Exception):
    """An admin of one tenant asked for a policy beyond its tenant's ceiling; nothing was written."""


async def ceiling(conn: AsyncConnection, tenant_id: str) -> Ceiling:
    """The tenant's ceiling as it holds now."""
    stored = await ceilings.load(conn, tenant_id)
    policy = await policies.load(conn, tenant_id)
    return effective(tenant_id, None if stored is None else stored.limits,
                     None if policy is None else scope_limits(policy.scope),
                     version=None if stored is None else stored.version)


async def set_policy(conn: AsyncConnection, tenant_id: str, scope: Scope, *, actor: str, every_tenant: bool,
                     reason: str) -> TenantPolicy:
    """Replace the tenant's policy under its next version, audited. ``every_tenant``: the actor is an
    admin of every tenant, whom no ceiling bounds; otherwise ``BeyondCeiling`` for a policy beyond it."""
    await ceilings.lock(conn, tenant_id)
    if not every_tenant:
        why = beyond(scope_limits(scope), await ceiling(conn, tenant_id))
        if why is not None:
            raise BeyondCeiling(f"{actor} may only narrow the policy of tenant {tenant_id!r} within its ceiling; "
                                f"{why}")
    policy = await policies.put(conn, tenant_id, scope, by=actor)
    await audit_log.audit(conn, actor=actor, action="tenant_policy.set", target=tenant_id, reason=reason,
                         details=policy_json(policy), tenant=tenant_id)
    return policy


async def set_ceiling(conn: AsyncConnection, tenant_id: str, scope: Scope, *, actor: str, reason: str) -> Ceiling:
    """Replace the tenant's ceiling under its next version, audited (the caller is an admin of every tenant)."""
    await ceilings.lock(conn, tenant_id)
    stored = await ceilings.load(conn, tenant_id)  # the limits' ceilings share the document, and stay
    await ceilings.put(conn, tenant_id, {**(stored.limits if stored else {}), **scope_limits(scope)}, by=actor)
    now = await ceiling(conn, tenant_id)
    await audit_log.audit(conn, actor=actor, action="tenant_ceiling.set", target=tenant_id, reason=reason,
                         details=ceiling_json(now), tenant=tenant_id)
    return now


def policy_json(policy: TenantPolicy) -> dict[str, Any]:
    return {"tenant_id": policy.tenant_id, "version": policy.version, "tools": list(policy.scope.tools),
            "resources": list(policy.scope.resources)}


def ceiling_json(held: Ceiling) -> dict[str, Any]:
    return {"tenant_id": held.tenant_id, "version": held.version, **{k: list(v) for k, v in held.limits.items()},
            "origins": dict(held.origins)}
