"""Durable timers: one row per timer key; firing and marking happen in one transaction.

Because the run event, the wakeup's outbox row and ``fired_at`` commit together, a
crash between "fire" and "mark" rolls both back: each timer key fires exactly once.

The statements below ``lock_heads`` are the timer service's batch form of ``runs.append``
for the one transition it makes most, a wake: they read what the wake depends on without
the snapshot, and write a whole batch of wakes as one statement: every row is rendered by
PostgreSQL from one template and each wake's run and wait, each run guarded by its revision
and seq like ``runs.append``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import jsonb, outbox
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


@dataclass(frozen=True, slots=True)
class NextWakes:
    """When the next unfired timers come due, in seconds from now by the database's clock (<= 0: due)."""

    first_in: float | None
    """The earliest; None when no timer is unfired."""
    batch_in: float | None
    """The ``limit``-th earliest, when a whole batch of that many is due; None when fewer are unfired."""


# At most ``limit`` entries of the due index, whatever the number of timers waiting.
_NEXT_WAKES = text(
    "SELECT extract(epoch FROM min(wake_at) - now()), extract(epoch FROM max(wake_at) - now()), count(*) "
    "FROM (SELECT wake_at FROM timers WHERE fired_at IS NULL ORDER BY wake_at LIMIT :limit) AS next")


async def next_wakes(conn: AsyncConnection, *, limit: int) -> NextWakes:
    first, last, count = (await conn.execute(_NEXT_WAKES, {"limit": limit})).one()
    return NextWakes(None if first is None else float(first), float(last) if count == limit else None)


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


_LOCK_HEADS = text(
    "SELECT run_id, tenant_id, partition, status, revision, last_seq, "
    "       snapshot #>> '{wait,wait_id}' AS wait_id, "
    "       (snapshot #>> '{wait,wake_at}') IS NOT NULL AS wait_has_timer, "
    "       coalesce(snapshot ->> 'stage', '') AS stage "
    "FROM runs WHERE run_id = ANY(CAST(:run_ids AS text[])) ORDER BY run_id FOR UPDATE")
@dataclass(frozen=True, slots=True)
class WakeTemplate:
    """What every wake of a batch writes, learnt from one run's full transition through the domain.

    Each wake writes these with its own run and wait filled in by PostgreSQL (``_RENDERED``), so
    a batch of wakes is one statement whatever its size, and no row is built in Python.
    """

    event: dict[str, Any]
    """The ``RunWoken`` as ``events.event_to_dict`` stores it."""
    patch: dict[str, Any] | None
    """Top-level snapshot keys the wake changed; None when every wake of the batch is late."""
    wakeup: outbox.Plain | None
    broadcast: outbox.Plain | None


@dataclass(frozen=True, slots=True)
class Wake:
    """One timer's wake of its run, guarded by the head it was decided on."""

    head: RunHead
    wait_id: str
    reason: str
    applies: bool
    """False: stored late (``applied = false``), the run unchanged, no message."""
    wake_reason: str
    """The reason its ``run.wakeup`` gives."""
    routing_key: str
    """Where its ``run.wakeup`` goes (its run's partition)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """A wake's rows as the batch statement writes them (fresh message ids included)."""

    event: dict[str, Any]
    patch: dict[str, Any] | None
    messages: list[outbox.Plain]


# The template and the wakes (one JSON array of objects) are read once per statement, not per row.
_INPUTS = (
    "t AS MATERIALIZED (SELECT CAST(:event AS jsonb) AS event, CAST(:patch AS jsonb) AS patch, "
    "                          CAST(:wakeup AS jsonb) AS wakeup, CAST(:broadcast AS jsonb) AS broadcast), "
    "w AS MATERIALIZED (SELECT * FROM jsonb_to_recordset(CAST(:wakes AS jsonb)) AS w("
    "    n bigint, run_id text, tenant_id text, partition smallint, status text, stage text, revision bigint, "
    "    stored bigint, wait_id text, reason text, applies boolean, wake_reason text, routing_key text))")
# Per wake: what the template becomes for its run (the keys the domain sets per run and per wait).
_RENDERED = {
    "event": "t.event || jsonb_build_object('seq', w.stored + 1, 'wait_id', w.wait_id, 'reason', w.reason)",
    "patch": "t.patch || jsonb_build_object('revision', w.revision + 1, 'last_seq', w.stored + 1, 'last_wake', "
             "  (t.patch -> 'last_wake') || jsonb_build_object('wait_id', w.wait_id, 'reason', w.reason))",
    "wakeup": "t.wakeup || jsonb_build_object('routing_key', w.routing_key, 'partition', w.partition, 'envelope', "
              "  (t.wakeup -> 'envelope') || jsonb_build_object('tenant_id', w.tenant_id, 'run_id', w.run_id, "
              "    'event_id', CAST(gen_random_uuid() AS text), 'expected_state_version', w.revision + 1, "
              "    'payload', (t.wakeup #> '{envelope,payload}') || jsonb_build_object("
              "      'wakeup_id', CAST(gen_random_uuid() AS text), 'reason', w.wake_reason)))",
    "broadcast": "t.broadcast || jsonb_build_object('partition', w.partition, 'envelope', "
                 "  (t.broadcast -> 'envelope') || jsonb_build_object('tenant_id', w.tenant_id, 'run_id', w.run_id, "
                 "    'event_id', CAST(gen_random_uuid() AS text), "
                 "    'payload', (t.broadcast #> '{envelope,payload}') || jsonb_build_object('seq', w.stored + 1, "
                 "      'data', (t.broadcast #> '{envelope,payload,data}') || jsonb_build_object("
                 "        'from', w.status, 'stage', w.stage))))",
}
_RENDER = text(f"WITH {_INPUTS} SELECT " + ", ".join(f"{sql} AS {name}" for name, sql in _RENDERED.items())
               + " FROM w CROSS JOIN t ORDER BY w.n")
