"""Retention's statements: delete what a horizon no longer keeps, a bounded batch at a time, and
archive finished runs.

Every rule names its table and what makes a row of it done and old (``:before`` is the cutoff).
A rule's rows are deleted block range by block range (``ctid``, a TID range scan: no index is
needed, so the tables' writers pay nothing for retention), at most ``limit`` rows per statement,
each row re-checked by the delete itself: a row revived in between (a member's heartbeat) is left.
Finished runs are archived through ``ix_runs_to_archive``; a run that is not finished is never
read, locked or changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import CONSUMING_SERVICES, TO_ARCHIVE, inboxes, sql_names
from longrun.domain import ActionStatus

ARCHIVE_MEDIA_TYPE = "application/x-ndjson"
"""A finished run's archive: its events, one JSON object a line."""


@dataclass(frozen=True, slots=True)
class Rule:
    table: str
    done: str
    """SQL over one row of ``table``: it is done with and older than ``:before``."""


RULES: dict[str, Rule] = {
    "outbox": Rule("outbox", "published_at < :before"),
    **{f"inbox_{service}": Rule(inboxes[service].name, "handled_at < :before") for service in CONSUMING_SERVICES},
    # A timer of an archived run can only wake a finished run, which it never does: it goes too.
    "timers": Rule("timers", "fired_at < :before OR cancelled_at < :before OR (fired_at IS NULL AND EXISTS "
                   "(SELECT 1 FROM runs r WHERE r.run_id = timers.run_id AND r.archived_at IS NOT NULL))"),
    "webhook_events": Rule("webhook_events", "matched_at < :before"),
    "webhook_events_unmatched": Rule("webhook_events", "matched_run_id IS NULL AND received_at < :before"),
    "delivery_failures": Rule("delivery_failures", "last_failure_at < :before"),
    "quarantine": Rule("quarantine", "replayed_at < :before"),
    "service_members": Rule("service_members", "alive_until < :before"),
    "audit_log": Rule("audit_log", "at < :before"),
}


async def database_now(conn: AsyncConnection) -> datetime:
    """The database's clock: every row's time was stamped by it."""
    return (await conn.execute(text("SELECT now()"))).scalar_one()  # type: ignore[no-any-return]


async def blocks(conn: AsyncConnection, table: str) -> int:
    """How many blocks ``table`` has now (rows added later land past them, and are young)."""
    return int((await conn.execute(text(
        "SELECT pg_relation_size(CAST(:t AS regclass)) / current_setting('block_size')::int"),
        {"t": table})).scalar_one())


async def delete_done(conn: AsyncConnection, rule: str, *, before: datetime, first_block: int, end_block: int,
                      limit: int) -> int:
    """Delete at most ``limit`` rows of ``rule`` stored in blocks [first_block, end_block); their count."""
    table, done = RULES[rule].table, RULES[rule].done
    result = await conn.execute(text(
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM {table} WHERE ctid >= CAST(:first AS tid) AND ctid < CAST(:end AS tid) AND ({done}) "
        f"LIMIT :limit)) AND ({done})"),
        {"first": f"({first_block},0)", "end": f"({end_block},0)", "before": before, "limit": limit})
    return int(result.rowcount)


_UNSETTLED = sql_names((ActionStatus.UNKNOWN, ActionStatus.RECONCILING))
# Oldest first through ix_runs_to_archive, after a (created_at, run_id) cursor. A run with an action
# the reconciler still settles, or a cleanup not yet done, waits for it; one a writer holds (a late
# event) waits for a next batch.
_TO_ARCHIVE = text(
    f"SELECT run_id, created_at FROM runs WHERE {TO_ARCHIVE} AND created_at < :before "
    "AND (created_at, run_id) > (:after_at, :after_id) "
    "ORDER BY created_at, run_id LIMIT :limit FOR UPDATE SKIP LOCKED")
_SETTLED = text(
    "SELECT run_id FROM runs WHERE run_id = ANY(:ids) AND updated_at < :before AND NOT EXISTS ("
    f"SELECT 1 FROM actions a WHERE a.run_id = runs.run_id AND a.status IN ({_UNSETTLED})) "
    "AND NOT EXISTS (SELECT 1 FROM cleanups c WHERE c.run_id = runs.run_id AND c.done_at IS NULL)")


