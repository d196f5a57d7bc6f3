"""Leases of runs: the take (with a wakeup's inbox row, of runs waiting for a worker that runs them, or
of runs whose holder's membership lapsed), the renewal, the release and the hand-over, each one
statement. A lease is free when it has no owner or expired by the database's clock; every take bumps
the fencing token, so a writer that lost the lease is refused (``runs.write``'s guard)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from sqlalchemy import Interval, bindparam, func, text, update

from longrun.authoring import PIN_SEPARATOR
from longrun.db import driver, inbox, jsonb
from longrun.db.runs import COLUMNS, stored_run
from longrun.db.schema import QUEUED, runs, sql_name, sql_names
from longrun.domain import WORKER_HAS_WORK
from longrun.ports.runs import Fence, StoredRun

_TTL = bindparam("ttl", type_=Interval())
# WHERE parameters of an UPDATE must not be named like a column: those names belong to SET.
_IS_FENCED = (runs.c.run_id == bindparam("b_run_id"), runs.c.lease_owner == bindparam("owner"),
              runs.c.fencing_token == bindparam("token"))
_TAKE_LEASE = (update(runs)
               .where(runs.c.run_id == bindparam("b_run_id"),
                      runs.c.lease_owner.is_(None) | (runs.c.lease_until <= func.now()))
               .values(lease_owner=bindparam("owner"), lease_until=func.now() + _TTL,
                       fencing_token=runs.c.fencing_token + 1))
_TAKE_LEASE_TOKEN = driver.Statement(_TAKE_LEASE.returning(runs.c.fencing_token))
_EXTEND_LEASE = driver.Statement(
    update(runs).where(*_IS_FENCED).values(lease_until=func.now() + _TTL).returning(runs.c.run_id))
_RELEASE_LEASE = driver.Statement(update(runs).where(*_IS_FENCED).values(lease_owner=None, lease_until=None))

_OPEN_QUEUE_TIMER = "timers.kind = 'schedule_to_start' AND timers.fired_at IS NULL AND timers.cancelled_at IS NULL"
_UNQUEUE = ("UPDATE timers SET cancelled_at = now() WHERE EXISTS (SELECT 1 FROM taken WHERE schedule_to_start IS "
            f"NOT NULL) AND timers.run_id = :b_run_id AND {_OPEN_QUEUE_TIMER}")
"""A take cancels the run's open queue timer, in its statement. The EXISTS is a one-time filter,
tested before anything else: for a run without the setting (the column is NULL) it is false, and the
timers are not even looked at (``EXPLAIN ANALYZE``: the scan under it is never executed)."""
_UNQUEUE_ADOPTED = ("UPDATE timers SET cancelled_at = now() WHERE timers.run_id = ANY(ARRAY("
                    f"SELECT run_id FROM taken WHERE schedule_to_start IS NOT NULL)) AND {_OPEN_QUEUE_TIMER}")
"""``_UNQUEUE`` for the runs an adoption took."""


async def take_lease(conn: driver.Connection, run_id: str, owner: str, ttl: float) -> Fence | None:
    """Take the run if its lease is free or expired (database time); the token always grows."""
    row = await driver.first(conn, _TAKE_LEASE_TOKEN, {"b_run_id": run_id, "owner": owner,
                                                      "ttl": timedelta(seconds=ttl)})
    return None if row is None else Fence(owner, row.fencing_token)


PINS_KEY = (f"concat_ws(chr({ord(PIN_SEPARATOR)}), workflow, workflow_version, prompt_version, "
            "model_policy_version, tool_schema_version)")
"""A run's ``authoring.pins_key`` from its columns: what a worker must serve to run it."""
NEEDS_WORKER = "workflow || '@' || workflow_version"
"""What ``awaiting_worker`` shows: the kind and workflow version the run waits for a worker of."""
_SERVED = f"{PINS_KEY} = ANY(CAST(:served AS text[]))"
_LEASE_FREE = "(lease_owner IS NULL OR lease_until <= now())"
"""``domain.lease.can_take`` in SQL: a lease is free from its expiry on, by the database's clock."""
_NOT_QUEUED = f"NOT ({QUEUED})"
"""A queued run (``domain.slots.queued``) is never taken, whoever sent the wakeup: it gets a worker
only once admission or a freed slot's handover admits it. A test on the row the take reads anyway."""
_COLUMN_NAMES = ", ".join(c.name for c in COLUMNS)
_TAKEN_NAMES = f"runs.run_id, runs.schedule_to_start, {', '.join(f'runs.{c.name}' for c in COLUMNS)}"
"""What a take returns to its statement: the run as ``stored_run`` reads it, and what ``_UNQUEUE`` joins on."""

