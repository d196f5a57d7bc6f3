"""What the gateway shows of runs and the audit log, as JSON-ready dicts: one query each, called by
the operator API (``services.gateway.http``) and the web console (``services.gateway.console``).

``tenants`` narrows every read to the runs of those tenants (None: every tenant), so a caller
scoped to some tenants never learns of another's runs, not even that they exist.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import exists, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.app import operate
from longrun.app.reconcile_alerts import ALERT_PREFIX
from longrun.app.retention import ARCHIVE_MEDIA_TYPE
from longrun.db import actions as ledger
from longrun.db import pages, retention, runs
from longrun.db.schema import audit_log, run_labels
from longrun.db.schema import runs as runs_table
from longrun.domain import event_to_dict
from services.gateway import api

_NEXT_TIMER = text("SELECT kind, wake_at FROM timers WHERE run_id = :r AND fired_at IS NULL AND cancelled_at IS NULL "
                   "ORDER BY wake_at LIMIT 1")


async def search_runs(conn: AsyncConnection, params: api.RunSearch,
                      tenants: Collection[str] | None = None) -> dict[str, Any]:
    """Runs matching every filter given, newest first, a page at a time: ``limit`` (default 50, at
    most 500) and the ``next_cursor`` of the page before (None on the last page). ValueError names
    a cursor or an age that is not one."""
    query = select(runs_table.c.run_id, runs_table.c.tenant_id, runs_table.c.status, runs_table.c.workflow,
                   runs_table.c.workflow_version, runs_table.c.wait_kind, runs_table.c.awaiting_worker,
                   runs_table.c.idempotency_key, runs_table.c.created_at,
                   runs_table.c.snapshot["labels"].label("labels"), runs_table.c.updated_at)
    if tenants is not None:
        query = query.where(runs_table.c.tenant_id.in_(sorted(tenants)))
    for column in ("tenant_id", "status", "wait_kind", "workflow_version", "idempotency_key"):
        if getattr(params, column):
            query = query.where(runs_table.c[column] == getattr(params, column))
    for label in params.label:
        key, _, value = label.partition("=")
        query = query.where(exists().where(run_labels.c.run_id == runs_table.c.run_id,
                                           run_labels.c.key == key, run_labels.c.value == value))
    # Age: created more than a duration ago (older_than), or unchanged for one (idle_for).
    for name, column in (("older_than", runs_table.c.created_at), ("idle_for", runs_table.c.updated_at)):
        if getattr(params, name):
            query = query.where(pages.older_than(name, getattr(params, name), column))
    page, next_cursor = await pages.newest_first(conn, query, cursor_raw=params.cursor, page_size=params.limit,
                                                 created=runs_table.c.created_at, row_id=runs_table.c.run_id)
    return {"runs": [{**r._mapping, "labels": r.labels or {}, "created_at": r.created_at.isoformat(),
                      "updated_at": r.updated_at.isoformat()} for r in page],
            "next_cursor": next_cursor}


async def run_view(conn: AsyncConnection, run_id: str,
                   tenants: Collection[str] | None = None) -> dict[str, Any] | None:
    """``GET /runs/{id}``: the run's snapshot, calls, lease, next timer, what it waits for, the
    operations allowed now and its events; None when there is no such run (for these tenants).
    An archived run's events and actions were pruned: the answer says where they went."""
    stored = await runs.load(conn, run_id)
    if stored is None or (tenants is not None and stored.snapshot.tenant_id not in tenants):
        return None
    history = await runs.history(conn, stored.snapshot.run_id)
    needs = (await conn.execute(select(runs_table.c.awaiting_worker).where(
        runs_table.c.run_id == stored.snapshot.run_id))).scalar()
    archived = await retention.archive_of(conn, stored.snapshot.run_id)
    next_timer = (await conn.execute(_NEXT_TIMER, {"r": stored.snapshot.run_id})).first()
    calls = await ledger.for_run(conn, stored.snapshot.run_id)
    return {"snapshot": stored.snapshot.to_dict(),
            "actions": [_call(row) for row in calls],
            "lease": None if stored.lease_owner is None else {
                "owner": stored.lease_owner, "fencing_token": stored.fencing_token,
                "until": stored.lease_until.isoformat() if stored.lease_until else None},
            "next_timer": None if next_timer is None else {
                "kind": next_timer.kind, "wake_at": next_timer.wake_at.isoformat()},
            "allowed_operations": operate.allowed_operations(stored.snapshot),
            "waiting_for": f"a compatible worker: {needs}" if needs else None,
            "archived": None if archived is None else {
                "at": archived.at.isoformat(), "archive": archived.archive,
                "location": archived.location, "media_type": ARCHIVE_MEDIA_TYPE},
            "events": [event_to_dict(e) for e in history]}


async def audit_entries(conn: AsyncConnection, params: api.AuditSearch, *, alerts_only: bool = False,
                        tenants: Collection[str] | None = None) -> dict[str, Any]:
    """The audit log, newest first, a page at a time (as ``search_runs``), filtered by ``actor``,
    ``action``, ``target``; ``alerts_only``: the part of it the reconciler raised (``alert.*``).
    Narrowed to ``tenants``: the entries whose target is one of their runs or one of them."""
    query = select(audit_log)
    for column in ("actor", "action", "target"):
        if getattr(params, column):
            query = query.where(audit_log.c[column] == getattr(params, column))
    if alerts_only:
        query = query.where(audit_log.c.action.startswith(ALERT_PREFIX))
    if tenants is not None:
        seen = sorted(tenants)
        query = query.where(or_(audit_log.c.target.in_(seen), exists().where(
            runs_table.c.run_id == audit_log.c.target, runs_table.c.tenant_id.in_(seen))))
    page, next_cursor = await pages.newest_first(conn, query, cursor_raw=params.cursor, page_size=params.limit,
                                                 created=audit_log.c.at, row_id=audit_log.c.id)
    return {"entries": [{**r._mapping, "at": r.at.isoformat()} for r in page], "next_cursor": next_cursor}


def _call(row: ledger.LedgerRow) -> dict[str, Any]:
    """A ledger row as ``GET /runs/{id}`` shows it: the call, its status and attempts, and what its
    heartbeats last reported (``progress``, recorded at ``heartbeat_at``)."""
    return {"logical_action": row.logical_action, "tool": row.tool, "effect_kind": row.effect_kind,
            "status": row.status, "attempts": row.attempts, "external_id": row.external_id,
            "progress": row.progress,
            "heartbeat_at": None if row.heartbeat_at is None else row.heartbeat_at.isoformat()}
