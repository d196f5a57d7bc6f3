"""The timer service's use case: turn due timers into run events, exactly once per timer key.

``fire_due`` claims a batch of due timers with their runs (``FOR UPDATE SKIP LOCKED``, so timer
replicas share the work without blocking each other, and a run another transaction is
writing is left to a later batch rather than waited for) and, in the SAME transaction,
appends each timer's event to its run under the run's row lock, writes the run's wakeup and broadcast
outbox rows, and marks the timers fired. A crash anywhere before the commit rolls all of
it back and the timers fire again later; after the commit they are never claimed again.

What each timer kind does (the kind names the timer; the payload identifies what it is for):

- ``retry_backoff``, ``sleep``, ``wait_deadline`` (payload ``{"wait_id", "reason"}``, written
  with the wait, ``ports.runs.wait_timers``): ``RunWoken(wait_id, reason=TIMER | DEADLINE)``. The
  pending wait ends, the run becomes READY and a worker is woken; its ``decide`` reads
  ``state.last_wake.reason`` to tell a deadline from an answer. The deadline of a question
  (its payload also names the ``question_id``) closes the unanswered question as well. While PAUSED the wake only
  changes what the run resumes to, so no worker is woken.
- ``wait_reminder`` (payload ``{"wait_id", "reminder"}``) and ``wait_escalation`` (payload
  ``{"wait_id"}``), written with a person's wait (``domain.reminders``): while that wait is pending,
  ``run.wait_reminded`` or ``run.wait_escalated`` (from then on its ``escalate_to`` may decide too) and
  the ``run.notice`` that tells the people; the run does not move. Cancelled with the wait.
- ``business_deadline`` (payload ``{}``): an open run enters the cancel protocol for its deadline
  (``run.deadline_passed``: CANCELLING, ``domain.timeouts.on_business_deadline``) and ends TIMED_OUT
  once a worker has settled its actions. A worker holding it keeps its lease and carries the
  protocol out on its next write; a run nobody holds (waiting, queued, paused) is woken for it.
  A run already cancelling (an operator's cancel) is left to end CANCELLED.
- ``schedule_to_start`` (payload ``{"revision"}``: the run's revision when it was queued,
  scheduled by the write that queued it, ``db.runs``, and cancelled by the take that starts it):
  a run still READY at that exact revision, with no live lease, was never started by a worker; it
  ends TIMED_OUT.
- ``start_to_close`` and ``heartbeat`` (payload ``{"fencing_token", "logical_action", "limit"}``:
  one tool call's attempt, ``domain.calls``): scheduled with the call's submission, cancelled by
  its outcome; the heartbeat timer moves with each recorded heartbeat. One that fires while the
  run is still RUNNING under that token with the action still SUBMITTED gives the attempt up
  (``calls.abandon``): the lease is released, so the stuck or dead worker is fenced out, and the
  effect follows the effect kind: a write's action becomes UNKNOWN (ledger row too) and the run
  ACTION_UNKNOWN, for the reconciler; a pure or read call's becomes RETRYABLE and the run waits
  for its retry (a ``retry_backoff`` timer scheduled here, under the tool's retry policy from
  ``kinds``, else the default), or, retries exhausted, FAILED and the run READY for ``decide``.

Every status change this module makes carries the timer kind as the prefix of its
``reason`` (``"business_deadline: ..."``), and a call's events their ``cause`` (``"heartbeat: no
heartbeat within 2s (lease 3)"``), so history says which timeout moved the run.

Closure: whatever ends a wait (a webhook, an approval, a cancel, one of its own timers) or
finishes a run cancels, in the same statement, the timers it leaves without a purpose
(``domain.closure.timers_to_cancel``; ``timers.cancelled_at``), and a cancelled timer is never
claimed. A wake here ends its wait, so the wait's other timer is cancelled by the batch's write
(``write_wakes`` or ``run_batches.write_many``) and the firing one marked fired. A call's outcome
(an answer, or a call timer giving it up) cancels that call's timers the same way.

Stale timers never raise and are always marked fired:
- a wake for a wait that is no longer pending is what the domain calls *late*: ``runs.append``
  stores the ``RunWoken`` with ``applied = false`` and the run does not change (no wakeup, no
  broadcast). With closure this is left to a timer another timer replica had claimed when its
  wait ended (that cancellation skips it rather than wait across replicas);
- a run-level timer whose run has moved on (finished, or no longer in the queue stint or
  attempt its payload names) is skipped: no event is written, because the domain would
  refuse a status change on a finished run and the timeout no longer describes the run;
- a timer the domain refuses outright (``DomainError``, e.g. a TIMER wake for a wait with
  no timer) is skipped and logged as a warning.
A timer that fails for any other reason (e.g. a snapshot from a newer schema during a
rollout) fails its batch, which is then fired again with one savepoint per timer: that
timer is rolled back, logged and left unfired to be tried again, and the rest still fire.

What a timer does through the domain is ``app.timer.firing`` (``plan_batch``). Most timers only end
a wait (the run becomes READY, a worker is woken), and decoding, evolving and re-encoding each
run's snapshot for that cost ~1 ms of CPU per timer. So a batch's wakes go the short way
(``shortcut``): the runs' heads (status, revision, seq, pending wait id) are
read and locked without the snapshot, and the batch is written as one statement, each event
rendered by PostgreSQL, the snapshot patched in place, the messages made by ``effects`` from the
heads. One wake of every batch, the sample, goes through the domain in full (``ports.runs.plan``,
``effects``); its snapshot diff and event are the template for the others, and if PostgreSQL,
filling the template in for the sample, does not render exactly those rows, or the messages made
from its head are not the domain's (the domain changed), the batch falls back to the domain for
every timer. Everything else (run timeouts, paused runs, timers the domain
refuses, several timers of one run in a batch, questions' deadlines, the wakes of runs with a
schedule-to-start, whose next queue stint ``run_batches.write_many`` times, and of runs parked in a wait that
held no slot, which are queued for admission, told in the batch's transaction, not sent to a worker)
always takes the domain path.

Lateness (``fired_at - wake_at``, both database time) is logged per timer at DEBUG and as
the batch maximum at INFO.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun import faults, logs, metrics, otel
from longrun.app import effects
from longrun.app.timer.firing import Fired, Outcome, plan_batch
from longrun.authoring import Registry
from longrun.db import actions as ledger_rows
from longrun.db import admission, outbox, run_batches, runs, timers
from longrun.db.errors import is_transient
from longrun.db.timers import RunHead, WakeTemplate
from longrun.domain import TERMINAL, RetryPolicy, RunStatus, slots
from longrun.ports.timers import DueTimer
from longrun.services.timer import shortcut

logger = logging.getLogger(__name__)


async def fire_due(engine: AsyncEngine, *, batch: int, clock: Callable[[], float],
                   producer: str = "timer", kinds: Registry | None = None, retry: RetryPolicy = RetryPolicy()) -> int:
    """Fire up to ``batch`` due timers in one transaction; returns how many were marked fired.

    ``kinds``: the run kinds whose tools' public receipt fields a run ended here shows (none without),
    and whose tools' retry policies a timed-out pure or read call is retried under (``retry`` for a
    tool that declares none, or that this build does not know)."""
    kinds = kinds or Registry()
    try:
        return await _fire_batch(engine, batch=batch, clock=clock, producer=producer, kinds=kinds, retry=retry,
                                 isolate=False)
    except Exception as e:
        if is_transient(e):
            raise
        # Savepoints cost two statements per timer, so they are paid only once a batch broke:
        # then the batch runs again timer by timer and only the broken timer waits.
        logger.warning("timer batch failed (%r); firing it again with one savepoint per timer", e)
        return await _fire_batch(engine, batch=batch, clock=clock, producer=producer, kinds=kinds, retry=retry,
                                 isolate=True)


async def _fire_batch(engine: AsyncEngine, *, batch: int, clock: Callable[[], float], producer: str,
                      kinds: Registry, retry: RetryPolicy, isolate: bool) -> int:
    spans: dict[str, Any] = {}
    try:
        async with engine.begin() as conn:
            claimed = await timers.claim_due(conn, limit=batch)
            if claimed is None:
                return 0
            # The transaction's time: leases are judged expired, and lateness logged, by it.
            due, fired_at = claimed.timers, claimed.now
            spans = _fire_spans(due, claimed.heads, fired_at)
            traces = _traces(due, claimed.heads, spans)
            # A run's own timers stay in wake_at order (a wake before its deadline).
            ordered = sorted(due, key=lambda t: (t.run_id, t.wake_at))
            if isolate:
                outcomes = {t.timer_key: await _fire_isolated(conn, t, at=clock(), now=fired_at, producer=producer,
                                                              kinds=kinds, retry=retry, trace=traces[t.timer_key])
                            for t in ordered}
                written: set[str] = set()
            else:
                outcomes, written = await _fire_quickly(conn, ordered, claimed.heads, at=clock(), now=fired_at,
                                                        producer=producer, kinds=kinds, retry=retry, traces=traces)
            faults.crash_point("timer.after_fire_before_mark")
            marked = [key for key, outcome in outcomes.items() if outcome is not Outcome.FAILED]
            await timers.mark_fired(conn, [key for key in marked if key not in written])
        faults.crash_point("timer.after_commit")
        for key, span in spans.items():
            span.set_attribute("longrun.timer.outcome", outcomes[key].value)
    finally:
        for span in spans.values():
            span.end()
    _log_batch(due, outcomes, fired_at)
    return len(marked)


def _fire_spans(due: list[DueTimer], heads: dict[str, RunHead], fired_at: datetime) -> dict[str, Any]:
    """Per timer, its ``fire`` span, a child of its run's root; none unless spans are exported."""
    if not otel.exporting():
        return {}
    return {t.timer_key: otel.start_run_span(f"fire {t.kind}", heads[t.run_id].trace_root, attributes={
        "longrun.run_id": t.run_id, "longrun.tenant": heads[t.run_id].tenant_id, "longrun.timer.key": t.timer_key,
        "longrun.timer.kind": t.kind, "longrun.timer.lateness_s": (fired_at - t.wake_at).total_seconds()})
        for t in due}


