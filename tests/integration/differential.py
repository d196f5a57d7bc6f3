"""Differential checks of the SQL fast paths against the domain: the rows a fast path stored, read
back from PostgreSQL, against the rows the domain's pure path (``evolve`` through ``ports.runs.plan``, the
envelope builders in ``app/effects.py``) says it should have stored, column by column.

Each check returns its mismatches, one line each naming the row and the column (a nested JSON
document is compared key by key: ``payload.payload.labels.team``), so the differential tests expect
``[]`` and their mutants expect some.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.db import outbox, runs
from longrun.db.schema import metadata
from longrun.domain import RunStatus
from longrun.domain import events as ev
from longrun.domain import run as domain_run
from longrun.ports.runs import StoredRun

_MISSING = object()

RUN_COLUMNS = ("status", "revision", "last_seq", "snapshot", "priority", "wait_kind", "wait_correlation_key",
               "wait_deadline", "approval_id", "approval_owner", "approved_hash", "budget", "cancel_requested",
               "lease_owner", "leased", "admitted")
"""The runs columns compared (``leased``: lease_until is set; ``admitted``: admitted_at is set)."""
EVENT_COLUMNS = ("event_id", "type", "data", "applied", "fencing_token", "occurred_at")
FRESH_ENVELOPE_FIELDS = ("event_id", "occurred_at")
"""Envelope fields every message draws anew: compared for form, not value."""
FRESH_PAYLOAD_FIELDS = ("wakeup_id",)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON document as {dotted path: leaf}; an empty object is a leaf."""
    if isinstance(value, Mapping) and value:
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def compare(where: str, sql: Mapping[str, Any], domain: Mapping[str, Any]) -> list[str]:
    """What differs between the row the SQL stored and the one the domain expects, column by column."""
    stored, expected = flatten(dict(sql)), flatten(dict(domain))
    return [f"{where}: {column}: sql {stored.get(column, '<absent>')!r} != domain {expected.get(column, '<absent>')!r}"
            for column in sorted(set(stored) | set(expected))
            if stored.get(column, _MISSING) != expected.get(column, _MISSING)]


def run_row(stored: StoredRun) -> dict[str, Any]:
    """The runs row the domain says ``stored`` is."""
    return {**runs.projection(stored.snapshot), "last_seq": stored.stored_seq, "lease_owner": stored.lease_owner,
            "leased": stored.lease_until is not None, "admitted": stored.admitted}


def event_row(run_id: str, event: ev.RunEvent, applied: bool, fencing_token: int | None = None) -> dict[str, Any]:
    return {"event_id": f"{run_id}:{event.seq}", "type": event.type, "data": ev.event_to_dict(event),
            "applied": applied, "fencing_token": fencing_token, "occurred_at": datetime.fromtimestamp(event.at, UTC)}


def outbox_row(message: outbox.Message) -> dict[str, Any]:
    """The outbox row the domain's message is, its payload the envelope published, less what is fresh
    on every message."""
    envelope = message.envelope.model_dump(mode="json")
    return _without_fresh({
        "aggregate_type": "run", "aggregate_id": envelope["run_id"] or envelope["event_id"],
        "partition": message.partition, "exchange": message.exchange, "routing_key": message.routing_key,
        "type": envelope["type"], "payload": envelope, "traceparent": envelope["trace"]})


def _without_fresh(row: Mapping[str, Any]) -> dict[str, Any]:
    envelope = {k: v for k, v in row["payload"].items() if k not in FRESH_ENVELOPE_FIELDS}
    if isinstance(envelope.get("payload"), Mapping):
        envelope["payload"] = {k: v for k, v in envelope["payload"].items() if k not in FRESH_PAYLOAD_FIELDS}
    return {**{k: v for k, v in row.items() if k not in ("id", "event_id")}, "payload": envelope}