_TAKE_ON_WAKEUP = driver.Statement(text(inbox.handled_once(
    "worker",
    change=["taken AS (UPDATE runs SET lease_owner = :owner, lease_until = now() + :ttl, "
            "fencing_token = fencing_token + 1, awaiting_worker = NULL WHERE run_id = :b_run_id "
            f"AND {_LEASE_FREE} AND {_SERVED} AND {_NOT_QUEUED} AND NOT EXISTS (SELECT 1 FROM seen) "
            f"RETURNING {_TAKEN_NAMES})",
            # A run this worker cannot run is not taken: it waits, named, for a worker that can.
            f"declined AS (UPDATE runs SET awaiting_worker = {NEEDS_WORKER} WHERE run_id = :b_run_id "
            f"AND {_LEASE_FREE} AND NOT {_SERVED} AND {_NOT_QUEUED} "
            f"AND status IN ({sql_names(sorted(WORKER_HAS_WORK))}) "
            # Tested first, once: a taken run (the common case) is not looked up again.
            "AND NOT EXISTS (SELECT 1 FROM taken) AND NOT EXISTS (SELECT 1 FROM seen) RETURNING awaiting_worker)",
            f"unqueued AS ({_UNQUEUE})"],
    outcome="COALESCE((SELECT jsonb_build_object('taken', true, 'owner', lease_owner, 'token', fencing_token) "
            "FROM taken), (SELECT jsonb_build_object('taken', false, 'reason', "
            "'this worker does not run ' || awaiting_worker) FROM declined), CAST(:not_taken AS jsonb))",
    result=f"{', '.join(f'taken.{c.name}' for c in COLUMNS)} FROM (VALUES (1)) AS one(x) LEFT JOIN taken ON true")
).bindparams(_TTL))


NOT_TAKEN = "another worker holds the lease, or the run is queued for a slot"


async def take_on_wakeup(conn: driver.Connection, message: inbox.Message, owner: str, ttl: float,
                         served: Collection[str]) -> tuple[inbox.Handled, StoredRun | None]:
    """``take_lease`` with the worker's inbox row for the wakeup that asks for it, in one statement
    sent on its own: the outcome recorded (taken, with owner and token, or why not) and the run as
    taken (no second read). A run whose pins are not among ``served`` (``Registry.serves``) is not
    taken: it is marked as waiting for a worker that runs it (``adopt``)."""
    handled = await inbox.handle(conn, _TAKE_ON_WAKEUP, message, {
        "b_run_id": message.run_id, "owner": owner, "ttl": timedelta(seconds=ttl), "served": list(served),
        "not_taken": jsonb.dumps({"taken": False, "reason": NOT_TAKEN})})
    taken = handled.row.snapshot is not None and not handled.duplicate
    return handled, stored_run(handled.row) if taken else None


_ADOPT = driver.Statement(text(
    "WITH waiting AS (SELECT run_id FROM runs WHERE awaiting_worker IS NOT NULL "
    f"AND {_SERVED} AND {_LEASE_FREE} AND {_NOT_QUEUED} "
    "ORDER BY updated_at LIMIT :limit FOR UPDATE SKIP LOCKED), "
    "taken AS (UPDATE runs SET lease_owner = :owner, lease_until = now() + :ttl, fencing_token = fencing_token + 1, "
    f"awaiting_worker = NULL FROM waiting WHERE runs.run_id = waiting.run_id RETURNING {_TAKEN_NAMES}), "
    f"unqueued AS ({_UNQUEUE_ADOPTED}) SELECT {_COLUMN_NAMES} FROM taken"
).bindparams(_TTL))
HOLDERS = "worker"
"""The service whose members hold run leases: a lease's owner is a worker's membership ``instance_id``."""
_LAPSED = (f"EXISTS (SELECT 1 FROM service_members AS m WHERE m.service = {sql_name(HOLDERS)} "
           "AND m.instance_id = runs.lease_owner AND m.alive_until <= now())")
