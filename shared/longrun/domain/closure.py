"""Closure: what ending a wait or a run leaves behind, decided from states and reports. Pure.

Responsibility (seed 004 section 8):
- ``timers_to_cancel``: a transition that ends a wait cancels that wait's timers, one that
  settles a submitted action (its call answered, or its outcome was given up on) cancels that
  call's timers (``domain.calls``), one that finishes the run cancels all of the run's timers;
  storage does it in the transition's own statement, so no timer of an ended wait or call is
  left to fire.
- ``summarize``: the ``run.summary`` recorded with the transition that finishes a run: what
  it did (the actions that took effect, with their external ids), what it used (calls and
  cost), how long it took and how it ended.
- ``contradiction``: whether an outcome reported after a run COMPLETED contradicts what the
  run counted as done; such a report opens a correction (``run.correction_needed``) and the
  run stays as it ended.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from longrun.domain import events as ev
from longrun.domain.action import ActionStatus
from longrun.domain.codec import FrozenMap
from longrun.domain.run import TERMINAL, RunStatus
from longrun.domain.snapshot import RunSnapshot

DONE = frozenset({ActionStatus.CONFIRMED, ActionStatus.COMPENSATING, ActionStatus.COMPENSATED})
"""Actions whose effect happened: a summary and an outcome list them."""


class Cancel(NamedTuple):
    """Which of a run's open timers a transition cancels."""

    wait_id: str | None
    """The timers of this wait; None: no wait's, or, with no ``calls`` either, every timer of the
    run (it finished)."""
    calls: tuple[str, ...] = ()
    """The call timers (``start_to_close``, ``heartbeat``) of these logical actions."""

    @property
    def everything(self) -> bool:
        return self.wait_id is None and not self.calls


def timers_to_cancel(before: RunSnapshot, after: RunSnapshot) -> Cancel | None:
    """The timers the move from ``before`` to ``after`` leaves without a purpose, or None."""
    if after.status in TERMINAL:
        return Cancel(None) if before.status not in TERMINAL else None
    ended = before.wait is not None and (after.wait is None or after.wait.wait_id != before.wait.wait_id)
    calls = _calls_ended(before, after)
    if not ended and not calls:
        return None
    return Cancel(before.wait.wait_id if ended and before.wait is not None else None, calls)


def _calls_ended(before: RunSnapshot, after: RunSnapshot) -> tuple[str, ...]:
    """The actions submitted before and no longer after: their calls ended. An action keeps its place
    in ``actions`` (a change replaces it there, a new one is appended: ``domain.ledger``), and one not
    changed is the same object, so a step's long history costs an identity check per action."""
    if before.actions is after.actions:
        return ()
    return tuple(was.logical_action for was, now in zip(before.actions, after.actions)
                 if was is not now and was.status is ActionStatus.SUBMITTED
                 and now.status is not ActionStatus.SUBMITTED)


def finishes(before: RunSnapshot, after: RunSnapshot) -> bool:
    return before.status not in TERMINAL and after.status in TERMINAL


def summarize(run: RunSnapshot) -> FrozenMap:
    """The summary of finished ``run``; it ended at ``status_since``."""
    if run.status not in TERMINAL:
        raise ValueError(f"run {run.run_id} is {run.status.value}: only a finished run has a summary")
    used = run.budget.used
    return FrozenMap({
        "status": run.status.value,
        "terminal_reason": run.terminal_reason,
        "done": [{"logical_action": a.logical_action, "tool": a.tool, "status": a.status.value,
                  "external_id": a.external_id} for a in run.actions if a.status in DONE],
        "used": {"model_calls": used.model_calls, "tool_calls": used.tool_calls, "cost": used.cost},
        "duration_seconds": max(0.0, run.status_since - run.created_at),
    })


_UNDECIDED = frozenset({ActionStatus.UNKNOWN, ActionStatus.RECONCILING})
"""Reports that say nothing yet of what became of an effect."""


class Report(NamedTuple):
    """What the far side turned out to hold for one of a run's actions."""

    logical_action: str
    outcome: ActionStatus | None
    """None: nothing exists under the action's idempotency key."""
    external_id: str | None = None


def reports(events: Iterable[ev.RunEvent]) -> list[Report]:
    """The outcomes ``events`` report for actions (the ones that say what became of an effect)."""
    found = []
    for event in events:
        if isinstance(event, ev.ActionConfirmed):
            found.append(Report(event.logical_action, ActionStatus.CONFIRMED, event.external_id))
        elif isinstance(event, ev.ActionFailed):
            found.append(Report(event.logical_action, ActionStatus.FAILED))
        elif isinstance(event, ev.ActionReconciled | ev.ActionResolved) and event.outcome not in _UNDECIDED:
            found.append(Report(event.logical_action, event.outcome, event.external_id))
    return found


def contradiction(run: RunSnapshot, report: Report) -> str | None:
    """Why ``report``, arriving after ``run`` COMPLETED, contradicts it; None when it does not
    (the run did not complete, or the report agrees with what the run counted)."""
    if run.status is not RunStatus.COMPLETED:
        return None
    name = report.logical_action
    record = run.action(name)
    done = record is not None and record.status in DONE
    if report.outcome is ActionStatus.CONFIRMED:
        if not done:
            counted = "never prepared" if record is None else record.status.value
            return (f"{name} took effect ({report.external_id or 'no external id'}) after the run completed "
                    f"counting it {counted}")
        assert record is not None
        if report.external_id is not None and record.external_id not in (None, report.external_id):
            return f"{name}: the far side holds {report.external_id}, the run recorded {record.external_id}"
        return None
    if not done or report.outcome in _UNDECIDED:
        return None
    assert record is not None
    turned = "missing from the far side" if report.outcome is None else report.outcome.value
    return f"{name} was counted done ({record.external_id or 'no external id'}) but turned out {turned}"


def corrections(run: RunSnapshot, found: Iterable[Report], *, seq: int, at: float) -> list[ev.CorrectionNeeded]:
    """The corrections ``found`` opens on ``run``, one per report that contradicts it (seqs from ``seq``),
    each with its evidence: what was reported and what the run had recorded."""
    opened: list[ev.CorrectionNeeded] = []
    for report in found:
        reason = contradiction(run, report)
        if reason is None:
            continue
        record = run.action(report.logical_action)
        evidence = FrozenMap({"reported": None if report.outcome is None else report.outcome.value,
                              "external_id": report.external_id,
                              "recorded_status": None if record is None else record.status.value,
                              "recorded_external_id": None if record is None else record.external_id})
        opened.append(ev.CorrectionNeeded(seq=seq + len(opened), at=at, logical_action=report.logical_action,
                                          reason=reason, evidence=evidence))
    return opened
