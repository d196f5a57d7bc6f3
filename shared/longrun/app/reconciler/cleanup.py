"""Cleanup at closure: the reconciler runs a finished run's cleanup steps through the action ledger.

Responsibility (``domain.cleanup`` decides; this module does the I/O, against ``ports.cleanups``):
- ``clean_up``: every cleanup due is claimed, and its run kind's steps (``RunKind.cleanup``) run in
  order, each a call of the kind's tool under its own idempotency key, recorded on the ledger before it
  is sent and confirmed with its answer; each attempt's outcome is a ``run.cleanup`` event on the run.
- A step that fails stops the cleanup there: it is due again after the kind's ``cleanup_retry``
  backoff, and its first failure raises ``alert.cleanup_failed``; the cleanup that then succeeds
  resolves it (``alert.resolved``).

Why the reconciler, not the worker that finished the run: the finishing move writes the cleanup's
row itself, whoever writes it (a worker, the timer's deadline, a cancel), so no finished run is
missed; the worker gives its lease up with that move and takes its next run, and a cleanup retried
for hours holds no worker. A reconciler that dies mid-cleanup leaves the claim to lapse
(``domain.cleanup.hold``): the next one finds a confirmed step confirmed, sends an idempotent one
again under its key, and asks the far side by key about a non-idempotent one before sending it.

Invariants:
- A cleanup never changes how its run ended; its events are recorded on the finished run.
- No transaction is held across a call to the far side.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from longrun import faults, metrics
from longrun.app.reconciler.common import CLEANUP_ALERT, METRICS, PRODUCER, RESOLVED_ALERT
from longrun.authoring import CleanupStep, Registry, RunKind, Tool, ToolResult
from longrun.domain import ActionStatus, cleanup, request_hash
from longrun.domain import events as ev
from longrun.domain.retry import Rng
from longrun.errors import ToolRejected, ToolUnavailable
from longrun.ports.cleanups import Claimed, CleanupStore
from longrun.ports.runs import LedgerOutcome, LedgerRequest, StoredRun

logger = logging.getLogger(__name__)

_A = ActionStatus
UNKNOWN_KIND_DELAY = 300.0
"""Seconds before a reconciler that does not know a run's kind looks at its cleanup again (one
deployed with that kind may take it meanwhile)."""
ERROR_CHARS = 500
"""What a failure's message may take of its event, alert and row."""
EPISODE = "cleanup"
"""A run's cleanup alert is raised once, whatever its attempts."""


@dataclass(frozen=True, slots=True)
class _Failure:
    step: CleanupStep
    error: str
    ledger: ActionStatus | None
    """What the attempt's ledger row is left at; None: nothing was recorded for it."""


async def clean_up(store: CleanupStore, registry: Registry, *, limit: int, clock: Callable[[], float],
                   rng: Rng = random.Random()) -> Counter[str]:
    """Run the cleanups due (at most ``limit``); how each ended: done, failed, taken (by another
    reconciler), unknown kind, nothing (its kind declares no step). One run's error is logged and
    does not stop the others."""
    outcomes: Counter[str] = Counter()
    # Every finished run owes a cleanup row (its writer does not know its kind): the rows of kinds with
    # no cleanup step go in one statement.
    if dropped := await store.drop_due([(name, version) for name, version in registry.advertised()
                                        if not registry.get(name, version).cleanup]):
        outcomes["nothing"] = dropped
    for run_id in await store.due(limit=limit):
        try:
            outcomes[await _clean(store, registry, run_id, clock=clock, rng=rng)] += 1
        except Exception as e:
            if store.unreachable(e):
                raise
            logger.exception("run %s: cleanup failed unexpectedly; due again after its claim lapses", run_id)
            outcomes["error"] += 1
    return outcomes


async def _clean(store: CleanupStore, registry: Registry, run_id: str, *, clock: Callable[[], float],
                 rng: Rng) -> str:
    async with store.transaction() as tx:
        stored = await tx.load(run_id)
        assert stored is not None, "a cleanup's run exists"
        run = stored.snapshot
        try:
            kind = registry.get(run.kind, run.versions.workflow)
        except LookupError:
            await tx.claim(run_id, hold=UNKNOWN_KIND_DELAY)
            logger.warning("run %s: no run kind %s@%s here to clean it up; looked at again in %.0fs",
                           run_id, run.kind, run.versions.workflow, UNKNOWN_KIND_DELAY)
            return "unknown kind"
        claimed = await tx.claim(run_id, hold=cleanup.hold(kind.tools[s.tool].start_to_close for s in kind.cleanup))
        if claimed is None:
            return "taken"
    for step in kind.cleanup:
        failure = await _run_step(store, kind, stored, step, claimed, clock=clock)
        if failure is not None:
            await _failed(store, kind, run_id, failure, claimed, clock=clock, rng=rng)
            return "failed"
        METRICS["cleanup.steps_done"] += 1
    async with store.transaction() as tx:
        await tx.done(run_id)
        if claimed.alerted:
            await tx.alert(actor=PRODUCER, action=RESOLVED_ALERT, target=run_id,
                           reason=f"the cleanup succeeded at attempt {claimed.attempt}",
                           details={"alert": CLEANUP_ALERT, "episode": EPISODE, "attempt": claimed.attempt})
    if claimed.alerted:
        logger.info("run %s: cleanup done at attempt %d; its alert is resolved", run_id, claimed.attempt)
    return "done"


