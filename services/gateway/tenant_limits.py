"""A tenant's limits within its ceiling: run slots, token and cost budgets per period, tool concurrency.

An admin of every tenant sets any tenant's limits and their ceiling (``set_limits_ceiling``); an admin
of one tenant may only set its tenant's limits within the ceiling that holds (``domain.ceiling``: the
ceiling set, else the value in force, the tenant's own or the platform's default), so it can lower
them, never raise them past what the platform gave it: a change beyond is refused (``BeyondCeiling``)
and nothing is written. Both take the tenant's ceiling lock first and are audited
(``tenant_limits.set``, ``tenant_limits_ceiling.set``). A change holds at once, with no restart:
admission reads the slots in its own statements, and the period's use is judged again by the new
budgets: a raise lets the tenant's queued runs in (the scheduler is notified) and wakes its runs
parked for the budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.app.effects import ADMISSION_CHANNEL
from longrun.app.gateway import tenant_budget
from longrun.db import admission, ceilings
from longrun.db import audit as audit_log
from longrun.db import tenant_limits as stored_limits
from longrun.db.transaction import PgTransaction
from longrun.domain.ceiling import LIMITS_MAXIMUM, Ceiling, beyond, effective
from longrun.domain.tenant_limits import PlatformDefaults, TenantLimits
from longrun.services.gateway.policy_ceiling import BeyondCeiling

async def ceiling(conn: AsyncConnection, tenant_id: str, defaults: PlatformDefaults) -> Ceiling:
    """How far the tenant's own admins may set its limits now."""
    stored = await ceilings.load(conn, tenant_id)
    in_force = (await stored_limits.load(conn, tenant_id)).in_force(defaults)
    held = None if stored is None else {k: v for k, v in stored.limits.items() if k in LIMITS_MAXIMUM}
    return effective(tenant_id, held, in_force, version=None if stored is None else stored.version,
                     maximum=LIMITS_MAXIMUM)


async def view(conn: AsyncConnection, tenant_id: str, defaults: PlatformDefaults) -> dict[str, Any]:
    """The tenant's limits as set, as in force, their ceiling, and its use of the period now running."""
    limits = await stored_limits.load(conn, tenant_id)
    return {"tenant_id": tenant_id, "version": limits.version, **limits.document(),
            "in_force": limits.in_force(defaults), "ceiling": ceiling_json(await ceiling(conn, tenant_id, defaults)),
            "use": await stored_limits.use(conn, tenant_id)}


async def set_limits(conn: AsyncConnection, limits: TenantLimits, defaults: PlatformDefaults, *, actor: str,
                     every_tenant: bool, reason: str) -> dict[str, Any]:
    """Replace the tenant's limits under the next version, audited; ``BeyondCeiling`` when an admin of
    one tenant (not ``every_tenant``) asks for more than its ceiling allows."""
    tenant_id = limits.tenant_id
    await ceilings.lock(conn, tenant_id)
    if not every_tenant:
        why = beyond(limits.in_force(defaults), await ceiling(conn, tenant_id, defaults))
        if why is not None:
            raise BeyondCeiling(f"{actor} may only lower the limits of tenant {tenant_id!r} within its ceiling; "
                                f"{why}")
    in_force = limits.in_force(defaults)
    written = await stored_limits.put(conn, limits, by=actor, token_budget=in_force["token_budget"],
                                      cost_budget=in_force["cost_budget"])
    await audit_log.audit(conn, actor=actor, action="tenant_limits.set", target=tenant_id, reason=reason,
                         details={"version": written.version, **written.document()}, tenant=tenant_id)
    # Raised slots or budgets let queued runs in: the scheduler admits them now, not at its next round;
    # runs parked for the budget ask the model again.
    await admission.notify(conn, ADMISSION_CHANNEL, [tenant_id])
    if not await stored_limits.is_spent(conn, tenant_id):
        await tenant_budget.wake_waiters(PgTransaction(conn), tenant_id,
                                         await stored_limits.budget_waiters(conn, tenant_id), time.time())
    return await view(conn, tenant_id, defaults)


async def set_limits_ceiling(conn: AsyncConnection, tenant_id: str, asked: Mapping[str, Any],
                             defaults: PlatformDefaults, *, actor: str, reason: str) -> Ceiling:
    """Set the ceilings of the limits ``asked`` names (``None``: unbounded), keeping the policy's and
    the other limits' ceilings, under the next version, audited (the caller is an admin of every tenant)."""
    await ceilings.lock(conn, tenant_id)
    stored = await ceilings.load(conn, tenant_id)
    await ceilings.put(conn, tenant_id, {**(stored.limits if stored else {}), **asked}, by=actor)
    now = await ceiling(conn, tenant_id, defaults)
    await audit_log.audit(conn, actor=actor, action="tenant_limits_ceiling.set", target=tenant_id, reason=reason,
                         details=ceiling_json(now), tenant=tenant_id)
    return now


def ceiling_json(held: Ceiling) -> dict[str, Any]:
    return {"version": held.version, **held.limits, "origins": dict(held.origins)}

