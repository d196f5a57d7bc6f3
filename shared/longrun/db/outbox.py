"""Outbox: messages written in the same transaction as the state change that causes them.

The relay publishes the unpublished rows of the partitions it owns in id order (one read
for all of them) and marks them sent after the broker confirms (in its next read's
statement). A statement-level trigger sends one NOTIFY per insert (delivered only at commit)
to wake it early; it polls anyway, because NOTIFY is a hint with no replay.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.bus import wakeup
from longrun.db import driver, jsonb
from longrun.envelope import Envelope
from longrun.ports.runs import Message

NOTIFY_CHANNEL = "longrun_outbox"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    event_id: str
    partition: int
    exchange: str
    routing_key: str
    type: str
    payload: dict[str, Any]
    run_trace: str | None = None
    """The traceparent of its run's root span, when read ``with_roots``."""

    def envelope(self) -> dict[str, Any]:
        """What the relay publishes for this row (``envelope_of``)."""
        return envelope_of(self.type, self.payload)


async def enqueue(conn: AsyncConnection, envelope: Envelope, *, exchange: str, routing_key: str,
                  partition: int) -> None:
    await enqueue_many(conn, [Message(envelope, exchange, routing_key, partition)])


async def enqueue_many(conn: AsyncConnection, messages: Sequence[Message]) -> None:
    """One INSERT; the table's statement trigger sends one NOTIFY (delivered at commit) to wake relays."""
    if messages:
        await conn.execute(_INSERT, {"rows": rows_json(messages)})


COLUMNS = ("event_id", "aggregate_type", "aggregate_id", "partition", "exchange", "routing_key", "type", "payload",
           "traceparent")
"""What a statement gives for each message it writes (``insert_columns_sql``), in this order."""


def insert_columns_sql(select: str) -> str:
    """INSERT of the rows ``select`` yields, ``COLUMNS`` in order, in the order they are to be published."""
    return f"INSERT INTO outbox ({', '.join(COLUMNS)}) {select}"


_ROW_VALUES = ("r.row -> 'payload' ->> 'event_id', 'run', "
               "coalesce(r.row -> 'payload' ->> 'run_id', r.row -> 'payload' ->> 'event_id'), "
               "CAST(r.row ->> 'partition' AS smallint), r.row ->> 'exchange', r.row ->> 'routing_key', "
               "r.row ->> 'type', r.row -> 'payload', r.row -> 'payload' ->> 'trace'")


def insert_sql(rows: str) -> str:
    """INSERT of the rows ``rows`` yields as ``r(row, n)``: each row as ``rows_json`` writes one, in n order."""
    return insert_columns_sql(f"SELECT {_ROW_VALUES} FROM {rows} ORDER BY r.n")


def eager_insert_sql(rows: str) -> str:
    """``insert_sql``, each row marked eager (``eager_until``, ``:eager_grace`` seconds from now) when
    nothing of its partition is unsent: its writer publishes it itself after the commit, and nothing
    written before it can be overtaken. Returns ``id`` and ``eager`` of every row."""
    unsent = ("SELECT 1 FROM outbox AS u WHERE u.partition = CAST(r.row ->> 'partition' AS smallint) "
              "AND u.published_at IS NULL")
    return (f"INSERT INTO outbox ({', '.join(COLUMNS)}, eager_until) SELECT {_ROW_VALUES}, "
            f"CASE WHEN NOT EXISTS ({unsent}) THEN now() + make_interval(secs => CAST(:eager_grace AS float8)) END "
            f"FROM {rows} ORDER BY r.n RETURNING id, eager_until IS NOT NULL AS eager")


def from_param(param: str) -> str:
    """``insert_sql``'s rows from the JSON array parameter ``:param``."""
    return f"jsonb_array_elements(CAST(:{param} AS jsonb)) WITH ORDINALITY AS r(row, n)"


# The rows travel as one JSON array: arrays of JSON text would be escaped element by element on the client.
_INSERT = text(insert_sql(from_param("rows")))


def rows_json(messages: Sequence[Message]) -> str:
    return jsonb.dumps([row_json(m) for m in messages])


