"""Applying events to snapshots: ``evolve`` is the only way a run's state changes.

Responsibility: the entry point that orders the checks every event passes (creation,
lateness, finished runs, seq order, invariants) and dispatches to the per-event handlers
in ``lifecycle`` (run-level events) and ``ledger`` (action events). ``fold`` replays a
whole history.

Invariants:
- Every applied event increments ``revision`` and sets ``last_seq`` to its seq; seqs of
  applied events strictly increase.
- Status moves go through ``check_run_transition``; action moves through
  ``check_action_transition``. A snapshot with an invariant violation is never returned:
  the event is refused (``EventRejected``, ``IllegalTransition``, ``BudgetExhausted`` or
  ``IdempotencyKeyReused``) and nothing changes.
- A terminal run never reopens. An event for a terminal run is either *late* (recorded,
  not applied), a record of the ending itself (``RECORDED_AFTER_END``: applied, changing
  nothing but ``revision`` and ``last_seq``), or refused with ``IllegalTransition``.
- Failed steps in a row (``RunSnapshot.failure``) are counted by ``run.step_failed`` and forgotten
  with the first other event written while the run is RUNNING: only a step whose ``decide`` and
  ``accept`` did not raise writes one, so the step's own transition resets the count (as does a
  person sending a run that needs attention back to READY).
- The late-event rule (``is_late``): an event is late when the run has moved past what
  it reports. That is (1) a report from the outside world (wake, approval, fact, signal, child's end, charge,
  action outcome) arriving after the run ended, or (2) a wake, approval or answer for a
  wait that is no longer pending (a deadline timer racing the webhook, a duplicate wake).
  Storage keeps late events in ``run_events`` with their seq; ``evolve`` returns the
  snapshot unchanged (same revision and last_seq), so ``fold`` over the stored history
  still reproduces the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from longrun.domain import events as ev
from longrun.domain import approval_validity, children, joins, ledger, lifecycle, reminders, signals
from longrun.domain.invariants import violations
from longrun.domain.run import TERMINAL, WAITING, RunStatus
from longrun.domain.snapshot import RunSnapshot, WakeReason
from longrun.errors import EventRejected, IllegalTransition

LATE_TOLERANT: frozenset[str] = frozenset(
    cls.type
    for cls in (
        ev.RunWoken, ev.ApprovalDecided, ev.QuestionResolved, ev.FactRecorded, ev.SignalReceived, ev.ChildEnded,
        ev.BudgetCharged,
        ev.ActionConfirmed, ev.ActionFailed, ev.ActionUnavailable, ev.ActionUnknown, ev.ReconciliationStarted,
        ev.ActionReconciled,
        ev.ActionResolved, ev.ActionCompensated,
    )  # fmt: skip
)
"""Outside-world reports that may still arrive after a run ended (the action ledger keeps
tracking effects of finished runs). Commands (cancel, pause, start an action, complete...)
are never late: on a finished run they are refused."""

RECORDED_AFTER_END: frozenset[str] = frozenset({ev.RunSummarized.type, ev.CorrectionNeeded.type,
                                                ev.CleanupRecorded.type})
"""What is recorded about a finished run (its summary, a correction it needs, its cleanup): only on a terminal
run, applied without reopening it."""


def is_late(state: RunSnapshot | None, event: ev.RunEvent) -> bool:
    """True when ``event`` should be stored but not applied (see the module docstring)."""
    if state is None:
        return False
    if state.status in TERMINAL:
        return event.type in LATE_TOLERANT
    if isinstance(event, ev.RunWoken):
        return wake_is_late(state.status, None if state.wait is None else state.wait.wait_id, event.wait_id)
    if isinstance(event, ev.ApprovalDecided):
        return state.wait is None or state.wait.approval_id != event.approval_id
    if isinstance(event, ev.QuestionResolved):
        return state.wait is None or state.wait.question_id != event.question_id
    return False


def wake_is_late(status: RunStatus, pending_wait_id: str | None, wait_id: str) -> bool:
    """The wake rule's lateness: a wake of wait ``wait_id`` is late when its run has ended or that wait
    is no longer the one pending (``pending_wait_id``)."""
    return status in TERMINAL or pending_wait_id != wait_id


def timer_wake(status: RunStatus, pending_wait_id: str | None, wait_has_timer: bool, wait_id: str,
               reason: WakeReason) -> bool | None:
    """The wake rule for a timer's wake (``RunWoken``, reason TIMER or DEADLINE) from a run's columns, for
    a writer that does not decode its snapshot: True, it ends the wait and readies the run; False, it is
    late (``wake_is_late``); None, only ``evolve`` can tell (a paused run's wake changes what the run
    resumes to; a TIMER wake of a wait without a timer is refused, as ``lifecycle`` refuses it)."""
    if wake_is_late(status, pending_wait_id, wait_id):
        return False
    if status not in WAITING or (reason is WakeReason.TIMER and not wait_has_timer):
        return None
    return True


def evolve(state: RunSnapshot | None, event: ev.RunEvent) -> RunSnapshot:
    """The snapshot after ``event``; ``state`` is None only for ``run.created``."""
    if isinstance(event, ev.RunCreated):
        if state is not None:
            raise EventRejected(state.run_id, event.type, ("the run already exists",))
        return _verified(event.run_id, event, lifecycle.created(event))
    if state is None:
        raise EventRejected("<none>", event.type, ("a run's first event must be run.created",))
    if is_late(state, event):
        return state
    if event.type in RECORDED_AFTER_END:
        if state.status not in TERMINAL:
            lifecycle.reject(state, event, f"recorded on a finished run only; the run is {state.status.value}")
        if event.seq <= state.last_seq:
            lifecycle.reject(state, event, f"seq {event.seq} is not after the last applied seq {state.last_seq}")
        return state.replace(revision=state.revision + 1, last_seq=event.seq)
    if state.status in TERMINAL:
        raise IllegalTransition("run", state.status.value, _target(event))
    if event.seq <= state.last_seq:
        lifecycle.reject(state, event, f"seq {event.seq} is not after the last applied seq {state.last_seq}")
    changed = _HANDLERS[type(event)](state, event)
    if state.failure is not None and state.status is RunStatus.RUNNING and not isinstance(event, ev.StepFailed):
        # What a step writes while the run is RUNNING follows a decision that did not raise.
        changed = changed.replace(failure=None)
    return _verified(state.run_id, event, changed.replace(revision=state.revision + 1, last_seq=event.seq))


def fold(events: Iterable[ev.RunEvent]) -> RunSnapshot:
    """Replay a run's stored history (late events included) into its snapshot."""
    state: RunSnapshot | None = None
    for event in events:
        state = evolve(state, event)
    if state is None:
        raise ValueError("cannot fold an empty history")
    return state


def _verified(run_id: str, event: ev.RunEvent, snapshot: RunSnapshot) -> RunSnapshot:
    problems = violations(snapshot)
    if problems:
        raise EventRejected(run_id, event.type, problems)
    return snapshot


def _target(event: ev.RunEvent) -> str:
    if isinstance(event, ev.RunStatusChanged):
        return event.to.value
    if isinstance(event, ev.WaitStarted):
        return event.status.value
    if isinstance(event, ev.DeadlinePassed):
        return RunStatus.CANCELLING.value
    own = next((status for status, type_ in lifecycle.OWN_EVENT.items() if type_ == event.type), None)
    return own.value if own is not None else event.type


_HANDLERS: Mapping[type[ev.RunEvent], lifecycle.Handler] = {**lifecycle.HANDLERS, **ledger.HANDLERS,
                                                             **reminders.HANDLERS, **approval_validity.HANDLERS,
                                                             **signals.HANDLERS, **children.HANDLERS, **joins.HANDLERS}