def _traces(due: list[DueTimer], heads: dict[str, RunHead], spans: dict[str, Any]) -> dict[str, str | None]:
    """Per timer, the traceparent the messages it causes carry: its span's, else its run's root."""
    if not spans:
        return {t.timer_key: heads[t.run_id].trace_root for t in due}
    return {key: otel.traceparent_of(span) for key, span in spans.items()}


async def _fire_quickly(conn: AsyncConnection, ordered: list[DueTimer], heads: dict[str, RunHead], *, at: float,
                        now: datetime, producer: str, kinds: Registry, retry: RetryPolicy,
                        traces: dict[str, str | None]) -> tuple[dict[str, Outcome], set[str]]:
    """Wakes in bulk from the runs' heads, checked against the sample; the rest through the domain.
    Returns each timer's outcome, and the timers the bulk write already marked fired."""
    per_run = Counter(t.run_id for t in ordered)
    quick: list[tuple[DueTimer, RunHead, bool]] = []
    full: list[DueTimer] = []
    for timer in ordered:
        head = heads[timer.run_id]
        applies = shortcut.quick_verdict(timer, head) if per_run[timer.run_id] == 1 else None
        if applies is None:
            full.append(timer)
        else:
            quick.append((timer, head, applies))
    domain = {"at": at, "now": now, "producer": producer, "kinds": kinds, "retry": retry, "traces": traces}
    outcomes = (await _fire_together(conn, full, **domain)).outcomes
    sample = next((q for q in quick if q[2]), None)
    if sample is None:
        template: WakeTemplate | None = shortcut.late_only(at)
    else:
        planned = await _plan_together(conn, [sample[0]], **domain)
        template = await shortcut.learn(conn, planned, sample, traces[sample[0].timer_key], producer)
        if template is None:
            logger.warning("timer shortcut disagrees with the domain; batch of %d fired through the domain",
                           len(ordered))
            await _write_together(conn, planned)
            rest = await _fire_together(conn, [t for t, _, _ in quick if t is not sample[0]], **domain)
            return {**outcomes, **planned.outcomes, **rest.outcomes}, set()
    if not quick:
        return outcomes, set()
    # The sample is written the short way too: ``learn`` checked that this writes what the domain did.
    occurred_at = datetime.fromtimestamp(at, UTC)
    sent_at = occurred_at.isoformat()
    sent = [m for timer, head, applies in quick if applies
            for m in shortcut.messages(timer, head, producer=producer, trace=traces[timer.timer_key], at=sent_at)]
    await timers.write_wakes(conn, template, [shortcut.wake(timer, head, applies) for timer, head, applies in quick],
                             sent, status=RunStatus.READY.value, occurred_at=occurred_at)
    # Counted once per run kind, not per wake: looking a label set up costs about as much as the wake's message.
    for workflow, woken in Counter(head.workflow for _, head, applies in quick if applies).items():
        metrics.TRANSITIONS.labels(workflow, RunStatus.READY.value).inc(woken)
    return ({**outcomes, **{t.timer_key: Outcome.APPLIED if applies else Outcome.LATE for t, _, applies in quick}},
            {t.timer_key for t, _, _ in quick})


