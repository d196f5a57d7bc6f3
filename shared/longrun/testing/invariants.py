"""One checker for the end of every scenario: what a user would audit after a bad day.

- no external side effect happened twice (the forge counts effects per idempotency key);
- each run's events form a gap-free sequence that folds, along legal transitions only
  (``evolve`` refuses anything else), into exactly the stored snapshot;
- the action ledger has no unexplained hole: every action is CONFIRMED, COMPENSATED,
  definitely FAILED, or explicitly waiting for a person; the ledger rows agree with
  the run's own record of its actions;
- every open run has a wake condition, and every run is in an explainable terminal
  or waiting state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import actions as ledger
from longrun.db import runs
from longrun.domain import TERMINAL, ActionStatus, RunStatus, fold

EXPLAINED = frozenset({ActionStatus.CONFIRMED, ActionStatus.COMPENSATED, ActionStatus.FAILED,
                       ActionStatus.NEEDS_ATTENTION})


@dataclass(frozen=True, slots=True)
class Report:
    runs: int
    actions: int
    effects: int
    violations: tuple[str, ...]

    def assert_clean(self) -> None:
        assert not self.violations, "invariant violations:\n  " + "\n  ".join(self.violations)


async def check(engine: AsyncEngine, *, effects: list[dict[str, Any]] | None = None,
                settled: bool = True) -> Report:
    """``settled``: the scenario is over, so nothing may still be in flight."""
    problems: list[str] = []
    for effect in effects or []:
        if effect["count"] > 1:
            problems.append(f"external effect {effect['kind']} under key {effect['idempotency_key']} "
                            f"happened {effect['count']} times")
    async with engine.connect() as conn:
        run_ids = (await conn.execute(text("SELECT run_id FROM runs ORDER BY run_id"))).scalars().all()
        action_count = 0
        for run_id in run_ids:
            stored = await runs.load(conn, run_id)
            assert stored is not None
            history = await runs.history(conn, run_id)
            problems += _history(run_id, history, stored)
            rows = await ledger.for_run(conn, run_id)
            action_count += len(rows)
            problems += _ledger(stored, rows, settled=settled)
            problems += await _wake_condition(conn, stored, settled=settled)
    return Report(len(run_ids), action_count, len(effects or []), tuple(problems))


def _history(run_id: str, history: list[Any], stored: runs.StoredRun) -> list[str]:
    seqs = [e.seq for e in history]
    if seqs != list(range(1, len(seqs) + 1)):
        return [f"{run_id}: event sequence has gaps or repeats: {seqs}"]
    try:
        folded = fold(history)
    except Exception as e:
        return [f"{run_id}: history does not fold along legal transitions: {e}"]
    if folded != stored.snapshot:
        return [f"{run_id}: stored snapshot differs from the fold of its events"]
    return []


def _ledger(stored: runs.StoredRun, rows: list[ledger.LedgerRow], *, settled: bool) -> list[str]:
    run = stored.snapshot
    problems = []
    recorded = {a.logical_action: a for a in run.actions}
    for row in rows:
        own = recorded.get(row.logical_action)
        if own is None:
            problems.append(f"{run.run_id}: ledger row {row.logical_action} is not in the run's record")
            continue
        if own.idempotency_key != row.idempotency_key or own.request_hash != row.request_hash:
            problems.append(f"{run.run_id}: ledger row {row.logical_action} disagrees with the run on key or hash")
        if own.status.value != row.status and not (own.status is ActionStatus.PREPARED and row.status == "SUBMITTED"):
            problems.append(f"{run.run_id}: {row.logical_action} is {row.status} in the ledger, "
                            f"{own.status.value} in the run")
    for action in run.actions:
        if action.logical_action not in {r.logical_action for r in rows}:
            problems.append(f"{run.run_id}: {action.logical_action} has no ledger row")
        if settled and action.status not in EXPLAINED:
            problems.append(f"{run.run_id}: {action.logical_action} left {action.status.value} "
                            f"(run {run.status.value})")
    return problems


async def _wake_condition(conn: Any, stored: runs.StoredRun, *, settled: bool) -> list[str]:
    run = stored.snapshot
    if run.status in TERMINAL:
        return [] if run.terminal_reason or run.status is RunStatus.COMPLETED else [
            f"{run.run_id}: ended {run.status.value} without a reason"]
    if run.status in (RunStatus.WAITING_EVENT, RunStatus.WAITING_USER, RunStatus.RETRY_SCHEDULED):
        wait = run.wait
        if wait is None or wait.deadline is None:
            return [f"{run.run_id}: {run.status.value} without a deadline"]
        timers = (await conn.execute(text(
            "SELECT count(*) FROM timers WHERE run_id = :r AND fired_at IS NULL AND payload->>'wait_id' = :w"),
            {"r": run.run_id, "w": wait.wait_id})).scalar()
        if not timers:
            return [f"{run.run_id}: {run.status.value} has no pending timer for its deadline"]
        if run.status is RunStatus.WAITING_EVENT and not wait.correlation_key and wait.wake_at is None:
            return [f"{run.run_id}: WAITING_EVENT with neither a correlation key nor a timer"]
        return []
    if run.status in (RunStatus.NEEDS_ATTENTION, RunStatus.PAUSED):
        return []  # explicitly waiting for a person
    if settled:
        return [f"{run.run_id}: left {run.status.value} with nothing to wake it"]
    return []
