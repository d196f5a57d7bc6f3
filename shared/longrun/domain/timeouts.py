"""Run-level timeouts: the per-run limits, the queue stint they time, and the business deadline's
cancel protocol. Pure.

Responsibility:
- ``RunTimeouts``: a run's ``schedule_to_start`` (seconds it may sit queued, READY, before a worker
  starts it) and ``start_to_close`` (a cap on every tool call's start-to-close). ``resolve`` picks
  them when the run is created: the producer's values, else its run kind's defaults.
- ``effective_start_to_close``: the limit a tool call runs under; the run's cap only shortens it.
- ``queue_stint_starts``: whether a transition queues the run (READY, for a worker to start) with
  a schedule-to-start clock; storage schedules that stint's timer in the transition's statement.
- The business deadline by the cancel protocol: ``on_business_deadline`` is what the deadline does
  to a run, ``cancel_end`` how a cancelling run ends (TIMED_OUT for its deadline, else CANCELLED),
  ``cancel_refusal`` why an operator's cancel is refused.

Invariants:
- A limit is positive or absent; ``effective_start_to_close(t, run) <= t`` whenever the run has a cap.
- A run cancelling for its deadline ends TIMED_OUT, never CANCELLED; one cancelled by an operator
  ends CANCELLED (``evolve`` refuses the other end, naming both states).
"""

from __future__ import annotations

from dataclasses import dataclass

from longrun.domain.run import OPEN, RunStatus
from longrun.domain.snapshot import RunSnapshot, RunTimeouts

__all__ = ["DEADLINE_REASON", "DeadlineVerdict", "RunTimeouts", "cancel_end", "cancel_refusal",
           "effective_start_to_close", "on_business_deadline", "queue_stint_starts", "resolve"]

DEADLINE_REASON = "business_deadline: the run's deadline passed"
"""Why a run cancels for its deadline; its TIMED_OUT end says it too (``cancel_end``)."""


def resolve(requested: RunTimeouts | None, defaults: RunTimeouts) -> RunTimeouts:
    """A new run's timeouts: each one the producer gave, else its run kind's default."""
    if requested is None:
        return defaults
    return RunTimeouts(
        schedule_to_start=(requested.schedule_to_start if requested.schedule_to_start is not None
                           else defaults.schedule_to_start),
        start_to_close=requested.start_to_close if requested.start_to_close is not None else defaults.start_to_close)


def effective_start_to_close(tool_seconds: float, run: RunSnapshot) -> float:
    """The start-to-close limit of a call to a tool that declares ``tool_seconds``, in ``run``: the
    run's cap shortens it and never lengthens it."""
    if not tool_seconds > 0:
        raise ValueError(f"tool_seconds must be positive, got {tool_seconds!r}")
    cap = run.timeouts.start_to_close
    return tool_seconds if cap is None else min(tool_seconds, cap)


def queue_stint_starts(before: RunSnapshot | None, after: RunSnapshot) -> bool:
    """Whether the move from ``before`` (None: the run is being created) to ``after`` queues the run
    for a worker with a schedule-to-start clock: it becomes READY (created, woken, handed back,
    resumed) and has the setting. A stint is named by the revision it starts at."""
    # The setting first: a run without one (most) is answered by one attribute test, on every write.
    return (after.timeouts.schedule_to_start is not None and after.status is RunStatus.READY
            and (before is None or before.status is not RunStatus.READY))


@dataclass(frozen=True, slots=True)
class DeadlineVerdict:
    """What the business deadline does to a run: ``cancel`` it (the protocol, then TIMED_OUT), or
    nothing, and ``why``."""

    cancel: bool
    why: str


def on_business_deadline(run: RunSnapshot) -> DeadlineVerdict:
    """The deadline passed: an open run enters the cancel protocol for it (no new action starts, a
    submitted call's outcome is reconciled, declared compensations run, then TIMED_OUT). A finished
    run, or one already cancelling (an operator's cancel: it ends CANCELLED as asked), is left as it is."""
    if run.status not in OPEN:
        return DeadlineVerdict(False, f"the run is {run.status.value}")
    if run.status is RunStatus.CANCELLING:
        return DeadlineVerdict(False, "the run is already cancelling")
    return DeadlineVerdict(True, DEADLINE_REASON)


def cancel_end(run: RunSnapshot) -> tuple[RunStatus, str]:
    """How a cancelling run ends once every action is settled: TIMED_OUT when it cancels for its
    business deadline, else CANCELLED; and the reason recorded."""
    if run.status is not RunStatus.CANCELLING:
        raise ValueError(f"run {run.run_id} is {run.status.value}: only a CANCELLING run ends its cancel")
    if run.deadline_passed:
        return RunStatus.TIMED_OUT, f"{DEADLINE_REASON}; every action settled"
    return RunStatus.CANCELLED, "cancel requested; every action settled"


def cancel_refusal(run: RunSnapshot) -> str | None:
    """Why an operator's cancel of ``run`` is refused beyond the transition table, or None: a run
    cancelling for its deadline keeps that (it ends TIMED_OUT); cancelling it again is refused."""
    if run.status is RunStatus.CANCELLING and run.deadline_passed:
        return "the run is already cancelling for its business deadline and ends TIMED_OUT once its actions settle"
    return None
