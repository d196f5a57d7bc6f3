"""Notices of a wait for a person: an approval or a question asked, a reminder come due, an escalation,
each broadcast as a ``run.notice`` on the events exchange (``<tenant>.run.notice.<wait kind>.<notice>``)
so any notifier can deliver it. Not to be confused with ``Rides.notices`` (PostgreSQL NOTIFYs).

Pure: the writers that record such events (the worker's step, the timer service) send what
``wait_notices`` makes with the transition, through the outbox, on the run's partition, so a run's
notices follow its status events in order.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from longrun.bus import topology
from longrun.domain import QUESTION_WAIT, Wait, thaw
from longrun.domain import events as ev
from longrun.envelope import DataClass, make
from longrun.envelope.registry import traceparent
from longrun.ports.runs import Message, Planned

NOTICE = "run.notice"
_ANNOUNCED = (ev.WaitStarted, ev.WaitReminded, ev.WaitEscalated)


def wait_notices(planned: Planned, *, producer: str, cause: str) -> list[Message]:
    """The notices the events ``planned`` applies announce: a wait for a person started (``requested``),
    one of its reminders came due (``reminder``), it was escalated (``escalated``)."""
    if not any(applied and isinstance(e, _ANNOUNCED) for e, applied in planned.rows):
        return []
    wait = planned.before.snapshot.wait
    texts = {q.question_id: q.text for q in planned.before.snapshot.open_questions}
    sent: list[Message] = []
    for event, applied in planned.rows:
        if not applied:
            continue
        if isinstance(event, ev.QuestionOpened):
            texts[event.question_id] = event.text
        elif isinstance(event, ev.WaitStarted):
            wait = event.wait
            if wait.approval_id is not None or wait.question_id is not None:
                sent.append(_notice(planned, "requested", event.seq, wait, texts, producer=producer, cause=cause))
        elif isinstance(event, ev.WaitReminded) and wait is not None:
            sent.append(_notice(planned, "reminder", event.seq, wait, texts, producer=producer, cause=cause,
                                reminder=event.reminder))
        elif isinstance(event, ev.WaitEscalated) and wait is not None:
            wait = replace(wait, escalated=True)
            sent.append(_notice(planned, "escalated", event.seq, wait, texts, producer=producer, cause=cause))
    return sent


def _notice(planned: Planned, notice: str, seq: int, wait: Wait, texts: dict[str, str], *, producer: str,
            cause: str, reminder: int | None = None) -> Message:
    run = planned.after.snapshot
    wait_kind = "question" if wait.kind == QUESTION_WAIT else "approval"
    subject = texts.get(wait.question_id, "") if wait.question_id is not None else wait.subject or ""
    payload = {
        "seq": seq, "notice": notice, "wait_kind": wait_kind, "wait_id": wait.wait_id,
        "approval_id": wait.approval_id, "approved_hash": wait.approved_hash, "question_id": wait.question_id,
        "subject": subject, "owner": wait.owner, "escalated_to": wait.escalate_to if wait.escalated else None,
        "reminder": reminder,
        "deadline": None if wait.deadline is None else datetime.fromtimestamp(wait.deadline, UTC).isoformat(),
        "labels": thaw(run.labels),
    }
    envelope = make(NOTICE, payload, producer=producer, tenant_id=run.tenant_id, run_id=run.run_id,
                    correlation_id=run.correlation_id, causation_id=cause, data_class=DataClass.PUBLIC,
                    trace=traceparent())
    key = topology.event_key(run.tenant_id, f"notice.{wait_kind}.{notice}")
    return Message(envelope, topology.EVENTS_EXCHANGE, key, planned.after.partition)
