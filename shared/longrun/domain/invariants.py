"""Snapshot invariants: what must hold of every run at rest, whatever happened before.

Responsibility: list every broken rule of a snapshot in words an operator can act on.
``evolve`` refuses any event whose result has a violation; tests and the fault suite call
``violations`` on whatever storage holds.

Invariants checked (each message names the rule):
- counters: revision >= 1 and last_seq >= revision (each applied event takes a seq);
- a terminal run has a terminal reason and an open one has none;
- COMPLETED only with a recorded acceptance whose unmet list is empty, and no action in
  doubt; CANCELLED, or TIMED_OUT at the end of a business deadline's cancel, only with no action
  in doubt (running actions finish first); a run cancelling for its deadline has ``cancel_requested``;
- a wait is pending exactly when the run waits (or is paused while waiting), and:
  WAITING_EVENT has a wake condition (correlation key or timer) and a deadline;
  WAITING_USER names approval id, owner, approved hash and deadline, or, waiting for an
  answer, the open question it waits on and a deadline;
  RETRY_SCHEDULED has a timer and a deadline; a timer never fires after the deadline;
- PAUSED exactly when ``paused_from`` is set, and it names a pausable status;
- cancel requested means CANCELLING or terminal; CANCELLING/CANCELLED mean it was requested;
- ACTION_UNKNOWN only while an action awaits reconciliation (someone must wake the run);
- outside a worker's step (RUNNING), the only open question is the one the run waits for;
- budget limits and usage are non-negative, and usage is within the limits unless
  BUDGET_EXHAUSTED;
- logical actions, idempotency keys, fact keys, question ids and patches taken are unique.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from longrun.domain.action import IN_DOUBT, UNRECONCILED
from longrun.domain.budget import DIMENSIONS, over_limit
from longrun.domain.run import TERMINAL, WAITING, RunStatus
from longrun.domain.snapshot import QUESTION_WAIT, RunSnapshot, Wait

_S = RunStatus


def violations(snapshot: RunSnapshot) -> tuple[str, ...]:
    """Every broken invariant of ``snapshot``; empty when the run is consistent."""
    return tuple(_check(snapshot))


def _check(s: RunSnapshot) -> Iterator[str]:
    if s.revision < 1 or s.last_seq < s.revision:
        yield f"counters: revision {s.revision} and last_seq {s.last_seq} need 1 <= revision <= last_seq"
    if (s.status in TERMINAL) != bool(s.terminal_reason):
        yield f"{s.status.value}: a terminal reason is required exactly for terminal runs"
    yield from _outcome(s)
    yield from _wait(s)
    yield from _control(s)
    yield from _budget(s)
    for what, keys in (
        ("logical action", (a.logical_action for a in s.actions)),
        ("idempotency key", (a.idempotency_key for a in s.actions)),
        ("fact key", (f.key for f in s.facts)),
        ("question id", (q.question_id for q in s.open_questions)),
        ("patch", s.patches),
    ):
        yield from (f"duplicate {what} {key!r}" for key in _duplicates(keys))


def _outcome(s: RunSnapshot) -> Iterator[str]:
    if s.status is _S.COMPLETED:
        if s.acceptance is None:
            yield "COMPLETED without a recorded acceptance check"
        elif s.acceptance.unmet:
            yield f"COMPLETED with unmet acceptance conditions: {', '.join(s.acceptance.unmet)}"
    elif s.acceptance is not None:
        yield f"{s.status.value}: an acceptance is recorded only for COMPLETED runs"
    if s.status in (_S.COMPLETED, _S.CANCELLED) or (s.status is _S.TIMED_OUT and s.deadline_passed):
        doubtful = [a.logical_action for a in s.actions if a.status in IN_DOUBT]
        if doubtful:
            yield f"{s.status.value} while actions are in doubt: {', '.join(doubtful)}"


def _wait(s: RunSnapshot) -> Iterator[str]:
    parked = s.paused_from if s.status is _S.PAUSED else s.status
    if s.open_questions and s.status is not _S.RUNNING:
        waited = s.wait.question_id if s.wait is not None else None
        stray = [q.question_id for q in s.open_questions if q.question_id != waited]
        if stray:
            yield f"{s.status.value}: question {', '.join(stray)} is open but the run does not wait for its answer"
    if parked not in WAITING:
        if s.wait is not None:
            yield f"{s.status.value}: a wait is pending but the run is not waiting"
        return
    if s.wait is None:
        yield f"{parked.value} without a pending wait"
        return
    yield from (f"{parked.value}: {problem}" for problem in _wait_problems(parked, s.wait))
    question = s.wait.question_id
    if question is not None and not any(q.question_id == question for q in s.open_questions):
        yield f"{parked.value}: the wait is for an answer to question {question!r}, which is not open"


def _wait_problems(status: RunStatus, wait: Wait) -> Iterator[str]:
    if wait.deadline is None:
        yield "no deadline"
    elif wait.wake_at is not None and wait.wake_at > wait.deadline:
        yield f"timer at {wait.wake_at} fires after the deadline {wait.deadline}"
    if status is _S.WAITING_EVENT and wait.correlation_key is None and wait.wake_at is None:
        yield "no wake condition (correlation key or timer)"
    if (wait.kind == QUESTION_WAIT) != (wait.question_id is not None):
        yield "a question wait names its question, and only a question wait does"
    elif wait.question_id is not None and status is not _S.WAITING_USER:
        yield "an answer is waited for in WAITING_USER only"
    if status is _S.WAITING_USER and wait.question_id is None:
        missing = [n for n in ("approval_id", "owner", "approved_hash") if getattr(wait, n) is None]
        if missing:
            yield f"approval wait does not name {', '.join(missing)}"
    if status is _S.RETRY_SCHEDULED and wait.wake_at is None:
        yield "no retry timer"


def _control(s: RunSnapshot) -> Iterator[str]:
    if (s.status is _S.PAUSED) != (s.paused_from is not None):
        yield f"{s.status.value}: paused_from must be set exactly while PAUSED"
    if s.paused_from is not None and s.paused_from in TERMINAL | {_S.PAUSED, _S.CANCELLING}:
        yield f"PAUSED from {s.paused_from.value}, which cannot be paused"
    if s.cancel_requested and s.status not in TERMINAL | {_S.CANCELLING}:
        yield f"{s.status.value}: cancel was requested, the run must be CANCELLING or finished"
    if s.status in (_S.CANCELLING, _S.CANCELLED) and not s.cancel_requested:
        yield f"{s.status.value} without a recorded cancel request"
    if s.deadline_passed and not s.cancel_requested:
        yield f"{s.status.value}: cancelling for the business deadline without a recorded cancel request"
    if s.deadline_passed and s.status is _S.CANCELLED:
        yield "CANCELLED: a run cancelling for its business deadline ends TIMED_OUT"
    parked = s.paused_from if s.status is _S.PAUSED else s.status
    if parked is _S.ACTION_UNKNOWN and not any(a.status in UNRECONCILED for a in s.actions):
        yield "ACTION_UNKNOWN with no action awaiting reconciliation: nothing would wake the run"


def _budget(s: RunSnapshot) -> Iterator[str]:
    for dim in DIMENSIONS:
        if getattr(s.budget.limit, dim) < 0 or getattr(s.budget.used, dim) < 0:
            yield f"budget {dim}: limits and usage must be non-negative"
    if s.status is not _S.BUDGET_EXHAUSTED:
        for dim in over_limit(s.budget):
            used, limit = getattr(s.budget.used, dim), getattr(s.budget.limit, dim)
            yield f"budget {dim} used {used} of {limit} but the run is {s.status.value}"


def _duplicates(keys: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dupes: list[str] = []
    for key in keys:
        if key in seen and key not in dupes:
            dupes.append(key)
        seen.add(key)
    return dupes
