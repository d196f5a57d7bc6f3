"""One checker for the end of every scenario: what a user would audit after a bad day.

- no external side effect happened twice (the forge counts effects per idempotency key), and
  none happened that the ledger cannot account for: every key the far side acted on belongs
  to an action in the ledger (an effect under a key longrun never recorded, e.g. one minted
  afresh for a retry, is a duplicate the per-key count cannot see). ``effects`` must come from
  the far side these runs alone talk to;
- each run's events form a gap-free sequence that folds, along legal transitions only
  (``evolve`` refuses anything else), into exactly the stored snapshot;
- the action ledger has no unexplained hole: every action is CONFIRMED, COMPENSATED,
  definitely FAILED, or explicitly waiting for a person; the ledger rows agree with
  the run's own record of its actions (for a finished run: that record carried forward by
  the late events the far side's reports were stored as, since only the ledger moves on;
  there RETRYABLE, "proved not to have happened", is an explained end too);
- every open run has a wake condition, and every run is in an explainable terminal
  or waiting state;
- every message the runtime sent (wakeups, status events, answers to creates) names its cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import actions as ledger
from longrun.db import outbox, runs
from longrun.domain import ACTION_TRANSITIONS, TERMINAL, ActionStatus, RunStatus, cleanup, fold
from longrun.domain import events as ev

EXPLAINED = frozenset({ActionStatus.CONFIRMED, ActionStatus.COMPENSATED, ActionStatus.FAILED,
                       ActionStatus.NEEDS_ATTENTION})
EXPLAINED_AFTER_THE_END = EXPLAINED | {ActionStatus.RETRYABLE}


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
        keys: set[str] = set()
        for run_id in run_ids:
            stored = await runs.load(conn, run_id)
            assert stored is not None
            history = await runs.history(conn, run_id)
            problems += _history(run_id, history, stored)
            rows = await ledger.for_run(conn, run_id)
            action_count += len(rows)
            keys.update(r.idempotency_key for r in rows)
            problems += _ledger(stored, rows, settled=settled, history=history)
            problems += await _wake_condition(conn, stored, settled=settled)
        problems += await _uncaused(conn)
    for effect in effects or []:
        if effect["idempotency_key"] not in keys:
            problems.append(f"external effect {effect['kind']} under key {effect['idempotency_key']} "
                            f"belongs to no action in the ledger")
    return Report(len(run_ids), action_count, len(effects or []), tuple(problems))


CAUSED = ("run.wakeup", "run.event", "run.accepted", "run.rejected")
"""What the runtime sends: each names what caused it (a message's event_id, or who acted)."""


async def _uncaused(conn: Any) -> list[str]:
    rows = await conn.execute(text("SELECT type, payload FROM outbox WHERE type = ANY(:types) ORDER BY id"),
                              {"types": list(CAUSED)})
    uncaused: dict[str, list[str]] = {}
    for row in rows:
        envelope = outbox.envelope_of(row.type, row.payload)
        if envelope.get("causation_id") is None:
            uncaused.setdefault(row.type, []).append(envelope["event_id"])
    return [f"{len(ids)} {kind} message(s) name no cause (e.g. {min(ids)})" for kind, ids in sorted(uncaused.items())]


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


def _ledger(stored: runs.StoredRun, rows: list[ledger.LedgerRow], *, settled: bool,
            history: list[Any] | None = None) -> list[str]:
    """The ledger against the run's record of its actions.

    After a run ended, what the far side reports is stored as late events and only the ledger
    row moves on (the snapshot of a finished run never changes): there the ledger must match
    the snapshot's record carried forward by the late action events of ``history``, and it is
    the ledger's status that must be explained. RETRYABLE explains a finished run's action too:
    reconciliation proved nothing happened, and nothing will be retried.
    """
    run = stored.snapshot
    finished = run.status in TERMINAL
    told = _after_the_end(run, history or []) if finished else {}
    problems = []
    recorded = {a.logical_action: a for a in run.actions}
    by_action = {r.logical_action: r for r in rows}
    problems += _cleanup_rows(run, [r for r in rows if cleanup.is_cleanup(r.logical_action)], history or [])
    for row in rows:
        if cleanup.is_cleanup(row.logical_action):
            continue
        own = recorded.get(row.logical_action)
        if own is None:
            problems.append(f"{run.run_id}: ledger row {row.logical_action} is not in the run's record")
            continue
        if own.idempotency_key != row.idempotency_key or own.request_hash != row.request_hash:
            problems.append(f"{run.run_id}: ledger row {row.logical_action} disagrees with the run on key or hash")
        expected = told.get(row.logical_action, own.status)
        if expected.value != row.status and not (expected is ActionStatus.PREPARED and row.status == "SUBMITTED"):
            late = " (late events included)" if expected is not own.status else ""
            problems.append(f"{run.run_id}: {row.logical_action} is {row.status} in the ledger, "
                            f"{expected.value} in the run{late}")
    for action in run.actions:
        row = by_action.get(action.logical_action)
        if row is None:
            problems.append(f"{run.run_id}: {action.logical_action} has no ledger row")
            continue
        status = ActionStatus(row.status) if finished else action.status
        if settled and status not in (EXPLAINED_AFTER_THE_END if finished else EXPLAINED):
            problems.append(f"{run.run_id}: {action.logical_action} left {status.value} "
                            f"(run {run.status.value})")
    return problems


def _cleanup_rows(run: Any, rows: list[ledger.LedgerRow], history: list[Any]) -> list[str]:
    """A cleanup's ledger rows against the run: only a run that ended owing its cleanup has them,
    and a step is CONFIRMED on the ledger exactly when the run recorded it done, once."""
    if rows and run.status not in cleanup.CLEANS_UP:
        return [f"{run.run_id}: {run.status.value} yet cleaned up ({', '.join(r.logical_action for r in rows)})"]
    done = [cleanup.logical_action(e.step) for e in history
            if isinstance(e, ev.CleanupRecorded) and e.outcome == cleanup.DONE]
    problems = [f"{run.run_id}: cleanup {name} recorded done {done.count(name)} times" for name in set(done)
                if done.count(name) > 1]
    confirmed = {r.logical_action for r in rows if r.status == ActionStatus.CONFIRMED.value}
    problems += [f"{run.run_id}: {name} is CONFIRMED on the ledger, not done in the run" for name in confirmed - set(done)]
    return problems + [f"{run.run_id}: {name} is done in the run, not CONFIRMED on the ledger"
                       for name in set(done) - confirmed]


_ACTION_STEP: dict[str, ActionStatus] = {
    ev.ActionSubmitted.type: ActionStatus.SUBMITTED, ev.ActionConfirmed.type: ActionStatus.CONFIRMED,
    ev.ActionRecorded.type: ActionStatus.CONFIRMED,
    ev.ActionFailed.type: ActionStatus.FAILED, ev.ActionUnknown.type: ActionStatus.UNKNOWN,
    ev.ActionUnavailable.type: ActionStatus.RETRYABLE,
    ev.ReconciliationStarted.type: ActionStatus.RECONCILING, ev.CompensationStarted.type: ActionStatus.COMPENSATING,
    ev.ActionCompensated.type: ActionStatus.COMPENSATED,
}


def _after_the_end(run: Any, history: list[Any]) -> dict[str, ActionStatus]:
    """Each action's status once the late action events stored after the run ended are applied
    along the action table (an illegal step leaves it where it was, and shows as a disagreement)."""
    status = {a.logical_action: a.status for a in run.actions}
    for event in history:
        if event.seq <= run.last_seq or not isinstance(event, ev.ActionEvent) or event.logical_action not in status:
            continue
        to = event.outcome if isinstance(event, ev.ActionReconciled | ev.ActionResolved) else _ACTION_STEP.get(event.type)
        if to is not None and to in ACTION_TRANSITIONS[status[event.logical_action]]:
            status[event.logical_action] = to
    return status


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
            "SELECT count(*) FROM timers WHERE run_id = :r AND fired_at IS NULL AND cancelled_at IS NULL "
            "AND payload->>'wait_id' = :w"),
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
