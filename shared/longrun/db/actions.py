"""The side-effect ledger: one row per idempotency key, written with the run's events.

An idempotency key is used for exactly one request: the same key with another request
hash is refused (``IdempotencyKeyReused``), never silently reused.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import driver, jsonb
from longrun.db.schema import actions
from longrun.domain import ActionStatus
from longrun.errors import IdempotencyKeyReused


@dataclass(frozen=True, slots=True)
class LedgerRow:
    action_id: str
    run_id: str
    logical_action: str
    tool: str
    effect_kind: str
    idempotency_key: str
    request_hash: str
    request: dict[str, Any]
    status: str
    attempts: int
    external_id: str | None
    receipt: dict[str, Any] | None
    progress: dict[str, Any] | None = None
    """The details of the call's last recorded heartbeat."""
    heartbeat_at: datetime | None = None


# Built once (record: once per set of fields), so executing them hits SQLAlchemy's compiled cache.
_PREPARE = insert(actions).on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(actions.c.action_id)
_GET = select(actions).where(actions.c.idempotency_key == bindparam("key"))


@functools.cache
def _record(fields: frozenset[str]) -> Any:
    return (update(actions).where(actions.c.idempotency_key == bindparam("key"))
            .values(status=bindparam("status", type_=actions.c.status.type), updated_at=func.now(),
                    **{name: bindparam(name, type_=actions.c[name].type) for name in fields}))


def _row(r: Any) -> LedgerRow:
    return LedgerRow(r.action_id, r.run_id, r.logical_action, r.tool, r.effect_kind, r.idempotency_key,
                     r.request_hash, r.request, r.status, r.attempts, r.external_id, r.receipt, r.progress,
                     r.heartbeat_at)


def first_row(*, action_id: str, run_id: str, logical_action: str, tool: str, tool_version: str,
              effect_kind: str, idempotency_key: str, request_hash: str, request: dict[str, Any],
              fencing_token: int, status: ActionStatus = ActionStatus.SUBMITTED, **outcome: Any) -> dict[str, Any]:
    """The row of a request's first attempt: SUBMITTED before it is sent, or, for a call recorded only
    once it answered, already at its ``status`` with the ``outcome`` columns (external_id, receipt...)."""
    return {"action_id": action_id, "run_id": run_id, "logical_action": logical_action, "tool": tool,
            "tool_version": tool_version, "effect_kind": effect_kind, "idempotency_key": idempotency_key,
            "request_hash": request_hash, "request": request, "status": status.value, "attempts": 1,
            "fencing_token": fencing_token, **outcome}


async def prepare(conn: AsyncConnection, **request: Any) -> None:
    """Record a request (``first_row``'s arguments); the same key again is one more attempt of the same
    request, or refused if its request hash differs."""
    row = first_row(**request)
    inserted = await conn.execute(_PREPARE, row)
    if inserted.first() is None:
        key = row["idempotency_key"]
        existing = await get(conn, key)
        assert existing is not None
        if existing.request_hash != row["request_hash"]:
            raise IdempotencyKeyReused(key, existing.request_hash, row["request_hash"])
        outcome = {k: v for k, v in row.items() if k in ("external_id", "receipt", "receipt_ref", "last_error")}
        await record(conn, key, ActionStatus(row["status"]), attempts=existing.attempts + 1,
                     fencing_token=row["fencing_token"], **outcome)


async def record(conn: AsyncConnection, idempotency_key: str, status: ActionStatus, **fields: Any) -> None:
    await conn.execute(_record(frozenset(fields)), {**fields, "key": idempotency_key, "status": status.value})


async def get(conn: AsyncConnection, idempotency_key: str) -> LedgerRow | None:
    row = (await conn.execute(_GET, {"key": idempotency_key})).first()
    return None if row is None else _row(row)


async def for_run(conn: AsyncConnection, run_id: str) -> list[LedgerRow]:
    rows = await conn.execute(select(actions).where(actions.c.run_id == run_id).order_by(actions.c.created_at))
    return [_row(r) for r in rows]


async def unresolved(conn: AsyncConnection, *, limit: int) -> list[LedgerRow]:
    """Actions whose outcome is unknown, oldest first, skipping rows another reconciler holds."""
    rows = await conn.execute(
        select(actions).where(actions.c.status.in_([ActionStatus.UNKNOWN.value, ActionStatus.RECONCILING.value]))
        .order_by(actions.c.updated_at).limit(limit).with_for_update(skip_locked=True))
    return [_row(r) for r in rows]


# A heartbeat lands only for the attempt that sent it (its fencing token, still SUBMITTED), and moves
# that attempt's heartbeat timer (if it has one) in the same statement.
_BEAT = driver.Statement(text(
    "WITH beat AS (UPDATE actions SET progress = CAST(:progress AS jsonb), heartbeat_at = now() "
    "  WHERE idempotency_key = :key AND fencing_token = :token AND status = 'SUBMITTED' RETURNING run_id), "
    "moved AS (UPDATE timers SET wake_at = now() + make_interval(secs => CAST(:due_in AS float8)) FROM beat "
    "  WHERE timers.timer_key = :timer_key AND timers.fired_at IS NULL AND timers.cancelled_at IS NULL) "
    "SELECT count(*) AS beats FROM beat"))


async def beat(conn: driver.Connection, idempotency_key: str, *, fencing_token: int, progress: Any,
               timer_key: str | None, due_in: float) -> bool:
    """Record a call's heartbeat (its ``progress``) and move its heartbeat timer ``timer_key`` to
    ``due_in`` seconds from now; False, and nothing written, when the attempt is no longer this one."""
    row = await driver.one(conn, _BEAT, {"progress": jsonb.dumps(progress), "key": idempotency_key,
                                         "token": fencing_token, "timer_key": timer_key, "due_in": due_in})
    return bool(row.beats)
