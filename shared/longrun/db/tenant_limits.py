"""Tenant limits (``domain.tenant_limits``) and each tenant's budget use per period, in PostgreSQL.

Admission reads a tenant's slots and whether its budget is spent inside the statements it already
runs (``slots``, ``spent``: SQL expressions of one primary-key lookup each), so a create, a round or
a handover costs no extra round trip. A model call's charge adds the tenant's use to the statement
that charges the run (``charge_sql``), writing only when the tenant has a budget.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.domain.tenant_limits import TENANT_BUDGET_PREFIX, TenantLimits


def slots(tenant: str, default: str) -> str:
    """The tenant's run slots (SQL expressions ``tenant`` and ``default``: the platform's)."""
    return f"COALESCE((SELECT run_slots FROM tenant_limits WHERE tenant_id = {tenant}), {default})"


def spent(tenant: str) -> str:
    """Whether the tenant's budget is spent for the period now running (a period over is not)."""
    return (f"EXISTS (SELECT 1 FROM tenant_budget_use WHERE tenant_id = {tenant} AND spent "
            "AND period_end > now())")


_BUDGETS = ("(SELECT COALESCE(l.token_budget, CAST(:g_tokens_default AS bigint)) AS tokens, "
            "COALESCE(l.cost_budget, CAST(:g_cost_default AS float8)) AS cost "
            "FROM (SELECT 1) AS one LEFT JOIN tenant_limits AS l ON l.tenant_id = :g_tenant) AS budget")
_PERIOD_START = ("to_timestamp(floor(extract(epoch FROM now()) / CAST(:g_period AS float8)) "
                 "* CAST(:g_period AS float8))")


def charge_sql(source: str) -> str:
    """Add ``:g_tokens`` and ``:g_cost`` to the tenant's (``:g_tenant``) use in the period now running,
    once per row of ``source`` (the run that moved), only if the tenant has a budget (its own or the
    platform's default, ``:g_tokens_default`` / ``:g_cost_default``). Periods are ``:g_period``
    seconds long, counted from the Unix epoch on the database's clock; a charge in a later period
    than the row's starts it afresh. ``spent`` is judged by the budgets as they are now."""
    fresh_tokens = "CAST(:g_tokens AS bigint)"
    fresh_cost = "CAST(:g_cost AS float8)"
    old = "tenant_budget_use.period_end <= now()"
    tokens = f"CASE WHEN {old} THEN 0 ELSE tenant_budget_use.tokens END + {fresh_tokens}"
    cost = f"CASE WHEN {old} THEN 0 ELSE tenant_budget_use.cost END + {fresh_cost}"
    return (
        "INSERT INTO tenant_budget_use AS tenant_budget_use (tenant_id, period_start, period_end, tokens, cost, spent) "
        f"SELECT :g_tenant, {_PERIOD_START}, {_PERIOD_START} + make_interval(secs => CAST(:g_period AS float8)), "
        f"{fresh_tokens}, {fresh_cost}, "
        f"COALESCE({fresh_tokens} >= budget.tokens, false) OR COALESCE({fresh_cost} >= budget.cost, false) "
        f"FROM {source}, {_BUDGETS} WHERE budget.tokens IS NOT NULL OR budget.cost IS NOT NULL "
        "ON CONFLICT (tenant_id) DO UPDATE SET "
        f"period_start = CASE WHEN {old} THEN excluded.period_start ELSE tenant_budget_use.period_start END, "
        f"period_end = CASE WHEN {old} THEN excluded.period_end ELSE tenant_budget_use.period_end END, "
        f"tokens = {tokens}, cost = {cost}, "
        f"spent = COALESCE({tokens} >= (SELECT tokens FROM {_BUDGETS}), false) "
        f"OR COALESCE({cost} >= (SELECT cost FROM {_BUDGETS}), false)")


