"""The audit log: who did what to which target, and why, in the transaction that did it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema_tenants import audit_log
from longrun.db.schema import runs as runs_table


async def audit(conn: AsyncConnection, *, actor: str, action: str, target: str, reason: str,
                details: dict[str, Any] | None = None, tenant: str | ColumnElement[str] | None = None) -> None:
    """One audit entry; ``tenant``: the tenant it concerns (``tenant_of_run`` for an entry about a
    run), which alone decides which tenants' viewers see it."""
    await conn.execute(audit_log.insert().values(actor=actor, action=action, target=target, reason=reason,
                                                 details=details or {}, tenant_id=tenant))


def tenant_of_run(run_id: str) -> ColumnElement[str]:
    """The tenant of the run ``run_id``, read in the statement that writes the entry."""
    return select(runs_table.c.tenant_id).where(runs_table.c.run_id == run_id).scalar_subquery()