@dataclass(frozen=True, slots=True)
class Candidates:
    run_ids: list[str]
    """Finished, last changed before the cutoff, nothing left to settle: locked until commit."""
    after: tuple[datetime, str] | None
    """Where the next batch starts; None when no finished run is left before the cutoff."""


async def finished_runs(conn: AsyncConnection, *, before: datetime, after: tuple[datetime, str] | None,
                        limit: int) -> Candidates:
    """Up to ``limit`` finished, unarchived runs created before ``before`` (after the cursor ``after``),
    of which those also last changed before it and with every action settled."""
    after_at, after_id = after or (datetime.min.replace(tzinfo=before.tzinfo), "")
    rows = (await conn.execute(_TO_ARCHIVE, {"before": before, "after_at": after_at, "after_id": after_id,
                                             "limit": limit})).all()
    if not rows:
        return Candidates([], None)
    settled = set((await conn.execute(_SETTLED, {"ids": [r.run_id for r in rows], "before": before})).scalars())
    return Candidates([r.run_id for r in rows if r.run_id in settled], (rows[-1].created_at, rows[-1].run_id))


_RUN_FIELDS = ("run_id", "tenant_id", "idempotency_key", "input_hash", "workflow", "workflow_version", "status",
               "created_at", "updated_at")


async def archived_rows(conn: AsyncConnection, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """What the archive of ``run_ids`` holds: per run its tombstone's fields, then its events in
    seq order, then its actions, each a record naming its kind (``run``, ``event``, ``action``)."""
    ids = sorted(run_ids)
    heads = (await conn.execute(text(f"SELECT {', '.join(_RUN_FIELDS)} FROM runs WHERE run_id = ANY(:ids)"),
                                {"ids": ids})).all()
    events = (await conn.execute(text(
        "SELECT run_id, seq, event_id, type, data, applied, fencing_token, occurred_at, recorded_at "
        "FROM run_events WHERE run_id = ANY(:ids) ORDER BY run_id, seq"), {"ids": ids})).all()
    actions = (await conn.execute(text(
        "SELECT * FROM actions WHERE run_id = ANY(:ids) ORDER BY run_id, created_at, action_id"), {"ids": ids})).all()
    records: dict[str, list[dict[str, Any]]] = {r.run_id: [{"record": "run", **r._asdict()}] for r in heads}
    for kind, rows in (("event", events), ("action", actions)):
        for row in rows:
            records[row.run_id].append({"record": kind, **row._asdict()})
    return [record for run_id in ids for record in records[run_id]]


async def prune_archived(conn: AsyncConnection, run_ids: Sequence[str], archive: str) -> tuple[int, int]:
    """Delete the events and actions of ``run_ids`` (locked, finished) and mark them archived in
    ``archive``; (events, actions) deleted."""
    ids = list(run_ids)
    # Marked first: run_events refuses every delete but an archived run's (migration 0014).
    await conn.execute(text(f"UPDATE runs SET archived_at = now(), archive = :archive "
                            f"WHERE run_id = ANY(:ids) AND {TO_ARCHIVE}"), {"ids": ids, "archive": archive})
    events = await conn.execute(text("DELETE FROM run_events WHERE run_id = ANY(:ids)"), {"ids": ids})
    actions = await conn.execute(text("DELETE FROM actions WHERE run_id = ANY(:ids)"), {"ids": ids})
    return int(events.rowcount), int(actions.rowcount)


@dataclass(frozen=True, slots=True)
class Archived:
    at: datetime
    archive: str
    """The archive's content hash in the artifact store."""
    location: str


async def archive_of(conn: AsyncConnection, run_id: str) -> Archived | None:
    """Where a run's pruned events and actions are, if they were archived."""
    row = (await conn.execute(text(
        "SELECT r.archived_at, r.archive, a.location FROM runs r "
        "JOIN artifacts a ON a.tenant_id = '' AND a.content_hash = r.archive "
        "WHERE r.run_id = :r"), {"r": run_id})).first()
    return None if row is None else Archived(row.archived_at, row.archive, row.location)
