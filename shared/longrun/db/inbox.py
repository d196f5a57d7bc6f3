"""Inbox dedup: one row per handled message, written in the handler's transaction.

``claim`` inserts the row first (``ON CONFLICT DO NOTHING``): a duplicate either finds
the committed row and gets its recorded outcome, or waits on the first delivery's
uncommitted row and then finds it. Downstream consumers reuse these two functions.

A handler whose state change is one statement can carry its inbox row in that statement
(``handled_once``, ``handle``): no transaction around it, one round trip instead of four.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.dialects.postgresql import insert

from longrun.db import driver, jsonb
from longrun.db.errors import is_unique_violation
from longrun.db.schema import inboxes
from longrun.ports.inbox import Claimed, Duplicate, Handled, Message

# Built once per inbox table; every message of every consumer sends them (db/driver.py).
_CLAIM = {service: driver.Statement(insert(table).values(
    message_id=bindparam("message_id"), message_type=bindparam("message_type"), run_id=bindparam("run_id"),
    outcome=bindparam("outcome", type_=table.c.outcome.type)).on_conflict_do_nothing().returning(table.c.message_id))
    for service, table in inboxes.items()}
_OUTCOME = {service: driver.Statement(select(table.c.outcome).where(table.c.message_id == bindparam("id")))
            for service, table in inboxes.items()}
_RECORD_OUTCOME = {service: driver.Statement(update(table).where(table.c.message_id == bindparam("id"))
                                             .values(outcome=bindparam("outcome", type_=table.c.outcome.type)))
                   for service, table in inboxes.items()}


async def claim(conn: driver.Connection, service: str, *, message_id: str, message_type: str,
                run_id: str | None) -> Claimed | Duplicate:
    inserted = await driver.first(conn, _CLAIM[service], {"message_id": message_id, "message_type": message_type,
                                                          "run_id": run_id, "outcome": {}})
    if inserted is not None:
        return Claimed(message_id)
    return Duplicate(message_id, (await driver.one(conn, _OUTCOME[service], {"id": message_id})).outcome)


async def record_outcome(conn: driver.Connection, service: str, *, message_id: str,
                         outcome: dict[str, Any]) -> None:
    await driver.execute(conn, _RECORD_OUTCOME[service], {"id": message_id, "outcome": outcome})


# A batch's rows travel as one JSON array, so each statement is one text whatever the batch's size.
_CLAIM_MANY = {service: driver.Statement(text(
    f"INSERT INTO {table.name} (message_id, message_type, run_id, outcome) "
    "SELECT message_id, message_type, run_id, '{}' FROM jsonb_to_recordset(CAST(:rows AS jsonb)) "
    "AS r(message_id text, message_type text, run_id text) ON CONFLICT DO NOTHING RETURNING message_id"))
    for service, table in inboxes.items()}
_OUTCOMES = {service: driver.Statement(text(f"SELECT message_id, outcome FROM {table.name} "
                                            "WHERE message_id = ANY(CAST(:ids AS text[]))"))
             for service, table in inboxes.items()}
_RECORD_OUTCOMES = {service: driver.Statement(text(
    f"UPDATE {table.name} AS i SET outcome = r.outcome "
    "FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(message_id text, outcome jsonb) "
    "WHERE i.message_id = r.message_id"))
    for service, table in inboxes.items()}


async def claim_many(conn: driver.Connection, service: str,
                     messages: Sequence[Message]) -> dict[str, Claimed | Duplicate]:
    """``claim`` for several messages of distinct ids in two statements at most: one insert, and
    one read of the recorded outcomes of those already handled."""
    rows = [{"message_id": m.message_id, "message_type": m.message_type, "run_id": m.run_id} for m in messages]
    claimed = {row.message_id for row in await driver.rows(conn, _CLAIM_MANY[service], {"rows": jsonb.dumps(rows)})}
    out: dict[str, Claimed | Duplicate] = {m: Claimed(m) for m in claimed}
    handled = [m.message_id for m in messages if m.message_id not in claimed]
    if handled:
        for row in await driver.rows(conn, _OUTCOMES[service], {"ids": handled}):
            out[row.message_id] = Duplicate(row.message_id, row.outcome)
    return out


async def record_outcomes(conn: driver.Connection, service: str, outcomes: dict[str, dict[str, Any]]) -> None:
    """``record_outcome`` for several messages in one statement. Outcomes are a handler's, which may
    quote its input: the standard encoder, as the engine's (NaN is refused, not turned into null)."""
    if outcomes:
        await driver.execute(conn, _RECORD_OUTCOMES[service], {"rows": json.dumps(
            [{"message_id": m, "outcome": o} for m, o in outcomes.items()])})


def handled_once(service: str, *, change: Sequence[str], outcome: str, result: str) -> str:
    """SQL handling a message in ONE statement: its state change and its inbox row, with the outcome.

    ``change``: CTEs that act only on a first delivery, by testing ``NOT EXISTS (SELECT 1 FROM
    seen)``; ``outcome``: a jsonb expression over them, recorded; ``result``: what the statement
    returns besides (a select list and its FROM). A concurrent first delivery, not yet committed when
    this statement read ``seen``, makes its insert fail with a unique violation, and the whole
    statement with it: nothing of this delivery is written."""
    table = inboxes[service].name
    return (f"WITH seen AS (SELECT outcome FROM {table} WHERE message_id = :m_id), {', '.join(change)}, "
            f"claimed AS (INSERT INTO {table} (message_id, message_type, run_id, outcome) "
            f"SELECT :m_id, :m_type, :m_run_id, {outcome} WHERE NOT EXISTS (SELECT 1 FROM seen) RETURNING outcome) "
            f"SELECT (SELECT outcome FROM seen) AS recorded, (SELECT outcome FROM claimed) AS outcome, {result}")


async def handle(conn: driver.Connection, statement: driver.Statement, message: Message,
                 params: dict[str, Any]) -> Handled:
    """Send a ``handled_once`` statement on its own (autocommit). Lost to a concurrent first delivery,
    it is sent once more, and then finds that delivery's row."""
    params = {**params, "m_id": message.message_id, "m_type": message.message_type, "m_run_id": message.run_id}
    try:
        row = await driver.one(conn, statement, params)
    except Exception as e:
        if not is_unique_violation(e):
            raise
        row = await driver.one(conn, statement, params)
    if row.recorded is not None:
        return Handled(row.recorded, True, row)
    return Handled(row.outcome, False, row)