def row_json(message: Message) -> dict[str, Any]:
    """``message`` as one of ``insert_sql``'s rows: its payload as the outbox keeps it (``kept``)."""
    return row(kept(message.envelope), message.envelope.type, message.exchange, message.routing_key,
               message.partition)


def row(payload: dict[str, Any], type_: str, exchange: str, routing_key: str, partition: int) -> dict[str, Any]:
    """One of ``insert_sql``'s rows: ``payload`` as the outbox keeps it, of type ``type_``, and its route."""
    return {"payload": payload, "type": type_, "exchange": exchange, "routing_key": routing_key,
            "partition": partition}


def kept(envelope: Envelope) -> dict[str, Any]:
    """What the outbox keeps of ``envelope``: a wakeup's wake (``bus.wakeup``), any other whole."""
    return wakeup.kept_of(envelope) if envelope.type == wakeup.TYPE else envelope.model_dump(mode="json")


def envelope_of(type_: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The envelope an outbox row of ``type_`` publishes, in its JSON form: what the relay sends, and
    how tests and the bench read the outbox. A wakeup written whole (by a writer from before wakeups
    were kept as data, left unpublished across the upgrade) is sent as it was written."""
    if type_ != wakeup.TYPE or "schema_version" in payload:
        return payload
    return wakeup.render(payload)


def _unpublished(*, marks: bool, roots: bool) -> driver.Statement:
    """The oldest unpublished rows of some partitions; ``roots``: with their runs' trace roots (a join
    paid only by a relay that exports spans).

    With ``marks``, the rows confirmed since the last read are marked in the same statement: the marks
    are not visible to its own SELECT (one snapshot), so it skips them by id. Only when there are marks:
    with none, PostgreSQL plans the UPDATE as a walk of every unpublished index entry (dead ones of rows
    already published included) looking for ids in an empty list."""
    columns = "o.id, o.event_id, o.partition, o.exchange, o.routing_key, o.type, o.payload"
    source = "outbox AS o"
    if roots:
        columns += ", r.trace_root"
        source += " LEFT JOIN runs AS r ON o.aggregate_type = 'run' AND r.run_id = o.aggregate_id"
    # A partition stops at its first row a worker publishes itself, until its grace has passed
    # (``bus.eager``): what was written after it must not overtake it.
    where = ("o.partition = ANY(CAST(:partitions AS smallint[])) AND o.published_at IS NULL "
             "AND NOT EXISTS (SELECT 1 FROM outbox AS e WHERE e.partition = o.partition "
             "AND e.aggregate_id = o.aggregate_id AND e.id <= o.id "
             "AND e.published_at IS NULL AND e.eager_until > now())")
    read = f"SELECT {columns} FROM {source} WHERE {where}"
    if marks:
        read = ("WITH marked AS (UPDATE outbox SET published_at = now() WHERE id = ANY(CAST(:marked AS bigint[]))) "
                f"{read} AND o.id <> ALL(CAST(:marked AS bigint[]))")
    return driver.Statement(text(f"{read} ORDER BY o.id LIMIT :limit"))


_UNPUBLISHED = {(marks, roots): _unpublished(marks=marks, roots=roots) for marks in (False, True)
                for roots in (False, True)}
_MARK_PUBLISHED = driver.Statement(
    text("UPDATE outbox SET published_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))"))


async def unpublished(conn: driver.Connection, partitions: Collection[int], limit: int,
                      marked: Sequence[int] = (), *, with_roots: bool = False) -> list[OutboxRow]:
    """Oldest unpublished rows of these partitions, in id order (so each partition's rows are in
    order too); every round rescans, so late commits are seen. ``marked``: rows confirmed since the
    last read, marked published by the same statement first (one round trip for both).
    ``with_roots``: each with its run's trace root (``OutboxRow.run_trace``)."""
    if not partitions:
        await mark_published(conn, list(marked))
        return []
    params = {"partitions": sorted(partitions), "limit": limit}
    if marked:
        params["marked"] = list(marked)
    rows = await driver.rows(conn, _UNPUBLISHED[bool(marked), with_roots], params)
    return [OutboxRow(*row) for row in rows]


async def mark_published(conn: driver.Connection, ids: list[int]) -> None:
    if ids:
        await driver.execute(conn, _MARK_PUBLISHED, {"ids": ids})
