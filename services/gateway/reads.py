"""What the gateway shows of runs and the audit log, as JSON-ready dicts read through
``longrun.db.operator_reads``, called by the operator API (``longrun.services.gateway.http``) and the web
console (``longrun.services.gateway.console``).

``tenants`` narrows every read to the runs of those tenants (None: every tenant), so a caller
scoped to some tenants never learns of another's runs, not even that they exist.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.app.gateway import operate
from longrun.app.reconciler.common import ALERT_PREFIX
from longrun.db import actions as ledger
from longrun.db import children, keys, operator_reads, retention, runs
from longrun.domain import RunSnapshot, event_to_dict
from longrun.domain.rate_limit import RATE_LIMIT_WAIT
from longrun.domain.signals import SIGNAL_WAIT
from longrun.domain.tool_permits import TOOL_CONCURRENCY_WAIT
from longrun.services.gateway import api

SHOWN_WAITS = (RATE_LIMIT_WAIT, TOOL_CONCURRENCY_WAIT, SIGNAL_WAIT)
"""The waits whose key a run's view shows as what it waits for."""


async def search_runs(conn: AsyncConnection, params: api.RunSearch,
                      tenants: Collection[str] | None = None) -> dict[str, Any]:
    """Runs matching every filter given, newest first, a page at a time: ``limit`` (default 50, at
    most 500) and the ``next_cursor`` of the page before (None on the last page). ValueError names
    a cursor or an age that is not one."""
    page, next_cursor = await operator_reads.search_runs(
        conn, equal={column: getattr(params, column) for column in operator_reads.RUN_FILTERS},
        waiting_for=params.waiting_for, labels=[(key, value) for key, _, value in (label.partition("=") for label in params.label)],
        older_than=params.older_than, idle_for=params.idle_for, cursor=params.cursor, limit=params.limit,
        tenants=tenants)
    return {"runs": [{**r._mapping, "labels": r.labels or {}, "created_at": r.created_at.isoformat(),
                      "updated_at": r.updated_at.isoformat()} for r in page],
            "next_cursor": next_cursor}


async def run_view(conn: AsyncConnection, run_id: str,
                   tenants: Collection[str] | None = None) -> dict[str, Any] | None:
    """``GET /runs/{id}``: the run's snapshot, calls, lease, next timer, what it waits for, the
    operations allowed now, its parent and children, and its events; None when there is no such run (for these tenants).
    An archived run's events and actions were pruned: the answer says where they went."""
    stored = await runs.load(conn, run_id)
    if stored is None or (tenants is not None and stored.snapshot.tenant_id not in tenants):
        return None
    history = await runs.history(conn, stored.snapshot.run_id)
    needs = await operator_reads.awaiting_worker(conn, stored.snapshot.run_id)
    key = await keys.waiting_for(conn, stored.snapshot.run_id)
    archived = await retention.archive_of(conn, stored.snapshot.run_id)
    next_timer = await operator_reads.next_timer(conn, stored.snapshot.run_id)
    calls = await ledger.for_run(conn, stored.snapshot.run_id)
    family = await children.related(conn, stored.snapshot.run_id)
    return {"snapshot": stored.snapshot.to_dict(),
            "actions": [_call(row) for row in calls],
            "lease": None if stored.lease_owner is None else {
                "owner": stored.lease_owner, "fencing_token": stored.fencing_token,
                "until": stored.lease_until.isoformat() if stored.lease_until else None},
            "next_timer": None if next_timer is None else {
                "kind": next_timer.kind, "wake_at": next_timer.wake_at.isoformat()},
            "allowed_operations": operate.allowed_operations(stored.snapshot),
            "waiting_for": f"a compatible worker: {needs}" if needs else key or waiting_for(stored.snapshot),
            "archived": None if archived is None else {
                "at": archived.at.isoformat(), "archive": archived.archive,
                "location": archived.location, "media_type": retention.ARCHIVE_MEDIA_TYPE},
            "parent": None if family.parent is None else {"run_id": family.parent, "name": family.name},
            "children": [{"name": name, "run_id": child, "status": status} for name, child, status in family.children],
            "events": [event_to_dict(e) for e in history]}


async def audit_entries(conn: AsyncConnection, params: api.AuditSearch, *, alerts_only: bool = False,
                        tenants: Collection[str] | None = None) -> dict[str, Any]:
    """The audit log, newest first, a page at a time (as ``search_runs``), filtered by ``actor``,
    ``action``, ``target``; ``alerts_only``: the part of it the reconciler raised (``alert.*``).
    Narrowed to ``tenants``: the entries that concern one of them."""
    page, next_cursor = await operator_reads.audit_entries(
        conn, equal={column: getattr(params, column) for column in operator_reads.AUDIT_FILTERS},
        action_prefix=ALERT_PREFIX if alerts_only else None, cursor=params.cursor, limit=params.limit,
        tenants=tenants)
    return {"entries": [{**r._mapping, "at": r.at.isoformat()} for r in page], "next_cursor": next_cursor}


def waiting_for(run: RunSnapshot) -> str | None:
    """What a parked run's view says it waits for: ``rate_limit:<limit name>`` for its place in line,
    ``tool_concurrency:<group>`` for a permit of its tenant's tool group, ``signal:<name>`` for a signal."""
    wait = run.wait
    return wait.correlation_key if wait is not None and wait.kind in SHOWN_WAITS else None


def _call(row: ledger.LedgerRow) -> dict[str, Any]:
    """A ledger row as ``GET /runs/{id}`` shows it: the call, its status and attempts, and what its
    heartbeats last reported (``progress``, recorded at ``heartbeat_at``)."""
    return {"logical_action": row.logical_action, "tool": row.tool, "effect_kind": row.effect_kind,
            "status": row.status, "attempts": row.attempts, "external_id": row.external_id,
            "progress": row.progress,
            "heartbeat_at": None if row.heartbeat_at is None else row.heartbeat_at.isoformat()}
