"""The timer service's short way for wakes: most timers only end a wait, so a batch's wakes are
written in one statement from the runs' heads (``db.timers.write_wakes``), every row rendered by
PostgreSQL from a template. ``quick_verdict`` says from a run's head whether a wake applies, is late
or needs the domain; ``learn`` takes the template from the batch's sample, planned through the
domain, and keeps it only if PostgreSQL, filling it in for the sample, renders exactly those rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.app.timer.firing import WAIT_TIMERS, Fired, Outcome, cause_of
from longrun.bus import topology
from longrun.db import outbox, runs, timers
from longrun.db.timers import RunHead, Wake, WakeTemplate
from longrun.domain import TERMINAL, WAITING, RunStatus, WakeReason
from longrun.domain import events as ev
from longrun.ports.timers import DueTimer

# What a wake may change in a snapshot and in the runs row; anything more and the shortcut is off.
_WAKE_KEYS = frozenset({"status", "status_since", "wait", "paused_from", "last_wake", "revision", "last_seq",
                        "terminal_reason"})
# The same sets as plain strings, as the runs' heads hold them (10,000 verdicts at once).
_TERMINAL = frozenset(s.value for s in TERMINAL)
_WAITING = frozenset(s.value for s in WAITING)
_WAKE_REASONS = frozenset({WakeReason.TIMER.value, WakeReason.DEADLINE.value})
_WAKE_COLUMNS = frozenset({"status", "revision", "wait_kind", "wait_correlation_key", "wait_deadline",
                           "approval_id", "approval_owner", "approved_hash", "snapshot"})


def quick_verdict(timer: DueTimer, head: RunHead) -> bool | None:
    """True: the wake applies; False: it is late (``evolve.is_late``); None: only the domain can tell."""
    if timer.kind not in WAIT_TIMERS or head.queue_timed:
        return None  # a run with a schedule-to-start is queued with its timer by the domain path
    wait_id, reason = timer.payload.get("wait_id"), timer.payload.get("reason")
    if not isinstance(wait_id, str) or reason not in _WAKE_REASONS:
        return None
    if head.status in _TERMINAL or head.wait_id != wait_id:
        return False
    if head.status not in _WAITING or (reason == WakeReason.TIMER.value and not head.wait_has_timer):
        return None  # paused (the wake changes what it resumes to), or a wake the domain refuses
    if "question_id" in timer.payload:
        return None  # a question's deadline also closes the question, which the template does not write
    return True


def wake(timer: DueTimer, head: RunHead, applies: bool, trace: str | None) -> Wake:
    return Wake(head, timer.payload["wait_id"], timer.payload["reason"], applies, wake_reason=f"timer:{timer.kind}",
                routing_key=topology.partition_key(head.partition), cause=cause_of(timer),
                broadcast_key=topology.status_key(head.tenant_id, RunStatus.READY.value), timer_key=timer.timer_key,
                trace=trace)


def late_only(at: float) -> WakeTemplate:
    """For a batch whose wakes are all late: only the event, whose wait and seq each wake fills in."""
    return WakeTemplate(ev.event_to_dict(ev.RunWoken(seq=1, at=at, wait_id="", reason=WakeReason.TIMER)),
                        None, None, None)


async def learn(conn: AsyncConnection, fired: Fired, sample: tuple[DueTimer, RunHead, bool],
                 trace: str | None) -> WakeTemplate | None:
    """The sample's rows (planned, not written) as the template, or None unless PostgreSQL, filling the
    template in for the sample, renders exactly what the domain planned for it."""
    timer, head, _ = sample
    planned = next((p for p in fired.plans if p.before.snapshot.run_id == head.run_id), None)
    if planned is None or fired.outcomes[timer.timer_key] is not Outcome.APPLIED:
        return None
    before, after = planned.before.snapshot.to_dict(), planned.after.snapshot.to_dict()
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    was, now = runs.projection(planned.before.snapshot), runs.projection(planned.after.snapshot)
    columns = {k for k in now if was[k] != now[k]}
    cleared = _WAKE_COLUMNS - {"status", "revision", "snapshot"}
    sent = {m.envelope.type: m for m in fired.messages[head.run_id]}
    if (set(before) != set(after) or not {"revision", "last_seq", "last_wake"} <= set(changed) <= _WAKE_KEYS
            or after["status"] != RunStatus.READY.value or not columns <= _WAKE_COLUMNS
            or any(now[k] is not None for k in cleared) or set(sent) != {"run.wakeup", "run.event"}
            or len(fired.messages[head.run_id]) != 2 or len(planned.rows) != 1):
        return None
    wakeup, broadcast = (outbox.row_of(sent[t]) for t in ("run.wakeup", "run.event"))
    template = WakeTemplate(ev.event_to_dict(planned.rows[0][0]), changed, wakeup, broadcast)
    own = await timers.render_wake(conn, template, wake(timer, head, True, trace))
    if (own.patch != changed or own.event != template.event or own.event.get("seq") != planned.after.stored_seq
            or [_without_ids(m) for m in own.messages] != [_without_ids(wakeup), _without_ids(broadcast)]
            or any(m["event_id"] != m["payload"].get("event_id") for m in own.messages)):
        return None
    return template


def _without_ids(row: dict[str, Any]) -> dict[str, Any]:
    """An outbox row minus what is fresh on every message (its id, and a wakeup's id)."""
    envelope = {k: v for k, v in row["payload"].items() if k != "event_id"}
    if isinstance(envelope.get("payload"), dict):
        envelope["payload"] = {k: v for k, v in envelope["payload"].items() if k != "wakeup_id"}
    return {**{k: v for k, v in row.items() if k != "event_id"}, "payload": envelope}
