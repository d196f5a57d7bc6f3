"""Transitions written in batches by a writer holding their runs' row locks (the timer service),
beside the one-statement transition of ``db.runs``: one statement per kind for the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun import metrics
from longrun.db import children as child_rows
from longrun.db import driver, jsonb, runs
from longrun.db.schema import run_events
from longrun.db.schema import runs as run_rows
from longrun.domain import events as ev
from longrun.errors import StaleRevision
from longrun.ports.runs import Planned, StoredRun

_INSERT_EVENTS = insert(run_events)


def _values(planned: Planned) -> dict[str, Any]:
    values = {**runs.projection(planned.after.snapshot), "last_seq": planned.after.stored_seq}
    if planned.release_lease:
        values.update(lease_owner=None, lease_until=None)
    return values


async def load_many(conn: AsyncConnection, run_ids: Sequence[str], *, lock: bool = False) -> dict[str, StoredRun]:
    """Several runs in one query; locked in run_id order, so concurrent batches cannot deadlock."""
    query = (select(*runs.COLUMNS, run_rows.c.run_id).where(run_rows.c.run_id.in_(sorted(set(run_ids))))
             .order_by(run_rows.c.run_id))
    if lock:
        query = query.with_for_update()
    return {row.run_id: runs.stored_run(row) for row in await conn.execute(query)}


async def write_many(conn: AsyncConnection, planned: Sequence[Planned]) -> None:
    """Write transitions of runs the caller has locked (``load_many(lock=True)``): one statement per kind.

    The revision guard still applies; a mismatch means the caller did not hold the locks.
    """
    if not planned:
        return
    for release in (False, True):
        group = [p for p in planned if p.release_lease is release]
        if not group:
            continue
        params = [{**_values(p), "b_run_id": p.before.snapshot.run_id, "b_revision": p.before.snapshot.revision,
                   "b_last_seq": p.before.stored_seq} for p in group]
        result = await conn.execute(
            update(run_rows).where(run_rows.c.run_id == bindparam("b_run_id"),
                                   run_rows.c.revision == bindparam("b_revision"),
                                   run_rows.c.last_seq == bindparam("b_last_seq")).values(updated_at=func.now()), params)
        if result.rowcount != len(group):
            raise StaleRevision(group[0].before.snapshot.run_id, group[0].before.snapshot.revision)
    await conn.execute(_INSERT_EVENTS, [
        _event_row(p.before.snapshot.run_id, event, applied) for p in planned for event, applied in p.rows])
    ended = [{"run_id": p.before.snapshot.run_id, "every": cancel.everything, "wait_id": cancel.wait_id,
              "calls": list(cancel.calls)} for p in planned if (cancel := p.cancel) is not None]
    if ended:
        await driver.execute(conn, _CANCEL_ENDED, {"ended": jsonb.dumps(ended)})
    owing = [p.after.snapshot.run_id for p in planned if p.owes_cleanup]
    if owing:
        await driver.execute(conn, _OWE_MANY, {"run_ids": owing})
    await child_rows.ended(conn, [p.after.snapshot for p in planned if p.ends_run])
    # Only runs with a schedule-to-start pay a statement here (the bulk wakes leave them to this path).
    for p in planned:
        metrics.transitioned(p.before.snapshot, p.after.snapshot)
        if p.queue_stint:
            await driver.execute(conn, _QUEUE_ONE, {"run_id": p.after.snapshot.run_id,
                                                    **runs.queue_params(p.after.snapshot)})


_OWE_MANY = driver.Statement(text(runs.OWE_CLEANUP.format(
    source="(SELECT unnest(CAST(:run_ids AS text[])) AS run_id) AS owing")))
_QUEUE_ONE = driver.Statement(text(
    f"WITH one AS (SELECT CAST(:run_id AS text) AS run_id) {runs.queue_timer_sql('one')}"))


# ``write_many``'s closure, for its writer (the timer service): a timer another replica claimed is
# skipped rather than waited for (two replicas waiting on each other's claims would deadlock); that
# replica fires it, and a wake for the ended wait is stored late.
_CANCEL_ENDED = driver.Statement(text(
    "UPDATE timers SET cancelled_at = now() WHERE timer_key IN ("
    "  SELECT t.timer_key FROM timers AS t, jsonb_to_recordset(CAST(:ended AS jsonb)) "
    "  AS e(run_id text, every boolean, wait_id text, calls jsonb) "
    "  WHERE t.run_id = e.run_id AND t.fired_at IS NULL AND t.cancelled_at IS NULL "
    f"  AND {runs.ENDED_TIMERS.format(t='t', every='e.every', wait='e.wait_id', calls='e.calls')} "
    "  FOR UPDATE OF t SKIP LOCKED)"))


def _event_row(run_id: str, event: ev.RunEvent, applied: bool) -> dict[str, Any]:
    """A row of ``write_many``: its writers (the timer) hold no lease, so no fencing token."""
    return {"run_id": run_id, "seq": event.seq, "event_id": f"{run_id}:{event.seq}", "type": event.type,
            "data": ev.event_to_dict(event), "applied": applied,
            "fencing_token": None, "occurred_at": runs.ts(event.at)}
