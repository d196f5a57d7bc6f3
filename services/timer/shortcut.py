"""The timer service's short way for wakes: most timers only end a wait, so a batch's wakes are
written in one statement from the runs' heads (``db.timers.write_wakes``), each run's event and
snapshot patch rendered by PostgreSQL from a template, its messages made by ``app.effects`` as the
domain path makes them. ``quick_verdict`` says from a run's head whether a wake applies, is late
or needs the domain; ``learn`` takes the template from the batch's sample, planned through the
domain, and keeps it only if PostgreSQL, filling it in for the sample, renders exactly those rows,
and the messages made from the sample's head are the domain's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.app import effects
from longrun.app.timer.firing import WAIT_TIMERS, Fired, Outcome, cause_of
from longrun.bus import wakeup
from longrun.db import outbox, runs, timers
from longrun.db.timers import RunHead, Wake, WakeTemplate
from longrun.domain import RunStatus, WakeReason, timer_wake
from longrun.domain import events as ev
from longrun.ports.timers import DueTimer

# What a wake may change in a snapshot and in the runs row; anything more and the shortcut is off.
_WAKE_KEYS = frozenset({"status", "status_since", "wait", "paused_from", "last_wake", "revision", "last_seq",
                        "terminal_reason"})
_WAKE_REASONS = frozenset({WakeReason.TIMER.value, WakeReason.DEADLINE.value})
_WAKE_COLUMNS = frozenset({"status", "revision", "wait_kind", "wait_correlation_key", "wait_deadline",
                           "approval_id", "approval_owner", "approved_hash", "snapshot"})


def quick_verdict(timer: DueTimer, head: RunHead) -> bool | None:
    """The domain's wake rule (``domain.timer_wake``) from the run's head: True, the wake applies; False,
    it is late; None: only the domain can tell, or the template does not write what it does."""
    if timer.kind not in WAIT_TIMERS or head.queue_timed or not head.admitted:
        # Queued when woken (a schedule-to-start's timer, or a wait that held no slot): the domain path's.
        return None
    wait_id, reason = timer.payload.get("wait_id"), timer.payload.get("reason")
    if not isinstance(wait_id, str) or reason not in _WAKE_REASONS:
        return None
    verdict = timer_wake(RunStatus(head.status), head.wait_id, head.wait_has_timer, wait_id, WakeReason(reason))
    if verdict and "question_id" in timer.payload:
        return None  # a question's deadline also closes the question, which the template does not write
    return verdict


def wake(timer: DueTimer, head: RunHead, applies: bool) -> Wake:
    return Wake(head, timer.payload["wait_id"], timer.payload["reason"], applies, timer.timer_key)


def messages(timer: DueTimer, head: RunHead, *, producer: str, trace: str | None,
             at: str | None = None) -> list[dict[str, Any]]:
    """What a wake that applies sends, from its run's head, as outbox rows (``outbox.row``): the wakeup
    and the status broadcast the domain path sends for it (``app.timer.firing``), carrying ``trace``,
    made by the same functions and left unparsed (the batch's sample checks them against the domain's);
    ``at``: their time (ISO 8601), now unless given."""
    cause = cause_of(timer)
    ready = RunStatus.READY.value
    kept = wakeup.wake(tenant_id=head.tenant_id, run_id=head.run_id, revision=head.revision + 1,
                       reason=f"timer:{timer.kind}", cause=cause, producer=producer, trace=trace, occurred_at=at)
    status = effects.status_envelope(tenant_id=head.tenant_id, run_id=head.run_id, seq=head.stored_seq + 1,
                                     status=ready, was=head.status, stage=head.stage, reason="", labels=head.labels,
                                     outcome=None, correlation_id=head.correlation_id, producer=producer,
                                     cause=cause, trace=trace, occurred_at=at)
    return [outbox.row(kept, wakeup.TYPE, *effects.wakeup_route(head.partition), head.partition),
            outbox.row(status, effects.RUN_EVENT, *effects.status_route(head.tenant_id, ready), head.partition)]


def late_only(at: float) -> WakeTemplate:
    """For a batch whose wakes are all late: only the event, whose wait and seq each wake fills in."""
    return WakeTemplate(ev.event_to_dict(ev.RunWoken(seq=1, at=at, wait_id="", reason=WakeReason.TIMER)), None)


async def learn(conn: AsyncConnection, fired: Fired, sample: tuple[DueTimer, RunHead, bool],
                trace: str | None, producer: str) -> WakeTemplate | None:
    """The sample's rows (planned, not written) as the template, or None unless PostgreSQL, filling the
    template in for the sample, renders exactly what the domain planned for it, and ``messages``
    makes the messages the domain sends for it."""
    timer, head, _ = sample
    planned = next((p for p in fired.plans if p.before.snapshot.run_id == head.run_id), None)
    if planned is None or fired.outcomes[timer.timer_key] is not Outcome.APPLIED:
        return None
    before, after = planned.before.snapshot.to_dict(), planned.after.snapshot.to_dict()
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    was, now = runs.projection(planned.before.snapshot), runs.projection(planned.after.snapshot)
    columns = {k for k in now if was[k] != now[k]}
    cleared = _WAKE_COLUMNS - {"status", "revision", "snapshot"}
    if (set(before) != set(after) or not {"revision", "last_seq", "last_wake"} <= set(changed) <= _WAKE_KEYS
            or after["status"] != RunStatus.READY.value or not columns <= _WAKE_COLUMNS
            or any(now[k] is not None for k in cleared) or len(planned.rows) != 1):
        return None
    made = [_without_fresh(m) for m in messages(timer, head, producer=producer, trace=trace)]
    if [_without_fresh(outbox.row_json(m)) for m in fired.messages[head.run_id]] != made:
        return None
    template = WakeTemplate(ev.event_to_dict(planned.rows[0][0]), changed)
    own = await timers.render_wake(conn, template, wake(timer, head, True))
    if own.patch != changed or own.event != template.event or own.event.get("seq") != planned.after.stored_seq:
        return None
    return template


def _without_fresh(row: dict[str, Any]) -> dict[str, Any]:
    """An outbox row (``outbox.row``) minus what is fresh on every message: its id and time."""
    return {**row, "payload": {k: v for k, v in row["payload"].items() if k not in ("event_id", "occurred_at")}}