"""The lease's holder has a membership row that lapsed (by the database's clock): it died, froze
past its TTL, or stopped (``membership.leave`` lapses the row once its rounds in hand finished or were
ended; while it finishes them it renews the row, ``membership.stopping``). A holder
renewing its membership is never in it, however slow its call; an owner with no row keeps its
lease until it expires."""
_TAKER_LIVE = (f"EXISTS (SELECT 1 FROM service_members AS m WHERE m.service = {sql_name(HOLDERS)} "
               "AND m.instance_id = :owner AND m.alive_until > now() AND NOT m.stopping)")
_EARLIER_SELF = "(runs.lease_owner = :owner AND runs.lease_until < :started + :ttl)"
"""The holder is an earlier process under this worker's own name (restarted with the same
``LONGRUN_INSTANCE_ID``, whose renewal makes the row live again): a lease it took or renewed before
this process started (``:started``, the database's clock) expires before any this process sets."""
_TAKE_OVER_LAPSED = driver.Statement(text(
    "WITH lapsed AS (SELECT run_id, lease_owner FROM runs WHERE lease_owner IS NOT NULL "
    f"AND ({_LAPSED} OR {_EARLIER_SELF}) AND {_TAKER_LIVE} AND {_SERVED} AND {_NOT_QUEUED} "
    f"AND status IN ({sql_names(sorted(WORKER_HAS_WORK))}) "
    "ORDER BY lease_until LIMIT :limit FOR UPDATE SKIP LOCKED), "
    "taken AS (UPDATE runs SET lease_owner = :owner, lease_until = now() + :ttl, fencing_token = fencing_token + 1, "
    f"awaiting_worker = NULL FROM lapsed WHERE runs.run_id = lapsed.run_id "
    f"RETURNING lapsed.lease_owner AS lapsed_owner, {_TAKEN_NAMES}), "
    f"unqueued AS ({_UNQUEUE_ADOPTED}) SELECT lapsed_owner, {_COLUMN_NAMES} FROM taken"
).bindparams(_TTL))
_HAND_OVER = driver.Statement(text(
    f"UPDATE runs SET lease_owner = NULL, lease_until = NULL, awaiting_worker = {NEEDS_WORKER} "
    "WHERE run_id = :b_run_id AND lease_owner = :owner AND fencing_token = :token"))


async def adopt(conn: driver.Connection, owner: str, ttl: float, served: Collection[str], limit: int) -> list[StoredRun]:
    """Take the lease of up to ``limit`` runs waiting for a worker that runs them, if this is one:
    a wakeup reached a worker that could not run them (or one that lost them to a migration)."""
    rows = await driver.rows(conn, _ADOPT, {"owner": owner, "ttl": timedelta(seconds=ttl), "served": list(served),
                                            "limit": limit})
    return [stored_run(row) for row in rows]


async def take_over_lapsed(conn: driver.Connection, owner: str, ttl: float, served: Collection[str],
                           limit: int, started: datetime) -> list[tuple[StoredRun, str]]:
    """Take the lease of up to ``limit`` runs a worker has work for whose holder's membership lapsed,
    or whose holder was an earlier process named ``owner`` (this one ``started`` then, by the
    database's clock), if ``owner`` is a live member that runs them: each run as taken, with the
    holder it was taken from. The take bumps the fencing token, so the old holder's writes are
    refused if it ever resumes."""
    rows = await driver.rows(conn, _TAKE_OVER_LAPSED, {"owner": owner, "ttl": timedelta(seconds=ttl),
                                                        "served": list(served), "limit": limit,
                                                        "started": started})
    return [(stored_run(row), row.lapsed_owner) for row in rows]


async def hand_over(conn: driver.Connection, run_id: str, fence: Fence) -> None:
    """Give up a run this worker cannot run (it was migrated to a version the worker lacks): the
    lease released and the run marked as waiting for a worker that can, in one statement."""
    await driver.execute(conn, _HAND_OVER, {"b_run_id": run_id, "owner": fence.owner, "token": fence.token})


async def extend_lease(conn: driver.Connection, run_id: str, fence: Fence, ttl: float) -> bool:
    row = await driver.first(conn, _EXTEND_LEASE, {"b_run_id": run_id, "owner": fence.owner, "token": fence.token,
                                                  "ttl": timedelta(seconds=ttl)})
    return row is not None


async def release_lease(conn: driver.Connection, run_id: str, fence: Fence) -> None:
    await driver.execute(conn, _RELEASE_LEASE, {"b_run_id": run_id, "owner": fence.owner, "token": fence.token})