async def stored_runs(conn: AsyncConnection, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The runs rows as stored, by run id, ``RUN_COLUMNS`` plus ``admitted_at``."""
    rows = await conn.execute(text(
        "SELECT run_id, status, revision, last_seq, snapshot, priority, wait_kind, wait_correlation_key, "
        "wait_deadline, approval_id, approval_owner, approved_hash, budget, cancel_requested, lease_owner, "
        "lease_until IS NOT NULL AS leased, admitted_at IS NOT NULL AS admitted, admitted_at "
        "FROM runs WHERE run_id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))"),
        {"ids": _json_list(run_ids)})
    return {r.run_id: dict(r._mapping) for r in rows}


async def stored_events(conn: AsyncConnection, since: Mapping[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Per run of ``since``, its events stored after seq ``since[run_id]``, in seq order."""
    rows = await conn.execute(text(
        "SELECT run_id, seq, event_id, type, data, applied, fencing_token, occurred_at FROM run_events "
        "WHERE run_id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))) ORDER BY run_id, seq"),
        {"ids": _json_list(since)})
    found: dict[str, list[dict[str, Any]]] = {run_id: [] for run_id in since}
    for r in rows:
        if r.seq > since[r.run_id]:
            found[r.run_id].append({c: getattr(r, c) for c in EVENT_COLUMNS})
    return found


async def outbox_mark(conn: AsyncConnection) -> int:
    """The last outbox row's id: a batch's rows are those after it."""
    return (await conn.execute(text("SELECT coalesce(max(id), 0) FROM outbox"))).scalar_one()


async def stored_messages(conn: AsyncConnection, after: int) -> list[dict[str, Any]]:
    """The outbox rows written after ``after``, in id order, by column; each payload the envelope the
    relay publishes for it (``outbox.envelope_of``)."""
    rows = await conn.execute(text(f"SELECT id, {', '.join(outbox.COLUMNS)} FROM outbox WHERE id > :after "
                                   "ORDER BY id"), {"after": after})
    return [{**r._mapping, "payload": outbox.envelope_of(r.type, r.payload)} for r in rows]


def compare_events(run_id: str, stored: Sequence[Mapping[str, Any]],
                   expected: Sequence[Mapping[str, Any]]) -> list[str]:
    found = [f"run {run_id}: {len(stored)} event(s) stored, the domain has {len(expected)}"] \
        if len(stored) != len(expected) else []
    for n, (sql, domain) in enumerate(zip(stored, expected)):
        found += compare(f"run {run_id} event {n + 1}", sql, domain)
    return found


def compare_messages(where: str, stored: Sequence[Mapping[str, Any]],
                     expected: Sequence[outbox.Message]) -> list[str]:
    """The outbox rows of one run (id order) against the domain's messages (their order); each row's
    id equals its envelope's, and the fresh ids are well formed."""
    found: list[str] = []
    if [r["type"] for r in stored] != [m.envelope.type for m in expected]:
        found.append(f"{where}: messages {[r['type'] for r in stored]} stored, the domain sends "
                     f"{[m.envelope.type for m in expected]}")
    for row, message in zip(stored, expected):
        at = f"{where} {row['type']}"
        found += compare(at, _without_fresh(row), outbox_row(message))
        if row["event_id"] != row["payload"].get("event_id") or not _is_uuid(row["event_id"]):
            found.append(f"{at}: event_id {row['event_id']!r} is not its envelope's fresh id")
        inner = row["payload"].get("payload")
        for name in FRESH_PAYLOAD_FIELDS:
            domain_has = name in (message.envelope.model_dump(mode="json").get("payload") or {})
            if domain_has and not (isinstance(inner, Mapping) and _is_uuid(inner.get(name))):
                found.append(f"{at}: payload.payload.{name} is no fresh id: {inner!r}")
    return found


def compare_stored(expected_runs: Mapping[str, StoredRun], expected_events: Mapping[str, Sequence[Mapping[str, Any]]],
                   expected_messages: Mapping[str, Sequence[outbox.Message]], stored: Mapping[str, Mapping[str, Any]],
                   events: Mapping[str, Sequence[Mapping[str, Any]]], sent: Sequence[Mapping[str, Any]], *,
                   label: Callable[[str], str] = lambda run_id: f"run {run_id}") -> list[str]:
    """Each run's stored row, new events and outbox messages against what the domain made of it; then
    messages for runs the domain sent nothing to, and ids used twice."""
    found: list[str] = []
    messages_of = by_aggregate(sent)
    for run_id, after in sorted(expected_runs.items()):
        where = label(run_id)
        row = stored.get(run_id)
        if row is None:
            found.append(f"{where}: not stored")
            continue
        found += compare(where, {c: row[c] for c in RUN_COLUMNS}, run_row(after))
        found += compare_events(run_id, events[run_id], expected_events[run_id])
        found += compare_messages(where, messages_of.pop(run_id, []), expected_messages.get(run_id, []))
    found += [f"outbox: message(s) for {run_id} the domain never sent" for run_id in messages_of]
    return found + distinct_ids(sent)


def distinct_ids(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every message of a batch has its own id (and every wakeup its own wakeup id)."""
    found: list[str] = []
    ids = [r["event_id"] for r in rows]
    if len(set(ids)) != len(ids):
        found.append(f"outbox: {len(ids) - len(set(ids))} event id(s) repeated within the batch")
    wakeups = [r["payload"]["payload"].get("wakeup_id") for r in rows if r["type"] == "run.wakeup"]
    if len(set(wakeups)) != len(wakeups):
        found.append(f"outbox: {len(wakeups) - len(set(wakeups))} wakeup id(s) repeated within the batch")
    return found


def by_aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["aggregate_id"], []).append(row)
    return grouped


async def wipe(engine: AsyncEngine) -> None:
    """Empty every table: what a mutant made of the runs must not reach the next test's checks."""
    names = ", ".join(f'"{t.name}"' for t in reversed(metadata.sorted_tables))
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


def _is_uuid(value: Any) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _json_list(values: Iterable[str]) -> str:
    return orjson.dumps(list(values)).decode()


# -- the slot model admission and the handover are compared with --------------------------------------

QUEUED_STATUS = RunStatus.READY
"""The model's own: not ``db.schema.QUEUED_STATUS``, which the SQL under test is built from."""


@dataclass
class Row:
    """What the pure model keeps of a run."""

    tenant: str
    status: RunStatus
    admitted: bool
    priority: int
    created_at: datetime
    revision: int
    partition: int
    key: str | None = None
    limit: int = 0
    key_held: bool = False


def holds_slot(row: Row) -> bool:
    # Read at call time: the mutants patch the domain's TERMINAL.
    return row.admitted and row.status not in domain_run.TERMINAL


SLOTLESS_WAITS = ("tool_healthy", "rate_limit", "tenant_budget", "tool_concurrency")
"""The model's own wait kinds that hold no slot: not ``domain.slots.SLOTLESS_WAITS``."""


def parks_without_slot(before: StoredRun, after: StoredRun) -> bool:
    """A move into a new wait of a kind that holds no slot."""
    wait, was = after.snapshot.wait, before.snapshot.wait
    return wait is not None and wait.kind in SLOTLESS_WAITS and (was is None or was.wait_id != wait.wait_id)


def queued(row: Row) -> bool:
    return not row.admitted and row.status is QUEUED_STATUS


def key_holders(model: Mapping[str, Row], row: Row) -> int:
    """How many of the model's runs hold ``row``'s key: taken, and not finished."""
    return sum(1 for other in model.values() if other.tenant == row.tenant and other.key == row.key
               and other.key_held and other.status not in domain_run.TERMINAL)


def key_free(model: Mapping[str, Row], row: Row) -> bool:
    """Whether ``row`` may run for its concurrency key: none, held already, or the key has room."""
    return row.key is None or row.key_held or key_holders(model, row) < row.limit


def score(row: Row, now: datetime, aging: float) -> float:
    return row.priority + (now - row.created_at).total_seconds() / aging


async def set_ages(conn: AsyncConnection, ages: Mapping[str, int]) -> None:
    """Runs created ``ages[run_id]`` whole seconds ago: distinct ages leave the queue's order by score,
    then age, no near ties."""
    await conn.execute(text(
        "UPDATE runs SET created_at = now() - make_interval(secs => a.age) "
        "FROM jsonb_to_recordset(CAST(:ages AS jsonb)) AS a(run_id text, age int) WHERE runs.run_id = a.run_id"),
        {"ages": orjson.dumps([{"run_id": r, "age": a} for r, a in ages.items()]).decode()})
