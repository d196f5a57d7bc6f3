"""Durable timers: one row per timer key; firing and marking happen in one transaction.

Because the run event, the wakeup's outbox row and ``fired_at`` commit together, a
crash between "fire" and "mark" rolls both back: each timer key fires exactly once.

The statements below ``lock_heads`` are the timer service's batch form of ``runs.append``
for the one transition it makes most, a wake: they read what the wake depends on without
the snapshot, and write a whole batch of wakes as one statement per table (arrays unnested
server-side), each run guarded by its revision and seq like ``runs.append``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import jsonb
from longrun.db.schema import timers
from longrun.errors import StaleRevision


@dataclass(frozen=True, slots=True)
class DueTimer:
    timer_key: str
    run_id: str
    kind: str
    wake_at: datetime
    payload: dict[str, Any]


async def schedule(conn: AsyncConnection, *, timer_key: str, run_id: str, kind: str, delay: float,
                   payload: dict[str, Any]) -> None:
    """Due ``delay`` seconds from now by the database's clock: the timer service compares with
    ``now()`` there, so a writer whose own clock is off cannot move a timer."""
    await conn.execute(insert(timers).values(
        timer_key=timer_key, run_id=run_id, kind=kind, wake_at=func.now() + timedelta(seconds=delay),
        payload=payload).on_conflict_do_nothing(index_elements=["timer_key"]))


# Built once: the timer service runs them every batch.
_DUE = (select(timers.c.timer_key, timers.c.run_id, timers.c.kind, timers.c.wake_at, timers.c.payload)
        .where(timers.c.fired_at.is_(None), timers.c.wake_at <= func.now())
        .order_by(timers.c.wake_at).limit(bindparam("limit")).with_for_update(skip_locked=True))
# clock_timestamp, not now(): the transaction may have started a while ago. One array
# parameter rather than an IN list, which SQLAlchemy would expand and render on every call.
_MARK_FIRED = text("UPDATE timers SET fired_at = clock_timestamp() WHERE timer_key = ANY(CAST(:keys AS text[]))")


async def due(conn: AsyncConnection, *, limit: int) -> list[DueTimer]:
    """Due, unfired timers, earliest first; rows another timer replica holds are skipped."""
    return [DueTimer(*r) for r in await conn.execute(_DUE, {"limit": limit})]


async def mark_fired(conn: AsyncConnection, timer_keys: list[str]) -> None:
    if timer_keys:
        await conn.execute(_MARK_FIRED, {"keys": timer_keys})


async def next_wake_at(conn: AsyncConnection) -> datetime | None:
    return (await conn.execute(select(func.min(timers.c.wake_at)).where(timers.c.fired_at.is_(None)))).scalar()


@dataclass(frozen=True, slots=True)
class RunHead:
    """What a wake depends on, read from a locked run without decoding its snapshot."""

    run_id: str
    tenant_id: str
    partition: int
    status: str
    revision: int
    stored_seq: int
    """``runs.last_seq``: the highest stored seq, late events included."""
    wait_id: str | None
    wait_has_timer: bool
    stage: str


@dataclass(frozen=True, slots=True)
class HeadWrite:
    """One run's share of a batch: its event at ``seq``, guarded by the head it was planned from."""

    head: RunHead
    seq: int
    event: dict[str, Any]
    """The event as ``events.event_to_dict`` stores it."""
    patch: dict[str, Any] | None
    """Top-level snapshot keys the event changed (None: stored late, the snapshot stays)."""


_LOCK_HEADS = text(
    "SELECT run_id, tenant_id, partition, status, revision, last_seq, "
    "       snapshot #>> '{wait,wait_id}' AS wait_id, "
    "       (snapshot #>> '{wait,wake_at}') IS NOT NULL AS wait_has_timer, "
    "       coalesce(snapshot ->> 'stage', '') AS stage "
    "FROM runs WHERE run_id = ANY(CAST(:run_ids AS text[])) ORDER BY run_id FOR UPDATE")
# Rows travel as one JSON array (arrays of JSON text would be escaped element by element on the
# client). The wake clears the pending wait, so its projected columns go with it; ``snapshot ||
# patch`` replaces exactly the top-level keys the domain changed (checked by the caller on one run).
_APPLY = text(
    "UPDATE runs AS r SET snapshot = r.snapshot || w.patch, status = :status, revision = w.revision + 1, "
    "       last_seq = w.seq, wait_kind = NULL, wait_correlation_key = NULL, wait_deadline = NULL, "
    "       approval_id = NULL, approval_owner = NULL, approved_hash = NULL, updated_at = now() "
    "FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS w(run_id text, revision bigint, stored bigint, seq bigint, "
    "                                                  patch jsonb) "
    "WHERE r.run_id = w.run_id AND r.revision = w.revision AND r.last_seq = w.stored")
_STORE_LATE = text(
    "UPDATE runs AS r SET last_seq = w.seq, updated_at = now() "
    "FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS w(run_id text, revision bigint, stored bigint, seq bigint) "
    "WHERE r.run_id = w.run_id AND r.revision = w.revision AND r.last_seq = w.stored")
_INSERT_EVENTS = text(
    "INSERT INTO run_events (run_id, seq, event_id, type, data, applied, occurred_at) "
    "SELECT run_id, seq, run_id || ':' || seq, data ->> 'type', data, applied, :occurred_at "
    "FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS e(run_id text, seq bigint, data jsonb, applied boolean)")


async def lock_heads(conn: AsyncConnection, run_ids: Sequence[str]) -> dict[str, RunHead]:
    """Lock the runs in run_id order (as ``runs.load_many`` does, so batches cannot deadlock)."""
    rows = await conn.execute(_LOCK_HEADS, {"run_ids": sorted(set(run_ids))})
    # Columns in RunHead's field order: plain tuples, not attribute lookups on rows (10,000 at once).
    return {r[0]: RunHead(*r) for r in rows}


async def write_heads(conn: AsyncConnection, writes: Sequence[HeadWrite], *, status: str,
                      occurred_at: datetime) -> None:
    """Store each write's event; apply its patch (the run moves to ``status``) or, without one, keep it late.

    Every run must be locked by ``lock_heads`` in this transaction and unchanged since.
    """
    if not writes:
        return
    for late in (False, True):
        group = [w for w in writes if (w.patch is None) is late]
        if not group:
            continue
        rows = [{"run_id": w.head.run_id, "revision": w.head.revision, "stored": w.head.stored_seq, "seq": w.seq,
                 "patch": w.patch} for w in group]
        if late:
            result = await conn.execute(_STORE_LATE, {"rows": jsonb.dumps(rows)})
        else:
            result = await conn.execute(_APPLY, {"rows": jsonb.dumps(rows), "status": status})
        if result.rowcount != len(group):
            raise StaleRevision(group[0].head.run_id, group[0].head.revision)
    await conn.execute(_INSERT_EVENTS, {"occurred_at": occurred_at, "rows": jsonb.dumps([
        {"run_id": w.head.run_id, "seq": w.seq, "data": w.event, "applied": w.patch is not None} for w in writes])})
