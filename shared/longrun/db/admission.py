"""Admission's choice, written once: a tenant's best queued runs, by priority plus one point per
``aging`` seconds waited, then age; rows another admitter holds are skipped, not waited for."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import tenant_limits
from longrun.db.schema import HOLDS_SLOT, QUEUED

ADMITTED_OPEN = f"tenant_id = {{tenant}} AND {HOLDS_SLOT}"
"""A tenant's runs holding a slot (read through ix_runs_holding_slots)."""


def held(*, tenant: str, up_to: str) -> str:
    """How many slots a tenant's runs hold, counted up to ``up_to`` (SQL expressions): whether a slot
    is free needs no more, and the count stops there however many runs the tenant keeps admitted (a
    million parked runs of one tenant made every finish count a million index entries)."""
    return f"(SELECT count(*) FROM (SELECT 1 FROM runs WHERE {ADMITTED_OPEN.format(tenant=tenant)} LIMIT ({up_to})) AS h)"


def queued_in(tenant: str) -> str:
    """Whether one of a tenant's runs is queued for a slot (through ix_runs_queued)."""
    return f"EXISTS (SELECT 1 FROM runs WHERE tenant_id = {tenant} AND {QUEUED})"


def hands_on(tenant: str, default_slots: str) -> str:
    """Whether a finishing run's slot goes to a queued run (SQL expressions): one of the tenant's runs
    is queued, its budget is not spent, and with the finishing run still counted (the statement's
    snapshot) its runs hold at most its slots (its own, else ``default_slots``). Counted only once a
    run is known to be queued: a finish with nobody waiting reads no run holding a slot."""
    slots = tenant_limits.slots(tenant, default_slots)
    return (f"{queued_in(tenant)} AND NOT {tenant_limits.spent(tenant)} "
            f"AND {held(tenant=tenant, up_to=f'{slots} + 1')} <= {slots}")


def tenant_slots(tenant: str) -> str:
    """A tenant's slots (its own, else ``:slots``), how many its runs hold (up to them), whether one of
    its runs is queued for one (through ix_runs_holding_slots and ix_runs_queued: the length of its
    queue does not matter), and whether its budget is spent for the period."""
    slots = tenant_limits.slots(tenant, ":slots")
    return (f"SELECT {held(tenant=tenant, up_to=slots)} AS active, {slots} AS slots, "
            f"{queued_in(tenant)} AS waiting, {tenant_limits.spent(tenant)} AS spent")


def key_holders(*, tenant: str, key: str, up_to: str, besides: str = "NULL") -> str:
    """How many runs hold ``key`` of ``tenant`` (SQL expressions), counted up to ``up_to`` through
    ix_runs_holding_keys, the run ``besides`` not counted: the function ``concurrency_key_holders``
    (migration 0036), so a statement that asks it for no run sets up no subquery."""
    return f"concurrency_key_holders({tenant}, {key}, CAST({up_to} AS integer), CAST({besides} AS text))"


def key_free(run: str, *, ended_key: str | None = None) -> str:
    """Whether the queued run ``run`` (an alias of runs) may run for its key: it has none, holds it
    already (it waited without its slot), or the key has room. ``ended_key``: SQL of the key the
    transition's run gave back by ending, whose holding the statement's snapshot still shows.
    Runs without a key stop at the first test and read nothing more."""
    besides = "NULL" if ended_key is None else f"CASE WHEN {ended_key} IS NOT NULL THEN :b_run_id END"
    count = key_holders(tenant=f"{run}.tenant_id", key=f"{run}.concurrency_key",
                        up_to=f"{run}.concurrency_limit", besides=besides)
    return (f"({run}.concurrency_key IS NULL OR {run}.concurrency_held_at IS NOT NULL "
            f"OR {count} < {run}.concurrency_limit)")


TAKES_KEY = "concurrency_held_at = CASE WHEN concurrency_key IS NOT NULL THEN coalesce(concurrency_held_at, now()) END"
"""Set with ``admitted_at``: a run with a key holds it from its first admission (a run without one keeps NULL)."""


