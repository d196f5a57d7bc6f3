"""The reconciler's alert reads: silent runs, runs no live worker can run, confirmed actions to
check for drift, and whether an alert episode was already raised (under an advisory lock, so
replicas raising the same alert wait for each other)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import ColumnElement, Float, Row, and_, exists, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import actions, sql_names
from longrun.db.schema_tenants import audit_log
from longrun.db.schema import runs as runs_table
from longrun.domain import WORKER_HAS_WORK, ActionStatus, RunStatus, cleanup

_ALERT_LOCK_NAMESPACE = 0x6C72_6C74
"""First key of the two-key advisory lock that serialises alerts for one target."""


def silent(limits: Mapping[RunStatus, float]) -> ColumnElement[bool]:
    """Runs in a status longer than its limit with no live lease (``limits`` not empty)."""
    since = runs_table.c.snapshot["status_since"].astext.cast(Float)
    now = func.date_part("epoch", func.now())
    return and_(or_(*(and_(runs_table.c.status == RunStatus(status).value, since < now - seconds)
                      for status, seconds in limits.items())),
                or_(runs_table.c.lease_owner.is_(None), runs_table.c.lease_until <= func.now()),
                # Waiting for a worker that runs its version: that alert says why.
                runs_table.c.awaiting_worker.is_(None))


async def silent_runs(conn: AsyncConnection, *, limits: Mapping[RunStatus, float], alert: str,
                      limit: int) -> Sequence[Row]:  # type: ignore[type-arg]
    """Silent runs without an ``alert`` for their episode (status and ``status_since``), longest
    silent first: run_id, status, since, episode, silent_for."""
    since = runs_table.c.snapshot["status_since"].astext
    episode = runs_table.c.status + "@" + since
    now = func.date_part("epoch", func.now())
    return (await conn.execute(
        select(runs_table.c.run_id, runs_table.c.status, since.label("since"), episode.label("episode"),
               (now - since.cast(Float)).label("silent_for"))
        .where(silent(limits),
               ~exists().where(audit_log.c.action == alert, audit_log.c.target == runs_table.c.run_id,
                               audit_log.c.details["episode"].astext == episode))
        .order_by(since.cast(Float)).limit(limit))).all()


_WITHOUT_WORKER = text(
    "SELECT r.run_id, r.awaiting_worker, r.awaiting_worker || '#' || r.revision AS episode FROM runs r "
    f"WHERE r.awaiting_worker IS NOT NULL AND r.status IN ({sql_names(sorted(WORKER_HAS_WORK))}) "
    "AND NOT EXISTS (SELECT 1 FROM service_members m WHERE m.service = 'worker' AND m.alive_until > now() "
    "AND NOT m.stopping AND m.advertised @> jsonb_build_array(jsonb_build_object('kind', r.workflow, 'workflow', r.workflow_version, "
    "'prompt', r.prompt_version, 'model_policy', r.model_policy_version, 'tool_schemas', r.tool_schema_version))) "
    "AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.action = :action AND a.target = r.run_id "
    "AND a.details->>'episode' = r.awaiting_worker || '#' || r.revision) "
    "ORDER BY r.updated_at LIMIT :limit")


async def runs_without_worker(conn: AsyncConnection, *, alert: str,
                              limit: int) -> Sequence[Row]:  # type: ignore[type-arg]
    """Runs waiting for a worker of their pins while no live worker advertises them, without an
    ``alert`` for this wait: run_id, awaiting_worker, episode."""
    return (await conn.execute(_WITHOUT_WORKER, {"action": alert, "limit": limit})).all()


async def confirmed_actions(conn: AsyncConnection, *, after: str,
                            limit: int) -> Sequence[Row]:  # type: ignore[type-arg]
    """Up to ``limit`` confirmed actions with ids after ``after``, with their run's kind, version and
    status, by action id."""
    # The batch is chosen from the ledger first, then joined to its runs: joined before the limit,
    # the planner may read every run to hash them (88 ms at 100,000 runs, growing with them).
    batch = (select(actions.c.action_id, actions.c.run_id, actions.c.logical_action, actions.c.tool,
                    actions.c.idempotency_key, actions.c.external_id)
             .where(actions.c.status == ActionStatus.CONFIRMED.value, actions.c.action_id > after,
                    # What a cleanup released is gone from the far side on purpose.
                    ~actions.c.logical_action.startswith(cleanup.PREFIX, autoescape=True))
             .order_by(actions.c.action_id).limit(limit).cte("batch"))
    return (await conn.execute(
        select(batch, runs_table.c.workflow, runs_table.c.workflow_version, runs_table.c.status)
        .join_from(batch, runs_table, batch.c.run_id == runs_table.c.run_id)
        .order_by(batch.c.action_id))).all()


async def raised_before(conn: AsyncConnection, action: str, target: str, episode: str) -> bool:
    """Whether this alert episode has its row; the advisory lock taken first is held to commit, so
    a replica raising the same alert waits, then sees the row."""
    await conn.execute(text("SELECT pg_advisory_xact_lock(CAST(:ns AS integer), hashtext(:key))"),
                       {"ns": _ALERT_LOCK_NAMESPACE, "key": f"{action}:{target}"})
    return (await conn.execute(
        select(audit_log.c.id).where(audit_log.c.action == action, audit_log.c.target == target,
                                     audit_log.c.details["episode"].astext == episode).limit(1))).first() is not None