async def _run_step(store: CleanupStore, kind: RunKind, stored: StoredRun, step: CleanupStep,
                    claimed: Claimed, *, clock: Callable[[], float]) -> _Failure | None:
    """One step's attempt: confirmed on the ledger and recorded on the run, or why it failed."""
    run_id = stored.snapshot.run_id
    tool = kind.tools[step.tool]
    key = cleanup.key(run_id, step.name)
    async with store.transaction() as tx:
        status = await tx.ledger_status(key)
    earlier = None if status is None else _A(status)
    if earlier is _A.CONFIRMED:
        return None
    sent = False
    try:
        args = step.args(stored.snapshot)
        if args is None:
            return None
        request = tool.validate(args)
        found = None
        if cleanup.look_first(tool.effect, earlier):
            assert tool.lookup is not None, "a kind's non-idempotent cleanup tools have lookups (RunKind)"
            found = await asyncio.wait_for(tool.lookup(key), tool.start_to_close)
        if found is None:
            async with store.transaction() as tx:
                await tx.prepare(LedgerRequest(
                    action_id=f"{run_id}:{cleanup.logical_action(step.name)}", run_id=run_id,
                    logical_action=cleanup.logical_action(step.name), tool=tool.name, tool_version=tool.version,
                    effect_kind=tool.effect.value, idempotency_key=key,
                    request_hash=request_hash(tool.name, tool.version, args=request), request=request,
                    fencing_token=stored.fencing_token))
            sent = True
            found = await asyncio.wait_for(tool.execute(request, key, stored.fencing_token), tool.start_to_close)
    except Exception as e:
        return _Failure(step, _describe(tool, e), _left_at(e) if sent else None)
    faults.crash_point("reconciler.cleanup_after_call_before_record")
    await _confirmed(store, run_id, step, key, found, claimed, at=clock())
    return None


def _left_at(error: Exception) -> ActionStatus:
    """A refusal or an unavailable far side did not act; anything else (a time-out) may have."""
    return _A.RETRYABLE if isinstance(error, ToolRejected | ToolUnavailable) else _A.UNKNOWN


def _describe(tool: Tool, error: Exception) -> str:
    if isinstance(error, TimeoutError):
        return f"{tool.name} gave no answer within {tool.start_to_close:g}s"
    return (str(error) or repr(error))[:ERROR_CHARS]


async def _confirmed(store: CleanupStore, run_id: str, step: CleanupStep, key: str, found: ToolResult,
                     claimed: Claimed, *, at: float) -> None:
    async with store.transaction() as tx:
        await tx.record(LedgerOutcome(key, _A.CONFIRMED, {"external_id": found.external_id,
                                                          "receipt": dict(found.receipt), "last_error": None}))
        run = await tx.load(run_id)
        assert run is not None
        await tx.append(run, [ev.CleanupRecorded(seq=run.seq(), at=at, step=step.name,
                                                 outcome=cleanup.DONE, attempt=claimed.attempt,
                                                 external_id=found.external_id)])


async def _failed(store: CleanupStore, kind: RunKind, run_id: str, failure: _Failure, claimed: Claimed, *,
                  clock: Callable[[], float], rng: Rng) -> None:
    step = failure.step
    delay = cleanup.retry_in(kind.cleanup_retry, claimed.attempt, rng=rng)
    async with store.transaction() as tx:
        if failure.ledger is not None:
            await tx.record(LedgerOutcome(cleanup.key(run_id, step.name), failure.ledger,
                                          {"last_error": failure.error}))
        run = await tx.load(run_id)
        assert run is not None
        await tx.append(run, [ev.CleanupRecorded(seq=run.seq(), at=clock(), step=step.name, outcome=cleanup.FAILED,
                                                 attempt=claimed.attempt, error=failure.error)])
        await tx.retry(run_id, delay=delay, error=f"{step.name}: {failure.error}")
        if not claimed.alerted:
            await tx.alert(actor=PRODUCER, action=CLEANUP_ALERT, target=run_id,
                           reason=f"cleanup step {step.name} failed: {failure.error} (retried; the run keeps "
                                  f"its {run.snapshot.status.value})",
                           details={"episode": EPISODE, "step": step.name, "attempt": claimed.attempt,
                                    "error": failure.error})
    METRICS["cleanup.failed"] += 1
    if not claimed.alerted:
        METRICS[CLEANUP_ALERT] += 1
        metrics.ALERTS.labels(CLEANUP_ALERT).inc()
    logger.warning("run %s: cleanup step %s failed (attempt %d): %s; again in %.1fs", run_id, step.name,
                   claimed.attempt, failure.error, delay)
