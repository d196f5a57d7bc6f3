"""The reconciler's alerts: runs silent past their limit, and confirmed actions that drifted on the far side.

Responsibility:
- ``flag_silent_runs``: a run parked in a status longer than its limit raises one alert.
- ``flag_runs_without_worker``: a run waiting for a worker of its version while no live worker
  runs it raises one alert.
- ``check_drift``: a confirmed action whose far-side object vanished or changed identity
  raises one alert; if its run COMPLETED, the drift contradicts what the run counted as done
  and also opens a correction (``run.correction_needed`` on the run, broadcast publicly, and a
  ``CORRECTION_ALERT``), in the same transaction as the alert.

Invariants:
- Alerts (audit_log rows by actor "reconciler") never change a run's status or what it
  recorded; a correction is a new event on the finished run, nothing is overwritten.
- Alerts are deduplicated per episode under an advisory lock (``_alert_once``), so several
  replicas may raise them at once. The reads are ``longrun.db.alerts``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun import metrics
from longrun.app import effects
from longrun.app.reconciler.common import (
    CORRECTION_ALERT,
    DRIFT_ALERT,
    METRICS,
    NO_WORKER_ALERT,
    PRODUCER,
    SILENT_ALERT,
)
from longrun.authoring import Registry, Tool
from longrun.db import alerts, outbox, runs
from longrun.db.audit import audit, tenant_of_run
from longrun.domain import ActionStatus, RunStatus, closure, thaw

logger = logging.getLogger(__name__)

# -- silent runs -----------------------------------------------------------------------------------


async def flag_silent_runs(engine: AsyncEngine, *, limits: Mapping[RunStatus, float], limit: int = 200) -> int:
    """One alert per run and status episode past its limit; returns the alerts raised.

    An episode is (status, ``status_since``): entering the status again starts a new one.
    A run whose worker holds a live lease is being worked on, so it is not silent.
    """
    if not limits:
        return 0
    async with engine.connect() as conn:
        rows = await alerts.silent_runs(conn, limits=limits, alert=SILENT_ALERT, limit=limit)
    raised = 0
    for row in rows:
        status = RunStatus(row.status)
        reason = (f"{status.value} for {float(row.silent_for):.0f}s with no worker on it "
                  f"(limit {limits[status]:.0f}s)")
        async with engine.begin() as conn:
            if not await _alert_once(conn, SILENT_ALERT, row.run_id, row.episode, reason,
                                     {"status": status.value, "since": float(row.since),
                                      "limit_seconds": limits[status]}):
                continue
        raised += 1
        METRICS[f"{SILENT_ALERT}.{status.value}"] += 1
        metrics.ALERTS.labels(SILENT_ALERT).inc()
        logger.warning("run %s is silent: %s", row.run_id, reason)
    return raised


# -- runs no live worker can run ------------------------------------------------------------------

async def flag_runs_without_worker(engine: AsyncEngine, *, limit: int = 200) -> int:
    """One alert per run and wait while no live worker advertises its pins (``service_members``): it
    cannot move until one joins (it then resumes by itself) or an operator migrates it. A wait is
    (what it waits for, revision): the run moving on and waiting again is another."""
    async with engine.connect() as conn:
        rows = await alerts.runs_without_worker(conn, alert=NO_WORKER_ALERT, limit=limit)
    raised = 0
    for row in rows:
        reason = f"waiting for a compatible worker: {row.awaiting_worker} (no live worker runs it)"
        async with engine.begin() as conn:
            if not await _alert_once(conn, NO_WORKER_ALERT, row.run_id, row.episode, reason,
                                     {"needs": row.awaiting_worker}):
                continue
        raised += 1
        METRICS[NO_WORKER_ALERT] += 1
        metrics.ALERTS.labels(NO_WORKER_ALERT).inc()
        logger.warning("run %s is %s", row.run_id, reason)
    return raised


async def _alert_once(conn: AsyncConnection, action: str, target: str, episode: str, reason: str,
                      details: Mapping[str, Any]) -> bool:
    """Write the alert unless this episode already has one; False when it had."""
    if await alerts.raised_before(conn, action, target, episode):
        return False
    await audit(conn, actor=PRODUCER, action=action, target=target, reason=reason,
                details={"episode": episode, **details}, tenant=tenant_of_run(target))
    return True


# -- drift -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriftSweep:
    checked: int
    drifted: int
    next_after: str
    """The action id the next sweep continues after; "" once the last confirmed action was reached."""


async def check_drift(engine: AsyncEngine, registry: Registry, *, limit: int, after: str = "",
                      clock: Callable[[], float] = time.time) -> DriftSweep:
    """Compare up to ``limit`` confirmed actions (ids after ``after``) with the far side.

    Drift is identity, not content: far-side objects legitimately change (a branch head
    moves, a merge request is merged), so only a missing object or another external id for
    the same key is reported, once per action and problem. A lookup that fails is skipped.
    """
    async with engine.connect() as conn:
        rows = await alerts.confirmed_actions(conn, after=after, limit=limit)
    checks = []
    for row in rows:
        try:
            tool = registry.get(row.workflow, row.workflow_version).tools.get(row.tool)
        except LookupError:
            continue
        if tool is not None and tool.lookup is not None:
            checks.append((row, tool))
    problems = await asyncio.gather(*(_drift(tool, row.logical_action, row.idempotency_key, row.external_id)
                                      for row, tool in checks))
    drifted = 0
    for (row, tool), drift in zip(checks, problems, strict=True):
        if drift is None:
            continue
        problem, report = drift
        reason = f"{row.logical_action} ({tool.name}, key {row.idempotency_key}): {problem}"
        async with engine.begin() as conn:
            if not await _alert_once(conn, DRIFT_ALERT, row.run_id, f"{row.logical_action}: {problem}", reason,
                                     {"logical_action": row.logical_action, "tool": tool.name,
                                      "idempotency_key": row.idempotency_key,
                                      "recorded_external_id": row.external_id}):
                continue
            if row.status == RunStatus.COMPLETED.value:
                await _open_correction(conn, row.run_id, report, at=clock())
        drifted += 1
        METRICS[DRIFT_ALERT] += 1
        metrics.ALERTS.labels(DRIFT_ALERT).inc()
        logger.warning("run %s drifted: %s", row.run_id, reason)
    return DriftSweep(len(checks), drifted, rows[-1].action_id if len(rows) == limit else "")


async def _drift(tool: Tool, logical_action: str, key: str,
                 recorded_id: str | None) -> tuple[str, closure.Report] | None:
    """What drifted, and what the far side reported, or None (no drift, or the lookup failed)."""
    assert tool.lookup is not None
    try:
        found = await asyncio.wait_for(tool.lookup(key), timeout=tool.start_to_close)
    except Exception as e:
        logger.info("drift check of %s skipped: lookup failed (%s: %s)", key, e.__class__.__name__, e)
        return None
    if found is None:
        return ("missing: the far side has nothing under the idempotency key",
                closure.Report(logical_action, None))
    if recorded_id is not None and found.external_id != recorded_id:
        return (f"different id: recorded {recorded_id}, the far side has {found.external_id}",
                closure.Report(logical_action, ActionStatus.CONFIRMED, found.external_id))
    return None


async def _open_correction(conn: AsyncConnection, run_id: str, report: closure.Report, *, at: float) -> None:
    """Record on a COMPLETED run the correction ``report`` opens, broadcast it and raise its alert."""
    stored = await runs.load(conn, run_id, lock=True)
    assert stored is not None, "an action's run exists"
    for correction in closure.corrections(stored.snapshot, [report], seq=stored.seq(1), at=at):
        stored = await runs.append(conn, stored, [correction])
        await outbox.enqueue_many(conn, [effects.correction_message(stored, correction, producer=PRODUCER,
                                                                    cause=f"reconciler:drift:{report.logical_action}")])
        await audit(conn, actor=PRODUCER, action=CORRECTION_ALERT, target=run_id, reason=correction.reason,
                    details={"logical_action": correction.logical_action, **thaw(correction.evidence)},
                    tenant=tenant_of_run(run_id))
        METRICS[CORRECTION_ALERT] += 1
        metrics.ALERTS.labels(CORRECTION_ALERT).inc()
        logger.warning("run %s needs a correction: %s", run_id, correction.reason)
