"""Tenant policies (``domain.scope.TenantPolicy``): read when a run is created (with the tenant's
admission lock, in the same statement) and when an approved call is re-validated; written by the
operator API, each change under a new version."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import admission
from longrun.db.schema_tenants import tenant_policies
from longrun.domain import Scope, TenantPolicy

_LOAD = select(tenant_policies.c.version, tenant_policies.c.tools, tenant_policies.c.resources).where(
    tenant_policies.c.tenant_id == bindparam("t"))
_LOCK_AND_LOAD = text(f"SELECT {admission.TENANT_LOCK} AS locked, p.version, p.tools, p.resources "
                      "FROM (SELECT 1) AS one LEFT JOIN tenant_policies AS p ON p.tenant_id = :t")
_PUT = text(
    "INSERT INTO tenant_policies (tenant_id, version, tools, resources, updated_by) "
    "VALUES (:t, 1, CAST(:tools AS jsonb), CAST(:resources AS jsonb), :by) "
    "ON CONFLICT (tenant_id) DO UPDATE SET version = tenant_policies.version + 1, tools = excluded.tools, "
    "resources = excluded.resources, updated_by = excluded.updated_by, updated_at = now() "
    "RETURNING version")


def _policy(tenant_id: str, row: Any) -> TenantPolicy:
    return TenantPolicy(tenant_id, row.version, Scope(tuple(row.tools), tuple(row.resources)))


async def load(conn: AsyncConnection, tenant_id: str) -> TenantPolicy | None:
    row = (await conn.execute(_LOAD, {"t": tenant_id})).first()
    return None if row is None else _policy(tenant_id, row)


async def lock_and_load(conn: AsyncConnection, tenant_id: str) -> TenantPolicy | None:
    """The tenant's admission lock (``admission.LOCK_TENANT``), held to the end of the transaction, and
    its policy, in one statement: what a create needs before it writes the run."""
    row = (await conn.execute(_LOCK_AND_LOAD, {"t": tenant_id})).one()
    return None if row.version is None else _policy(tenant_id, row)


async def put(conn: AsyncConnection, tenant_id: str, scope: Scope, *, by: str) -> TenantPolicy:
    """Replace the tenant's policy; the new one has the next version (1 for the first)."""
    version = (await conn.execute(_PUT, {"t": tenant_id, "tools": json.dumps(list(scope.tools)),
                                         "resources": json.dumps(list(scope.resources)), "by": by})).scalar_one()
    return TenantPolicy(tenant_id, version, Scope(scope.tools, scope.resources))
