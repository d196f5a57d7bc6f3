"""Reminders and escalation of a wait for a person (an approval or a question). Pure.

Responsibility:
- ``timers``: the durable timers a wait's reminders and escalation need, written with the wait
  (``ports.runs.wait_timers``). Their payload names the wait, so whatever ends the wait cancels
  them with its other timers (``domain.closure``); a reminder due after the deadline is not scheduled.
- ``on_timer``: what such a timer records when it fires, ``run.wait_reminded`` or
  ``run.wait_escalated``, while its wait is still the one pending; nothing otherwise.
- ``deciders``: who may decide or answer the pending wait: its owner, and its ``escalate_to``
  once (and only once) the escalation was recorded.

Invariants: neither event ends the wait or moves the run; an escalation is recorded at most once
per wait and names the wait's own ``escalate_to``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from longrun.domain import events as ev
from longrun.domain.lifecycle import Handler, reject
from longrun.domain.run import TERMINAL
from longrun.domain.snapshot import RunSnapshot, Wait

REMINDER_TIMER = "wait_reminder"
ESCALATION_TIMER = "wait_escalation"
TIMER_KINDS = (REMINDER_TIMER, ESCALATION_TIMER)


def timers(run_id: str, wait: Wait, *, decided_at: float) -> list[dict[str, Any]]:
    """The reminder and escalation timers of ``wait``, started at ``decided_at`` (``timers.schedule``'s
    arguments): each due its declared delay after the wait started, none at or past its deadline."""
    left = None if wait.deadline is None else wait.deadline - decided_at
    due = [{"timer_key": f"{run_id}:{wait.wait_id}:reminder:{n}", "run_id": run_id, "kind": REMINDER_TIMER,
            "delay": delay, "payload": {"wait_id": wait.wait_id, "reminder": n}}
           for n, delay in enumerate(wait.reminders, 1) if left is None or delay < left]
    if wait.escalate_after is not None and (left is None or wait.escalate_after < left):
        due.append({"timer_key": f"{run_id}:{wait.wait_id}:escalation", "run_id": run_id, "kind": ESCALATION_TIMER,
                    "delay": wait.escalate_after, "payload": {"wait_id": wait.wait_id}})
    return due


def on_timer(run: RunSnapshot, kind: str, payload: Mapping[str, Any], *, seq: int, at: float) -> ev.RunEvent | None:
    """What a reminder or escalation timer records on ``run``; None when its wait is no longer pending
    (or was escalated already)."""
    wait = run.wait
    if run.status in TERMINAL or wait is None or wait.wait_id != payload.get("wait_id"):
        return None
    if kind == REMINDER_TIMER:
        reminder = payload.get("reminder")
        return ev.WaitReminded(seq=seq, at=at, wait_id=wait.wait_id, reminder=reminder) \
            if isinstance(reminder, int) else None
    if wait.escalated or wait.escalate_to is None:
        return None
    return ev.WaitEscalated(seq=seq, at=at, wait_id=wait.wait_id, to=wait.escalate_to)


def deciders(wait: Wait) -> tuple[str | None, ...]:
    """Who may decide or answer ``wait``: its owner (None: anyone who may approve), and, once escalated,
    its ``escalate_to``."""
    return (wait.owner, wait.escalate_to) if wait.escalated else (wait.owner,)


def _waited(s: RunSnapshot, e: ev.WaitReminded | ev.WaitEscalated) -> Wait:
    if s.wait is None or s.wait.wait_id != e.wait_id:
        reject(s, e, f"wait {e.wait_id} is not pending")
    return s.wait


def _reminded(s: RunSnapshot, e: ev.WaitReminded) -> RunSnapshot:
    wait = _waited(s, e)
    if not 1 <= e.reminder <= len(wait.reminders):
        reject(s, e, f"the wait declares {len(wait.reminders)} reminders, not a reminder {e.reminder}")
    return s


def _escalated(s: RunSnapshot, e: ev.WaitEscalated) -> RunSnapshot:
    wait = _waited(s, e)
    if wait.escalated:
        reject(s, e, f"wait {wait.wait_id} was escalated already")
    if wait.escalate_to != e.to:
        reject(s, e, f"the wait escalates to {wait.escalate_to!r}, not {e.to!r}")
    return s.replace(wait=replace(wait, escalated=True))


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {
    ev.WaitReminded: _reminded,
    ev.WaitEscalated: _escalated,
}
