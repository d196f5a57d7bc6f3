"""Child runs' rows (``schema_children``): the link a parent's step writes with the child it creates,
the ``child_ended`` timer a finishing child's transition writes for its parent, and the reads of a
run's children (to cancel them, to show them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import jsonb
from longrun.db.schema import OPEN_RUN
from longrun.domain import RunSnapshot, children

ENDED = ("INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
         f"SELECT 'child_ended:' || c.child_run_id, c.parent_run_id, '{children.ENDED_TIMER}', now(), "
         "CAST({report} AS jsonb) || jsonb_build_object('name', c.name, 'child_run_id', c.child_run_id) "
         "FROM {source} JOIN children AS c ON c.child_run_id = {source}.run_id "
         "ON CONFLICT (timer_key) DO NOTHING")
"""A child run that finished tells its parent through a timer due at once, once (keyed by the child):
written by the statement that finishes it, so no end is lost and none is told twice."""

_ENDED_ONE = text(ENDED.format(source="one", report=":e_report").replace(
    "FROM one", "FROM (SELECT CAST(:run_id AS text) AS run_id) AS one", 1))


def report(run: RunSnapshot) -> str:
    """``ENDED``'s ``report`` parameter for finished ``run``."""
    return jsonb.dumps(children.end_report(run))


async def ended(conn: AsyncConnection, finished: Sequence[RunSnapshot]) -> None:
    """``ENDED`` for runs a batch writer finished (``run_batches.write_many``)."""
    if finished:
        await conn.execute(_ENDED_ONE, [{"run_id": run.run_id, "e_report": report(run)} for run in finished])


async def link(conn: AsyncConnection, *, child_run_id: str, parent_run_id: str, name: str,
               on_parent_cancel: str) -> None:
    """Record ``child_run_id`` as the child ``name`` of ``parent_run_id`` (again: nothing changes)."""
    await conn.execute(text(
        "INSERT INTO children (child_run_id, parent_run_id, name, on_parent_cancel) "
        "VALUES (:c, :p, :n, :o) ON CONFLICT (child_run_id) DO NOTHING"),
        {"c": child_run_id, "p": parent_run_id, "n": name, "o": on_parent_cancel})


async def open_to_cancel(conn: AsyncConnection, parent_run_id: str) -> list[str]:
    """The open children of ``parent_run_id`` that cancelling it cancels (policy ``cancel``)."""
    rows = await conn.execute(text(
        "SELECT c.child_run_id FROM children AS c JOIN runs AS r ON r.run_id = c.child_run_id "
        f"WHERE c.parent_run_id = :p AND c.on_parent_cancel = 'cancel' AND r.{OPEN_RUN} "
        "ORDER BY c.child_run_id"), {"p": parent_run_id})
    return [r.child_run_id for r in rows]


@dataclass(frozen=True, slots=True)
class Related:
    """A run's parent and children, as its view (`GET /runs/{id}`, the console's run page) shows them."""

    parent: str | None
    name: str | None
    """The run's name in its parent."""
    children: list[tuple[str, str, str]]
    """(name, run id, status) of each child, by name."""


async def related(conn: AsyncConnection, run_id: str) -> Related:
    parent = (await conn.execute(text("SELECT parent_run_id, name FROM children WHERE child_run_id = :r"),
                                 {"r": run_id})).first()
    rows = await conn.execute(text(
        "SELECT c.name, c.child_run_id, r.status FROM children AS c JOIN runs AS r ON r.run_id = c.child_run_id "
        "WHERE c.parent_run_id = :r ORDER BY c.name"), {"r": run_id})
    return Related(None if parent is None else parent.parent_run_id, None if parent is None else parent.name,
                   [(r.name, r.child_run_id, r.status) for r in rows])