async def _fire_together(conn: AsyncConnection, ordered: list[DueTimer], *, at: float, now: datetime,
                         producer: str, kinds: Registry, retry: RetryPolicy,
                         traces: dict[str, str | None]) -> Fired:
    """Timers through the domain, in a handful of statements: one locking read, one update, one insert each."""
    fired = await _plan_together(conn, ordered, at=at, now=now, producer=producer, kinds=kinds, retry=retry,
                                 traces=traces)
    await _write_together(conn, fired)
    return fired


async def _plan_together(conn: AsyncConnection, ordered: list[DueTimer], *, at: float, now: datetime,
                         producer: str, kinds: Registry, retry: RetryPolicy,
                         traces: dict[str, str | None]) -> Fired:
    if not ordered:
        return Fired({}, [], {})
    current = await run_batches.load_many(conn, [t.run_id for t in ordered], lock=True)
    return plan_batch(ordered, current, at=at, now=now, producer=producer, kinds=kinds, retry=retry, traces=traces)


async def _write_together(conn: AsyncConnection, fired: Fired) -> None:
    await run_batches.write_many(conn, fired.plans)
    for outcome in fired.ledger:
        await ledger_rows.record(conn, outcome.key, outcome.status, **outcome.fields)
    await timers.schedule_all(conn, fired.timers)
    await outbox.enqueue_many(conn, [m for sent in fired.messages.values() for m in sent])
    # A finished run freed its slot; a run a wake left queued (its wait held none) waits for one.
    await admission.notify(conn, effects.ADMISSION_CHANNEL, [
        p.after.snapshot.tenant_id for p in fired.plans
        if p.after.snapshot.status in TERMINAL or slots.queued(p.after.snapshot.status, p.after.admitted)])