SCORE = "{runs}.priority + extract(epoch FROM now() - {runs}.created_at) / {aging}"


def best_queued(*, tenant: str, aging: str, limit: str, ended_key: str | None = None) -> str:
    """The SELECT of the best queued run ids (``tenant``, ``aging``, ``limit`` are SQL expressions).

    Within one priority the oldest run scores best, so the best ``limit`` overall are among the
    ``limit`` oldest of each priority: those are read and locked through ix_runs_queued (its
    priorities found by skipping from one to the next), and only they are scored. The cost follows
    the number of priorities in use, not the length of the queue (a score over the whole queue sorted
    it on every admission and every finished run). The runs are locked where they are read: joined to
    runs again to lock them, a queue the statistics have not seen yet (a burst of creates) made the
    planner scan the whole queue once per candidate.

    A run waiting for its concurrency key is passed over (``key_free``; ``ended_key`` as there), so it
    holds back none behind it. Several runs taking one key each see the room it had when the statement
    began: the admission round gives back what they took past it (``services.scheduler.admitting``).
    """
    queued = f"tenant_id = {tenant} AND {QUEUED}"
    candidates = (
        "FROM level, LATERAL ("
        f"  SELECT run_id, priority, created_at FROM runs WHERE {queued} AND priority = level.priority "
        f"  AND {key_free('runs', ended_key=ended_key)} "
        # Checked again on each row locked (another admitter may have admitted it meanwhile).
        f"  ORDER BY created_at LIMIT {limit} FOR UPDATE SKIP LOCKED) AS oldest ")
    levels = (
        "WITH RECURSIVE level AS ("
        f"  (SELECT priority FROM runs WHERE {queued} ORDER BY priority LIMIT 1)"
        "  UNION ALL"
        f"  SELECT (SELECT priority FROM runs WHERE {queued} AND priority > level.priority ORDER BY priority LIMIT 1)"
        "  FROM level WHERE level.priority IS NOT NULL) ")
    return (f"{levels}SELECT oldest.run_id {candidates}"
            f"ORDER BY {SCORE.format(aging=aging, runs='oldest')} DESC, oldest.created_at LIMIT {limit}")


def admit_best() -> TextClause:
    """The best queued runs of a tenant (``:t``), at most ``:n``, admitted in the statement that picks them."""
    return text(
        f"UPDATE runs SET admitted_at = now(), {TAKES_KEY} "
        f"WHERE run_id IN ({best_queued(tenant=':t', aging=':aging', limit=':n')}) "
        "RETURNING run_id, tenant_id, partition, revision, created_at, workflow, concurrency_key, concurrency_limit, "
        "concurrency_held_at = now() AS took_key, "
        "extract(epoch FROM admitted_at - created_at) AS waited, "
        f"{SCORE.format(aging=':aging', runs='runs')} AS score")


ADMIT_BEST = admit_best()

KEY_HOLDERS = text("SELECT " + key_holders(tenant=":t", key=":k", up_to=":n"))
"""How many runs hold a tenant's key (``:t``, ``:k``), counted up to ``:n``."""
GIVE_BACK = text("UPDATE runs SET admitted_at = NULL, concurrency_held_at = NULL "
                 "WHERE run_id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))")
"""Runs an admission statement took past their key's room, queued again as they were."""

TENANT_LOCK = "pg_advisory_xact_lock(hashtext('longrun.admit:' || :t))"
LOCK_TENANT = text(f"SELECT {TENANT_LOCK}")
"""A tenant's admission lock (``:t``), held to the end of the transaction: creates and admissions of
one tenant count its slots one after another."""


async def notify(conn: AsyncConnection, channel: str, tenants: Sequence[str]) -> None:
    """Finished runs freed slots of ``tenants``: let the scheduler (listening on ``channel``) admit the
    next ones now."""
    for tenant in sorted(set(tenants)):
        await conn.execute(text("SELECT pg_notify(:c, :t)"), {"c": channel, "t": tenant})
