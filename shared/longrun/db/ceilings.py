"""Tenant ceilings (``domain.ceiling``): read with the tenant's policy when either changes, written by
an admin of every tenant, each change under a new version. Changes to a tenant's policy or ceiling
take the tenant's ceiling lock first, so a policy is checked against the ceiling that holds when it
is written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.domain.ceiling import Limits

_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('longrun.ceiling:' || :t))")
_LOAD = text("SELECT version, limits FROM tenant_ceilings WHERE tenant_id = :t")
_PUT = text(
    "INSERT INTO tenant_ceilings (tenant_id, version, limits, updated_by) VALUES (:t, 1, CAST(:limits AS jsonb), :by) "
    "ON CONFLICT (tenant_id) DO UPDATE SET version = tenant_ceilings.version + 1, limits = excluded.limits, "
    "updated_by = excluded.updated_by, updated_at = now()")


@dataclass(frozen=True, slots=True)
class Stored:
    version: int
    limits: Limits


async def lock(conn: AsyncConnection, tenant_id: str) -> None:
    """The tenant's ceiling lock, held to the end of the transaction (taken before anything is read:
    a statement's snapshot is taken before it waits)."""
    await conn.execute(_LOCK, {"t": tenant_id})


async def load(conn: AsyncConnection, tenant_id: str) -> Stored | None:
    row: Any = (await conn.execute(_LOAD, {"t": tenant_id})).first()
    return None if row is None else Stored(row.version, row.limits)


async def put(conn: AsyncConnection, tenant_id: str, limits: Limits, *, by: str) -> None:
    """Replace the tenant's ceiling; the new one has the next version (1 for the first)."""
    await conn.execute(_PUT, {"t": tenant_id, "limits": json.dumps(dict(limits)), "by": by})