# A wake clears the pending wait, so its projected columns go with it; ``snapshot || patch``
# replaces exactly the top-level keys the domain changed. Events and messages are written only
# for runs whose guard (revision and seq, as in ``runs.append``) matched.
_WRITE = text(
    f"WITH {_INPUTS}, "
    "applied AS ("
    f"  UPDATE runs AS r SET snapshot = r.snapshot || ({_RENDERED['patch']}), status = :status, "
    "         revision = w.revision + 1, last_seq = w.stored + 1, wait_kind = NULL, wait_correlation_key = NULL, "
    "         wait_deadline = NULL, approval_id = NULL, approval_owner = NULL, approved_hash = NULL, "
    "         updated_at = now() "
    "  FROM w CROSS JOIN t "
    "  WHERE w.applies AND r.run_id = w.run_id AND r.revision = w.revision AND r.last_seq = w.stored "
    "  RETURNING r.run_id), "
    "late AS ("
    "  UPDATE runs AS r SET last_seq = w.stored + 1, updated_at = now() FROM w "
    "  WHERE NOT w.applies AND r.run_id = w.run_id AND r.revision = w.revision AND r.last_seq = w.stored "
    "  RETURNING r.run_id), "
    "events AS ("
    "  INSERT INTO run_events (run_id, seq, event_id, type, data, applied, occurred_at) "
    f"  SELECT w.run_id, w.stored + 1, w.run_id || ':' || (w.stored + 1), t.event ->> 'type', {_RENDERED['event']}, "
    "         w.applies, :occurred_at "
    "  FROM w CROSS JOIN t WHERE w.run_id IN (SELECT run_id FROM applied UNION ALL SELECT run_id FROM late)), "
    "sent AS (" + outbox.insert_sql(
        "(SELECT x.row, row_number() OVER (ORDER BY w.n, x.k) AS n FROM w CROSS JOIN t CROSS JOIN LATERAL "
        f"  (VALUES (1, {_RENDERED['wakeup']}), (2, {_RENDERED['broadcast']})) AS x(k, row) "
        "  WHERE w.run_id IN (SELECT run_id FROM applied)) AS r") + ") "
    "SELECT (SELECT count(*) FROM applied), (SELECT count(*) FROM late)")


async def lock_heads(conn: AsyncConnection, run_ids: Sequence[str]) -> dict[str, RunHead]:
    """Lock the runs in run_id order (as ``runs.load_many`` does, so batches cannot deadlock)."""
    rows = await conn.execute(_LOCK_HEADS, {"run_ids": sorted(set(run_ids))})
    # Columns in RunHead's field order: plain tuples, not attribute lookups on rows (10,000 at once).
    return {r[0]: RunHead(*r) for r in rows}


async def render_wake(conn: AsyncConnection, template: WakeTemplate, wake: Wake) -> Rendered:
    """What ``write_wakes`` would write for ``wake``, without writing it: to check a template against the domain."""
    row = (await conn.execute(_RENDER, _params(template, [wake]))).one()
    messages = [outbox.Plain(**m) for m in (row.wakeup, row.broadcast) if m is not None]
    return Rendered(row.event, row.patch, messages)


async def write_wakes(conn: AsyncConnection, template: WakeTemplate, wakes: Sequence[Wake], *, status: str,
                      occurred_at: datetime) -> None:
    """Store each wake's event; a wake that applies moves its run to ``status`` and sends its wakeup and
    broadcast, a late one only stores its event. One statement for the whole batch.

    Every run must be locked by ``lock_heads`` in this transaction and unchanged since.
    """
    if not wakes:
        return
    params = {**_params(template, wakes), "status": status, "occurred_at": occurred_at}
    applied, late = (await conn.execute(_WRITE, params)).one()
    if applied + late != len(wakes):
        raise StaleRevision(wakes[0].head.run_id, wakes[0].head.revision)


def _params(template: WakeTemplate, wakes: Sequence[Wake]) -> dict[str, Any]:
    def plain(message: outbox.Plain | None) -> str | None:
        return None if message is None else jsonb.dumps(outbox.plain_row(message))

    return {"event": jsonb.dumps(template.event),
            "patch": None if template.patch is None else jsonb.dumps(template.patch),
            "wakeup": plain(template.wakeup), "broadcast": plain(template.broadcast),
            "wakes": jsonb.dumps([
                {"n": n, "run_id": w.head.run_id, "tenant_id": w.head.tenant_id, "partition": w.head.partition,
                 "status": w.head.status, "stage": w.head.stage, "revision": w.head.revision,
                 "stored": w.head.stored_seq, "wait_id": w.wait_id, "reason": w.reason, "applies": w.applies,
                 "wake_reason": w.wake_reason, "routing_key": w.routing_key} for n, w in enumerate(wakes)])}
