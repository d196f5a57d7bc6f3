"""The reads behind the operator API and the web console: run search, the audit log, and the small
lookups a route makes before it answers (a run's tenant, its next timer).

``tenants`` narrows a read to those tenants (None: every tenant), so a caller scoped to some tenants
never learns of another's runs, not even that they exist. Lists are keyset pages (``db.pages``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import Row, exists, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import keys, pages
from longrun.db.schema import run_labels, runs
from longrun.db.schema_tenants import audit_log

RUN_FILTERS = ("tenant_id", "status", "wait_kind", "workflow_version", "idempotency_key")
"""The columns a run search compares for equality."""
AUDIT_FILTERS = ("actor", "action", "target")

_NEXT_TIMER = text("SELECT kind, wake_at FROM timers WHERE run_id = :r AND fired_at IS NULL AND cancelled_at IS NULL "
                   "ORDER BY wake_at LIMIT 1")


async def search_runs(conn: AsyncConnection, *, equal: Mapping[str, str | None], labels: Sequence[tuple[str, str]],
                      older_than: str | None, idle_for: str | None, cursor: str | None, limit: int | None,
                      tenants: Collection[str] | None,
                      waiting_for: str | None = None) -> tuple[list[Row[Any]], str | None]:
    """Runs whose ``RUN_FILTERS`` columns equal the values ``equal`` gives them, parked on
    ``waiting_for`` (``<wait kind>:<what>``, its wait's correlation key), carrying every
    label, created more than ``older_than`` ago and unchanged for ``idle_for``: newest first, one
    page and the next cursor. ValueError names a cursor or an age that is not one."""
    query = select(runs.c.run_id, runs.c.tenant_id, runs.c.status, runs.c.workflow, runs.c.workflow_version,
                   runs.c.wait_kind, runs.c.awaiting_worker, runs.c.idempotency_key, runs.c.created_at,
                   runs.c.snapshot["labels"].label("labels"), runs.c.updated_at,
                   keys.WAITING_FOR_KEY.label("waiting_for"))
    if tenants is not None:
        query = query.where(runs.c.tenant_id.in_(sorted(tenants)))
    for column in RUN_FILTERS:
        if equal.get(column):
            query = query.where(runs.c[column] == equal[column])
    if waiting_for:
        # Through ix_runs_wait_correlation_key: the held runs, however many others there are.
        kind = waiting_for.partition(":")[0]
        query = query.where(runs.c.wait_correlation_key == waiting_for, runs.c.wait_kind == kind)
    for key, value in labels:
        query = query.where(exists().where(run_labels.c.run_id == runs.c.run_id, run_labels.c.key == key,
                                           run_labels.c.value == value))
    if older_than:
        query = query.where(pages.older_than("older_than", older_than, runs.c.created_at))
    if idle_for:
        query = query.where(pages.older_than("idle_for", idle_for, runs.c.updated_at))
    return await pages.newest_first(conn, query, cursor_raw=cursor, page_size=limit, created=runs.c.created_at,
                                    row_id=runs.c.run_id)


async def audit_entries(conn: AsyncConnection, *, equal: Mapping[str, str | None], action_prefix: str | None,
                        cursor: str | None, limit: int | None,
                        tenants: Collection[str] | None) -> tuple[list[Row[Any]], str | None]:
    """Audit entries whose ``AUDIT_FILTERS`` columns equal the values ``equal`` gives them and whose
    action starts with ``action_prefix``, newest first, a page at a time (as ``search_runs``).
    Narrowed to ``tenants``: the entries that concern one of them (``audit_log.tenant_id``)."""
    query = select(audit_log.c.id, audit_log.c.at, audit_log.c.actor, audit_log.c.action, audit_log.c.target,
                   audit_log.c.reason, audit_log.c.details)
    for column in AUDIT_FILTERS:
        if equal.get(column):
            query = query.where(audit_log.c[column] == equal[column])
    if action_prefix is not None:
        query = query.where(audit_log.c.action.startswith(action_prefix))
    if tenants is not None:
        query = query.where(audit_log.c.tenant_id.in_(sorted(tenants)))
    return await pages.newest_first(conn, query, cursor_raw=cursor, page_size=limit, created=audit_log.c.at,
                                    row_id=audit_log.c.id)


async def tenant_of(conn: AsyncConnection, run_id: str) -> str | None:
    """The run's tenant (it never changes), or None when there is no such run."""
    return (await conn.execute(select(runs.c.tenant_id).where(runs.c.run_id == run_id))).scalar()


async def tenant_and_status(conn: AsyncConnection, run_id: str) -> tuple[str, str] | None:
    """The run's tenant and status, or None when there is no such run."""
    row = (await conn.execute(select(runs.c.tenant_id, runs.c.status).where(runs.c.run_id == run_id))).first()
    return None if row is None else (row.tenant_id, row.status)


async def awaiting_worker(conn: AsyncConnection, run_id: str) -> str | None:
    """The versions the run waits for a compatible worker to serve, or None."""
    return (await conn.execute(select(runs.c.awaiting_worker).where(runs.c.run_id == run_id))).scalar()


async def next_timer(conn: AsyncConnection, run_id: str) -> Row[Any] | None:
    """The run's next pending timer (``kind``, ``wake_at``), or None."""
    return (await conn.execute(_NEXT_TIMER, {"r": run_id})).first()