async def next_wakes(engine: AsyncEngine, *, batch: int) -> timers.NextWakes:
    """When the earliest unfired timer is due, and when a whole ``batch`` of them is (database clock)."""
    async with engine.connect() as conn:
        return await timers.next_wakes(conn, limit=batch)


async def _fire_isolated(conn: AsyncConnection, timer: DueTimer, *, at: float, now: datetime,
                         producer: str, kinds: Registry, retry: RetryPolicy, trace: str | None) -> Outcome:
    """One timer inside a savepoint, so a timer that cannot be handled does not hold up its batch."""
    try:
        with logs.bound(timer.run_id, None):
            async with conn.begin_nested():
                fired = await _fire_together(conn, [timer], at=at, now=now, producer=producer, kinds=kinds,
                                             retry=retry, traces={timer.timer_key: trace})
                return fired.outcomes[timer.timer_key]
    except Exception as e:
        if is_transient(e):
            raise
        with logs.bound(timer.run_id, None):
            logger.exception("timer %s (run %s, %s) failed; left unfired", timer.timer_key, timer.run_id, timer.kind)
        return Outcome.FAILED


def _log_batch(due: list[DueTimer], outcomes: dict[str, Outcome], fired_at: datetime) -> None:
    lateness = {t.timer_key: (fired_at - t.wake_at).total_seconds() for t in due}
    for late in lateness.values():
        metrics.TIMER_LATENESS.observe(max(0.0, late))
    if logger.isEnabledFor(logging.DEBUG):
        for t in due:
            logger.debug("timer %s (run %s, %s): %s, lateness %.3fs", t.timer_key, t.run_id, t.kind,
                         outcomes[t.timer_key].value, lateness[t.timer_key])
    counts = Counter(o.value for o in outcomes.values())
    logger.info("fired %d timer(s) %s; lateness max %.3fs", len(due),
                " ".join(f"{k}={v}" for k, v in sorted(counts.items())), max(lateness.values()))
