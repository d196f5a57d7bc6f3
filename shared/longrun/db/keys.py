"""Concurrency keys in PostgreSQL (``domain.concurrency``): the SQL the creating statement and the
handover read a key with, and the read of a key's unfinished runs a create whose policy refuses or
cancels makes. Admission's own test of a queued run's key is ``admission.key_free``."""

from __future__ import annotations

from sqlalchemy import literal_column, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import admission
from longrun.db.schema import KEYED_OPEN, QUEUED_STATUS, sql_name, sql_names
from longrun.domain import TERMINAL
from longrun.domain.concurrency import KeyClaim, KeyedRun

GAVE_BACK = f"moved.concurrency_held_at IS NOT NULL AND CAST(:status AS text) IN ({sql_names(sorted(TERMINAL))})"
"""Whether the transition's run (``moved``) gave its concurrency key back by ending."""
ENDED_KEY = f"(SELECT moved.concurrency_key FROM moved WHERE {GAVE_BACK})"
"""The concurrency key a transition's run gave back by ending (NULL: none)."""


def hands_on(run: str) -> str:
    """Whether a handover may admit the chosen run ``run`` for its key. A handover does not hold the
    tenant's admission lock, so it takes no key another admitter could be taking: it admits a run with
    a key only if the run holds it already or takes the one the finishing run gave back (the key's
    holders are then as many before the statement as after). Any other run with a key is left to
    admission, which the slot left free wakes."""
    return (f"({run}.concurrency_key IS NULL OR {run}.concurrency_held_at IS NOT NULL "
            f"OR {run}.concurrency_key = {ENDED_KEY})")


CREATED_KEY_FREE = (", " + admission.key_holders(tenant=":tenant_id", key="CAST(:k_key AS text)",
                                                 up_to="CAST(:k_limit AS int)")
                    + " < CAST(:k_limit AS int) AS key_free")
"""The creating statement's reading of the new run's key (``:k_key``, ``:k_limit``): whether it has room."""


_OPEN_RUNS = text(
    f"SELECT run_id, concurrency_held_at IS NOT NULL AS holding, cancel_requested FROM runs "
    f"WHERE tenant_id = :t AND concurrency_key = :k AND {KEYED_OPEN} ORDER BY created_at, run_id LIMIT :n")


async def open_runs(conn: AsyncConnection, tenant_id: str, claim: KeyClaim, *, up_to: int) -> list[KeyedRun]:
    """The unfinished runs with ``claim``'s key in ``tenant_id``, oldest first, at most ``up_to``
    (through ix_runs_keyed_open)."""
    rows = await conn.execute(_OPEN_RUNS, {"t": tenant_id, "k": claim.key, "n": up_to})
    return [KeyedRun(r.run_id, r.holding, r.cancel_requested) for r in rows]


def _waiting_for(run: str) -> str:
    """``concurrency_key:<key>`` for the run ``run`` (an alias of runs) while it is queued and its key's
    holders fill its limit; NULL otherwise (a run without a key reads nothing more)."""
    count = admission.key_holders(tenant=f"{run}.tenant_id", key=f"{run}.concurrency_key",
                                  up_to=f"{run}.concurrency_limit")
    return (f"CASE WHEN {run}.concurrency_key IS NOT NULL AND {run}.concurrency_held_at IS NULL "
            f"AND {run}.admitted_at IS NULL AND {run}.status = {sql_name(QUEUED_STATUS)} "
            f"AND {count} >= {run}.concurrency_limit THEN 'concurrency_key:' || {run}.concurrency_key END")


WAITING_FOR_KEY = literal_column(_waiting_for("runs"))
"""What a run of a runs query waits for, of its key (``waiting_for``)."""
_WAITING_FOR = text(f"SELECT {_waiting_for('r')} FROM runs AS r WHERE r.run_id = :r")


async def waiting_for(conn: AsyncConnection, run_id: str) -> str | None:
    """``concurrency_key:<key>`` while the run waits for its key, else None."""
    return (await conn.execute(_WAITING_FOR, {"r": run_id})).scalar()
