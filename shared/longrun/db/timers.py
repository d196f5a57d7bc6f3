"""Durable timers: one row per timer key; firing and marking happen in one transaction.

Because the run event, the wakeup's outbox row and ``fired_at`` commit together, a
crash between "fire" and "mark" rolls both back: each timer key fires exactly once. A timer
whose wait or run ended another way is cancelled (``cancelled_at``) by the write that ended it
(``runs.write``, ``run_batches.write_many``, ``write_wakes``) and is never claimed.

The statements from ``claim_due`` on are the timer service's batch form of ``runs.append``
for the one transition it makes most, a wake: they read what the wake depends on without
the snapshot, and write a whole batch of wakes as one statement: each run's event and snapshot
patch are rendered by PostgreSQL from one template and the wake's run and wait, each run guarded by
its revision and seq like ``runs.append``; the messages come made (``app.effects``).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import orjson
from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import driver, jsonb, outbox
from longrun.db.schema import sql_names, timers
from longrun.domain.calls import CALL_TIMERS
from longrun.errors import StaleRevision
from longrun.ports.timers import DueTimer


# A batch builds one DueTimer, RunHead and Wake per timer: named tuples cost a fifth of what frozen
# dataclasses cost to build (their __init__ sets each field through object.__setattr__).
async def schedule(conn: AsyncConnection, *, timer_key: str, run_id: str, kind: str, delay: float,
                   payload: dict[str, Any]) -> None:
    """Due ``delay`` seconds from now by the database's clock: the timer service compares with
    ``now()`` there, so a writer whose own clock is off cannot move a timer."""
    await conn.execute(insert(timers).values(
        timer_key=timer_key, run_id=run_id, kind=kind, wake_at=func.now() + timedelta(seconds=delay),
        payload=payload).on_conflict_do_nothing(index_elements=["timer_key"]))


async def schedule_all(conn: AsyncConnection, due: Sequence[Mapping[str, Any]]) -> None:
    """Each of ``due`` (``schedule``'s arguments), e.g. a wait's timers (``ports.runs.wait_timers``)."""
    for timer in due:
        await schedule(conn, **timer)


_CANCEL_CALLS = driver.Statement(text(
    "UPDATE timers SET cancelled_at = now() WHERE run_id = :run_id AND fired_at IS NULL AND cancelled_at IS NULL "
    f"AND kind IN ({sql_names(CALL_TIMERS)}) AND payload ->> 'logical_action' = :logical_action"))


async def cancel_calls(conn: AsyncConnection, run_id: str, logical_action: str) -> None:
    """Cancel the open call timers of ``logical_action``: an earlier attempt's, when it is sent again."""
    await driver.execute(conn, _CANCEL_CALLS, {"run_id": run_id, "logical_action": logical_action})


# clock_timestamp, not now(): the transaction may have started a while ago. The keys travel as one
# JSON array: a text[] parameter is quoted element by element on the client. A timer whose own
# firing ended its wait was cancelled with the wait's other timers by that write: it fired.
_MARK_FIRED = driver.Statement(text("UPDATE timers SET fired_at = clock_timestamp(), cancelled_at = NULL "
                   "WHERE timer_key IN (SELECT jsonb_array_elements_text(CAST(:keys AS jsonb)))"))


async def mark_fired(conn: AsyncConnection, timer_keys: Sequence[str]) -> None:
    if timer_keys:
        await driver.execute(conn, _MARK_FIRED, {"keys": jsonb.dumps(list(timer_keys))})


@dataclass(frozen=True, slots=True)
class NextWakes:
    """When the next open timers (neither fired nor cancelled) come due, in seconds from now by the
    database's clock (<= 0: due)."""

    first_in: float | None
    """The earliest; None when no timer is unfired."""
    batch_in: float | None
    """The ``limit``-th earliest, when a whole batch of that many is due; None when fewer are unfired."""


# At most ``limit`` entries of the due index, whatever the number of timers waiting.
_NEXT_WAKES = text(
    "SELECT extract(epoch FROM min(wake_at) - now()), extract(epoch FROM max(wake_at) - now()), count(*) "
    "FROM (SELECT wake_at FROM timers WHERE fired_at IS NULL AND cancelled_at IS NULL "
    "ORDER BY wake_at LIMIT :limit) AS next")


async def next_wakes(conn: AsyncConnection, *, limit: int) -> NextWakes:
    first, last, count = (await conn.execute(_NEXT_WAKES, {"limit": limit})).one()
    return NextWakes(None if first is None else float(first), float(last) if count == limit else None)


class RunHead(NamedTuple):
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
    correlation_id: str | None
    labels: dict[str, str]
    workflow: str
    """The run's kind (``runs.workflow``), for the metrics of the wakes written in bulk."""
    queue_timed: bool = False
    """The run has a schedule-to-start (``runs.schedule_to_start``): a wake queues it with a timer, which
    only the domain path schedules."""
    trace_root: str | None = None
    """The traceparent of the run's root span (``runs.trace_root``)."""
    admitted: bool = True
    """The run holds a slot (``runs.admitted_at``); one parked in a wait that held none is queued when woken,
    which only the domain path does."""


@dataclass(frozen=True, slots=True)
class DueBatch:
    """Due timers claimed together with their runs, as of ``now`` (the transaction's time)."""

    now: datetime
    timers: list[DueTimer]
    """Earliest first."""
    heads: dict[str, RunHead]
    """Per run of ``timers``."""


# The due timers are claimed first, so only a batch's worth of runs is read, whatever the planner
# knows of a freshly filled table; then their runs are locked. Whatever another transaction
# holds (another replica's timers, a run a worker is writing) is skipped, so the claim never
# waits and never deadlocks: a timer skipped for its run stays unfired for a later batch.
_CLAIM_DUE = driver.Statement(text(
    "WITH due AS MATERIALIZED ("
    "  SELECT timer_key, run_id, kind, wake_at, payload FROM timers "
    "  WHERE fired_at IS NULL AND cancelled_at IS NULL AND wake_at <= now() "
    "  ORDER BY wake_at LIMIT :limit FOR UPDATE SKIP LOCKED) "
    "SELECT d.timer_key, d.run_id, d.kind, d.wake_at, CAST(d.payload AS text) AS payload, now() AS now, "
    "       r.tenant_id, r.partition, r.status, r.revision, r.last_seq, r.snapshot #>> '{wait,wait_id}' AS wait_id, "
    "       (r.snapshot #>> '{wait,wake_at}') IS NOT NULL AS wait_has_timer, "
    "       coalesce(r.snapshot ->> 'stage', '') AS stage, r.snapshot ->> 'correlation_id' AS correlation_id, "
    "       CAST(coalesce(r.snapshot -> 'labels', '{}') AS text) AS labels, r.workflow, "
    "       r.schedule_to_start IS NOT NULL AS queue_timed, r.trace_root, r.admitted_at IS NOT NULL AS admitted "
    "FROM due AS d JOIN runs AS r ON r.run_id = d.run_id ORDER BY d.wake_at FOR UPDATE OF r SKIP LOCKED"))


async def claim_due(conn: AsyncConnection, *, limit: int) -> DueBatch | None:
    """Up to ``limit`` due, unfired timers and their runs' heads, locked; None when none is due (or free)."""
    rows = await driver.rows(conn, _CLAIM_DUE, {"limit": limit})
    if not rows:
        return None
    # Plain tuples, not attribute lookups on rows. The payloads are ours and the labels a flat map of
    # strings, both read from jsonb's own text, so orjson reads them (psycopg's json loads is the stdlib's).
    return DueBatch(rows[0][5], [DueTimer(r[0], r[1], r[2], r[3], orjson.loads(r[4])) for r in rows],
                    {r[1]: RunHead(r[1], *r[6:15], orjson.loads(r[15]), *r[16:]) for r in rows})


@dataclass(frozen=True, slots=True)
class WakeTemplate:
    """What every wake of a batch writes to its run, learnt from one run's full transition through the domain.

    Each wake writes these with its own run and wait filled in by PostgreSQL (``_RENDERED``), so
    a batch of wakes is one statement whatever its size. Its messages are made by the caller, by the
    functions the domain path makes them with, and written only for the wakes that applied.
    """

    event: dict[str, Any]
    """The ``RunWoken`` as ``events.event_to_dict`` stores it."""
    patch: dict[str, Any] | None
    """Top-level snapshot keys the wake changed; None when every wake of the batch is late."""


class Wake(NamedTuple):
    """One timer's wake of its run, guarded by the head it was decided on."""

    head: RunHead
    wait_id: str
    reason: str
    applies: bool
    """False: stored late (``applied = false``), the run unchanged, no message."""
    timer_key: str
    """The timer that wakes it: its wait's other timers are cancelled, not it (it fires)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """A wake's rows as the batch statement writes them."""

    event: dict[str, Any]
    patch: dict[str, Any] | None


def _json(column: str) -> str:
    return f"coalesce(to_json({column}), 'null')"


# Per template, what each wake writes into it: a path in the document -> the wake's value there, as
# JSON. The rest of each document is the sample's, as the domain wrote it.
_PER_WAKE: dict[str, dict[tuple[str, ...], str]] = {
    "event": {("seq",): "w.stored + 1", ("wait_id",): _json("w.wait_id"), ("reason",): _json("w.reason")},
    "patch": {("revision",): "w.revision + 1", ("last_seq",): "w.stored + 1",
              ("last_wake", "wait_id"): _json("w.wait_id"), ("last_wake", "reason"): _json("w.reason")},
}


def _format_of(document: dict[str, Any], name: str) -> str:
    """``document`` as a format string for PostgreSQL's ``format()``: its JSON text, with the value at
    each of ``_PER_WAKE[name]``'s paths replaced by that wake's argument (``%N$s``), a missing one added.

    Text spliced and cast to jsonb once costs PostgreSQL about a third of building the same document
    with nested ``||`` and ``jsonb_build_object`` (every level re-encodes all it holds)."""
    nonce = uuid.uuid4().hex
    marked = copy.deepcopy(document)
    for n, path in enumerate(_PER_WAKE[name], start=1):
        parent = marked
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
        parent[path[-1]] = f"{nonce}:{n}"
    rendered = jsonb.dumps(marked).replace("%", "%%")
    for n in range(1, len(_PER_WAKE[name]) + 1):
        rendered = rendered.replace(f'"{nonce}:{n}"', f"%{n}$s")
    return rendered


# The templates and the wakes (one JSON array of objects) are read once per statement, not per row.
_INPUTS = (
    "t AS MATERIALIZED (SELECT CAST(:event AS text) AS event, CAST(:event_type AS text) AS event_type, "
    "                          CAST(:patch AS text) AS patch), "
    "w AS MATERIALIZED (SELECT * FROM jsonb_to_recordset(CAST(:wakes AS jsonb)) AS w("
    "    n bigint, run_id text, revision bigint, stored bigint, wait_id text, reason text, applies boolean, "
    "    timer_key text))")
# Per wake: what each template becomes for its run.
_RENDERED = {name: f"CAST(format(t.{name}, {', '.join(values.values())}) AS jsonb)"
             for name, values in _PER_WAKE.items()}
_RENDER = text(f"WITH {_INPUTS} SELECT {_RENDERED['event']} AS event, {_RENDERED['patch']} AS patch "
               "FROM w CROSS JOIN t ORDER BY w.n")
# The wakes' messages, only those of runs the statement moved.
_SENT = ("(SELECT e.row, e.n FROM jsonb_array_elements(CAST(:messages AS jsonb)) WITH ORDINALITY AS e(row, n) "
         "WHERE e.row -> 'payload' ->> 'run_id' IN (SELECT run_id FROM applied)) AS r")
# A wake clears the pending wait, so its projected columns go with it; ``snapshot || patch``
# replaces exactly the top-level keys the domain changed. Events and messages are written only
# for runs whose guard (revision and seq, as in ``runs.append``) matched.
_WRITE = text(
    f"WITH {_INPUTS}, "
    "applied AS ("
    f"  UPDATE runs AS r SET snapshot = r.snapshot || {_RENDERED['patch']}, status = :status, "
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
    f"  SELECT w.run_id, w.stored + 1, w.run_id || ':' || (w.stored + 1), t.event_type, {_RENDERED['event']}, "
    "         w.applies, :occurred_at "
    "  FROM w CROSS JOIN t WHERE w.run_id IN (SELECT run_id FROM applied UNION ALL SELECT run_id FROM late)), "
    # Closure: the woken wait's other timers (a wake's deadline, a deadline's wake) are cancelled;
    # one another replica claimed is skipped (``run_batches.write_many`` says why).
    "cancelled AS ("
    "  UPDATE timers SET cancelled_at = now() WHERE timer_key IN ("
    "    SELECT o.timer_key FROM timers AS o JOIN w ON o.run_id = w.run_id AND o.payload ->> 'wait_id' = w.wait_id "
    "    WHERE w.applies AND w.run_id IN (SELECT run_id FROM applied) AND o.fired_at IS NULL "
    "    AND o.cancelled_at IS NULL AND o.timer_key <> w.timer_key FOR UPDATE OF o SKIP LOCKED)), "
    f"sent AS ({outbox.insert_sql(_SENT)}), "
    # The wakes' own timers fired: marked here rather than by a statement of their own (``mark_fired``'s
    # clock). No row is in both this and ``cancelled``, which skips each wake's own timer.
    "marked AS ("
    "  UPDATE timers SET fired_at = clock_timestamp(), cancelled_at = NULL FROM w WHERE timers.timer_key = w.timer_key) "
    "SELECT (SELECT count(*) FROM applied), (SELECT count(*) FROM late)")


async def render_wake(conn: AsyncConnection, template: WakeTemplate, wake: Wake) -> Rendered:
    """What ``write_wakes`` would write for ``wake``, without writing it: to check a template against the domain."""
    row = (await conn.execute(_RENDER, _params(template, [wake]))).one()
    return Rendered(row.event, row.patch)


async def write_wakes(conn: AsyncConnection, template: WakeTemplate, wakes: Sequence[Wake],
                      messages: Sequence[Mapping[str, Any]], *, status: str, occurred_at: datetime) -> None:
    """Store each wake's event and mark its timer fired; a wake that applies moves its run to ``status``
    and sends its ``messages`` (outbox rows, ``outbox.row``, of every wake: those of a run that did not
    move are dropped), a late one only stores its event. One statement for the whole batch.

    Every run must be locked by ``claim_due`` in this transaction and unchanged since.
    """
    if not wakes:
        return
    params = {**_params(template, wakes), "messages": jsonb.dumps(list(messages)), "status": status,
              "occurred_at": occurred_at}
    applied, late = (await conn.execute(_WRITE, params)).one()
    if applied + late != len(wakes):
        raise StaleRevision(wakes[0].head.run_id, wakes[0].head.revision)


def _params(template: WakeTemplate, wakes: Sequence[Wake]) -> dict[str, Any]:
    return {"event": _format_of(template.event, "event"), "event_type": template.event["type"],
            "patch": None if template.patch is None else _format_of(template.patch, "patch"),
            "wakes": jsonb.dumps([
                {"n": n, "run_id": w.head.run_id, "revision": w.head.revision, "stored": w.head.stored_seq,
                 "wait_id": w.wait_id, "reason": w.reason, "applies": w.applies, "timer_key": w.timer_key}
                for n, w in enumerate(wakes)])}
