"""Run lifecycle: the one status enum and the declared table of legal moves.

Responsibility: say which run statuses exist, which of them are terminal or waiting,
and which moves between them are legal. Nothing else in longrun decides that.

Invariants:
- ``RUN_TRANSITIONS`` is the only source of legal moves; ``check_run_transition``
  rejects everything else and names both ends. There are no self-loops.
- Terminal statuses have no outgoing moves: a finished run never reopens. A late
  report that contradicts the outcome starts a correction elsewhere; it never flips
  the status back.
- Terminal kinds stay distinct because they decide what a user may do next and what
  counts against agent quality.
- Moves imposed from outside a worker step (cancel, pause, terminate, the business
  deadline, a charge that overruns the budget) are legal from every open status, with
  two exceptions: PAUSED cannot be paused again, and CANCELLING cannot be paused
  (cancellation is already winding the run down; TERMINATED is the hard stop).
- PAUSED returns only to a status that needs no worker (never straight to RUNNING): the
  worker that was running the run has been fenced out by the revision change and the
  run must be scheduled again.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType

from longrun.errors import IllegalTransition


class RunStatus(str, Enum):
    READY = "READY"
    RUNNING = "RUNNING"
    WAITING_EVENT = "WAITING_EVENT"
    WAITING_USER = "WAITING_USER"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    ACTION_UNKNOWN = "ACTION_UNKNOWN"
    CANCELLING = "CANCELLING"
    PAUSED = "PAUSED"
    NEEDS_ATTENTION = "NEEDS_ATTENTION"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TERMINATED = "TERMINATED"
    TIMED_OUT = "TIMED_OUT"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"


_S = RunStatus

TERMINAL: frozenset[RunStatus] = frozenset(
    {_S.COMPLETED, _S.FAILED, _S.CANCELLED, _S.TERMINATED, _S.TIMED_OUT, _S.BUDGET_EXHAUSTED}
)
OPEN: frozenset[RunStatus] = frozenset(RunStatus) - TERMINAL
WORKER_HAS_WORK: frozenset[RunStatus] = frozenset({_S.READY, _S.RUNNING, _S.CANCELLING})
"""A worker has something to do for these once the lease is free; the rest are parked or finished."""

WAKE_A_WORKER: frozenset[RunStatus] = WORKER_HAS_WORK - {_S.RUNNING}
"""A writer other than a worker that leaves a run in one of these sends it a wakeup: it has work no
worker has started (RUNNING is a worker's own status)."""

HELD_FOR_RECONCILIATION: frozenset[RunStatus] = frozenset({_S.ACTION_UNKNOWN, _S.CANCELLING, _S.PAUSED})
"""Held runs whose snapshot may list an action in doubt the ledger does not show (the reconciler
looks for them too)."""

WAITING: frozenset[RunStatus] = frozenset({_S.WAITING_EVENT, _S.WAITING_USER, _S.RETRY_SCHEDULED})
"""Statuses parked until a wake condition fires; each holds a ``Wait`` with a deadline.

WAITING_EVENT and WAITING_USER wait on a correlation key or approval (or a timer);
RETRY_SCHEDULED waits on its backoff timer. ACTION_UNKNOWN is deliberately not here:
the reconciler wakes it by scanning unknown actions, not by a timer or a correlation key.
"""

AWAITING_ANSWER: frozenset[RunStatus] = frozenset({_S.WAITING_EVENT, _S.WAITING_USER})
"""Statuses parked until something outside the run answers: an event for its correlation key, a
person (an approval or an answer), or its deadline."""

MATCHED_BY_KEY: frozenset[RunStatus] = AWAITING_ANSWER | {_S.PAUSED}
"""An event for a run's pending wait's correlation key is delivered to the run in these: a paused
run's wait still ends (the event changes what the run resumes to)."""

_IMPOSED = frozenset({_S.CANCELLING, _S.PAUSED, _S.TERMINATED, _S.TIMED_OUT, _S.BUDGET_EXHAUSTED})


def _row(*targets: RunStatus, imposed: frozenset[RunStatus] = _IMPOSED) -> frozenset[RunStatus]:
    return frozenset(targets) | imposed


RUN_TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = MappingProxyType(
    {
        _S.READY: _row(_S.RUNNING),
        _S.RUNNING: _row(
            _S.READY,  # yield: the step is done, the run wants another turn
            _S.WAITING_EVENT,
            _S.WAITING_USER,
            _S.RETRY_SCHEDULED,
            _S.ACTION_UNKNOWN,
            _S.NEEDS_ATTENTION,
            _S.COMPLETED,
            _S.FAILED,
        ),
        _S.WAITING_EVENT: _row(_S.READY),
        _S.WAITING_USER: _row(_S.READY),
        _S.RETRY_SCHEDULED: _row(_S.READY),
        # After reconciliation: back to the queue, or straight on for a worker that reconciles inline.
        _S.ACTION_UNKNOWN: _row(_S.READY, _S.RUNNING, _S.NEEDS_ATTENTION),
        # An operator resolves: continue, or give up with a reason (not TERMINATED, which means an incident).
        _S.NEEDS_ATTENTION: _row(_S.READY, _S.FAILED),
        _S.PAUSED: _row(
            _S.READY,
            _S.WAITING_EVENT,
            _S.WAITING_USER,
            _S.RETRY_SCHEDULED,
            _S.ACTION_UNKNOWN,
            _S.NEEDS_ATTENTION,
            imposed=_IMPOSED - {_S.PAUSED},
        ),
        _S.CANCELLING: _row(_S.CANCELLED, imposed=_IMPOSED - {_S.PAUSED, _S.CANCELLING}),
        **{status: frozenset() for status in TERMINAL},
    }
)


def check_run_transition(from_: RunStatus, to: RunStatus) -> None:
    """Raise ``IllegalTransition("run", from_, to)`` unless the table allows the move."""
    if to not in RUN_TRANSITIONS[from_]:
        raise IllegalTransition("run", from_.value, to.value)