_LOAD = text("SELECT version, run_slots, token_budget, cost_budget, tool_concurrency FROM tenant_limits "
             "WHERE tenant_id = :t")
_PUT = text(
    "INSERT INTO tenant_limits (tenant_id, version, run_slots, token_budget, cost_budget, tool_concurrency, "
    "updated_by) VALUES (:t, 1, :slots, :tokens, :cost, CAST(:tools AS jsonb), :by) "
    "ON CONFLICT (tenant_id) DO UPDATE SET version = tenant_limits.version + 1, run_slots = excluded.run_slots, "
    "token_budget = excluded.token_budget, cost_budget = excluded.cost_budget, "
    "tool_concurrency = excluded.tool_concurrency, updated_by = excluded.updated_by, updated_at = now() "
    "RETURNING version")
# The period's use judged again by the new budgets: a raise lets the tenant's runs in at once.
_REJUDGE = text(
    "UPDATE tenant_budget_use SET spent = COALESCE(tokens >= CAST(:tokens AS bigint), false) "
    "OR COALESCE(cost >= CAST(:cost AS float8), false) WHERE tenant_id = :t")
_USE = text("SELECT period_start, period_end, tokens, cost, spent, period_end > now() AS current "
            "FROM tenant_budget_use WHERE tenant_id = :t")


_IS_SPENT = text(f"SELECT {spent(':t')}")
_BUDGET_WAITERS = text("SELECT run_id FROM runs WHERE wait_correlation_key = :k AND tenant_id = :t")


async def is_spent(conn: AsyncConnection, tenant_id: str) -> bool:
    return bool((await conn.execute(_IS_SPENT, {"t": tenant_id})).scalar_one())


async def budget_waiters(conn: AsyncConnection, tenant_id: str) -> list[str]:
    """The runs parked for the tenant's budget (through ix_runs_wait_correlation_key)."""
    key = f"{TENANT_BUDGET_PREFIX}{tenant_id}"
    return list((await conn.execute(_BUDGET_WAITERS, {"k": key, "t": tenant_id})).scalars())


def _limits(tenant_id: str, row: Any) -> TenantLimits:
    return TenantLimits(tenant_id, row.run_slots, row.token_budget, row.cost_budget, dict(row.tool_concurrency),
                        version=row.version)


async def load(conn: AsyncConnection, tenant_id: str) -> TenantLimits:
    """The tenant's limits (every setting ``None``, no version, when it never set any)."""
    row = (await conn.execute(_LOAD, {"t": tenant_id})).first()
    return TenantLimits(tenant_id) if row is None else _limits(tenant_id, row)


async def put(conn: AsyncConnection, limits: TenantLimits, *, by: str, token_budget: int | None,
              cost_budget: float | None) -> TenantLimits:
    """Replace the tenant's limits under the next version (1 for the first), and judge its period's
    use again by the budgets now in force (``token_budget``, ``cost_budget``: the defaults filled in)."""
    version = (await conn.execute(_PUT, {
        "t": limits.tenant_id, "slots": limits.run_slots, "tokens": limits.token_budget, "cost": limits.cost_budget,
        "tools": json.dumps(dict(limits.tool_concurrency)), "by": by})).scalar_one()
    await conn.execute(_REJUDGE, {"t": limits.tenant_id, "tokens": token_budget, "cost": cost_budget})
    return TenantLimits(limits.tenant_id, limits.run_slots, limits.token_budget, limits.cost_budget,
                        dict(limits.tool_concurrency), version=version)


async def use(conn: AsyncConnection, tenant_id: str) -> dict[str, Any] | None:
    """The tenant's use of its budget in the period now running; None when nothing was charged in it."""
    row = (await conn.execute(_USE, {"t": tenant_id})).first()
    if row is None or not row.current:
        return None
    return {"period_start": row.period_start.isoformat(), "period_end": row.period_end.isoformat(),
            "tokens": row.tokens, "cost": row.cost, "spent": row.spent}
