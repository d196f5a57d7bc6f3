"""Closure's pure decisions: which timers a transition leaves without a purpose, a finished run's summary,
and when an outcome arriving after completion contradicts the run."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from longrun.db import runs
from longrun.domain import (
    ActionStatus,
    EffectKind,
    RunStatus,
    Wait,
    WakeReason,
    closure,
    evolve,
    freeze,
)
from longrun.domain import events as ev
from longrun.errors import EventRejected
from longrun_client.timeline import describe
from longrun.ports.runs import plan
from tests.unit.domain.support import History


def _waiting(wait_id: str = "ci-1") -> History:
    history = History()
    history.apply(ev.RunStatusChanged, to=RunStatus.RUNNING, reason="taken")
    history.apply(ev.WaitStarted, status=RunStatus.WAITING_EVENT,
                  wait=Wait(wait_id=wait_id, kind="ci", deadline=500.0, correlation_key="ci:1"))
    return history


def _completed_with_merge(external_id: str = "mr-17") -> History:
    """A run that confirmed its merge request and completed."""
    history = History()
    history.apply(ev.RunStatusChanged, to=RunStatus.RUNNING, reason="taken")
    history.apply(ev.ActionPrepared, logical_action="merge", tool="forge.mr", tool_version="1",
                  effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, idempotency_key="k-merge", request_hash="h")
    history.apply(ev.ActionSubmitted, logical_action="merge")
    history.apply(ev.BudgetCharged, tool_calls=1, model_calls=3, cost=0.5)
    history.apply(ev.ActionConfirmed, logical_action="merge", external_id=external_id)
    history.apply(ev.RunCompleted, evidence=freeze({"merged": True}))
    return history


# -- timers to cancel ------------------------------------------------------------------------------------


def test_a_wake_cancels_the_timers_of_the_wait_it_ended() -> None:
    history = _waiting()
    before = history.snapshot
    after = history.apply(ev.RunWoken, wait_id="ci-1", reason=WakeReason.EVENT, correlation_key="ci:1")
    assert closure.timers_to_cancel(before, after) == closure.Cancel("ci-1")


def test_a_finished_run_cancels_all_of_its_timers_and_a_step_that_ends_nothing_cancels_none() -> None:
    history = _waiting()
    waiting = history.snapshot
    terminated = history.apply(ev.RunTerminated, by="op", reason="stop")
    assert closure.timers_to_cancel(waiting, terminated) == closure.Cancel(None)
    running = History()
    before = running.apply(ev.RunStatusChanged, to=RunStatus.RUNNING, reason="taken")
    after = running.apply(ev.FactRecorded, key="k", value=1, source="agent")
    assert closure.timers_to_cancel(before, after) is None
    # a wait that starts ends none
    parked = running.apply(ev.WaitStarted, status=RunStatus.WAITING_EVENT,
                           wait=Wait(wait_id="w", kind="ci", deadline=9.0, correlation_key="c"))
    assert closure.timers_to_cancel(after, parked) is None


def test_a_paused_wait_keeps_its_timers_and_a_cancel_request_ends_it() -> None:
    history = _waiting()
    waiting = history.snapshot
    paused = history.apply(ev.RunPaused, by="op", reason="look")
    assert closure.timers_to_cancel(waiting, paused) is None
    resumed = history.apply(ev.RunResumed, by="op", reason="go on")
    assert closure.timers_to_cancel(paused, resumed) is None
    cancelling = history.apply(ev.CancelRequested, by="op", reason="no")
    assert closure.timers_to_cancel(resumed, cancelling) == closure.Cancel("ci-1")


# -- the summary -------------------------------------------------------------------------------------------


def test_a_finished_runs_summary_names_what_it_did_used_and_took() -> None:
    run = _completed_with_merge().snapshot
    assert closure.summarize(run) == freeze({
        "status": "COMPLETED", "terminal_reason": "acceptance check passed",
        "done": [{"logical_action": "merge", "tool": "forge.mr", "status": "CONFIRMED", "external_id": "mr-17"}],
        "used": {"model_calls": 3, "tool_calls": 1, "cost": 0.5},
        "duration_seconds": run.status_since - run.created_at})
    assert closure.summarize(run)["duration_seconds"] == 6.0


def test_an_open_run_has_no_summary() -> None:
    with pytest.raises(ValueError, match="only a finished run has a summary"):
        closure.summarize(_waiting().snapshot)


def test_the_transition_that_finishes_a_run_records_its_summary_whoever_writes_it() -> None:
    history = _waiting()
    stored = runs.StoredRun(history.snapshot, len(history.events), 0, None, None, 0, admitted=True)
    planned = plan(stored, [history.event(ev.RunTerminated, by="op", reason="stop")])
    summary, applied = planned.rows[-1]
    assert isinstance(summary, ev.RunSummarized) and applied
    assert summary.seq == planned.after.stored_seq == stored.stored_seq + 2
    assert summary.summary == closure.summarize(planned.after.snapshot)
    assert planned.after.snapshot.status is RunStatus.TERMINATED and planned.after.snapshot.last_seq == summary.seq
    # and a transition that does not finish the run records none
    woken = plan(stored, [history.event(ev.RunWoken, wait_id="ci-1", reason=WakeReason.EVENT,
                                             correlation_key="ci:1")])
    assert [type(e) for e, _ in woken.rows] == [ev.RunWoken]


def test_a_summary_or_correction_is_recorded_on_a_finished_run_only_and_never_reopens_it() -> None:
    open_run = _waiting()
    with pytest.raises(EventRejected, match="finished run only"):
        open_run.apply(ev.RunSummarized, summary=freeze({}))
    done = _completed_with_merge()
    before = done.snapshot
    after = done.apply(ev.CorrectionNeeded, logical_action="merge", reason="gone")
    assert after.status is RunStatus.COMPLETED and after.revision == before.revision + 1
    assert after.replace(revision=before.revision, last_seq=before.last_seq) == before
    stale = ev.CorrectionNeeded(seq=after.last_seq, at=1.0, logical_action="merge", reason="again")
    with pytest.raises(EventRejected, match="not after the last applied seq"):
        evolve(after, stale)


# -- corrections -------------------------------------------------------------------------------------------

CASES = {
    "failed after all": (closure.Report("merge", ActionStatus.FAILED), "turned out FAILED"),
    "missing": (closure.Report("merge", None), "turned out missing from the far side"),
    "another id": (closure.Report("merge", ActionStatus.CONFIRMED, "mr-99"), "holds mr-99, the run recorded mr-17"),
    "an effect it never counted": (closure.Report("deploy", ActionStatus.CONFIRMED, "d-1"),
                                   "took effect (d-1) after the run completed counting it never prepared"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_late_report_that_contradicts_a_completed_run_opens_a_correction(case: str) -> None:
    report, reason = CASES[case]
    run = _completed_with_merge().snapshot
    assert reason in (closure.contradiction(run, report) or "")
    opened = closure.corrections(run, [report], seq=run.last_seq + 1, at=99.0)
    assert [(c.seq, c.logical_action) for c in opened] == [(run.last_seq + 1, report.logical_action)]
    assert opened[0].evidence["recorded_external_id"] == (None if report.logical_action == "deploy" else "mr-17")


@pytest.mark.parametrize("report", [closure.Report("merge", ActionStatus.CONFIRMED, "mr-17"),
                                    closure.Report("merge", ActionStatus.CONFIRMED),
                                    closure.Report("merge", ActionStatus.UNKNOWN)])
def test_a_late_report_that_agrees_with_the_run_opens_nothing(report: closure.Report) -> None:
    assert closure.contradiction(_completed_with_merge().snapshot, report) is None


def test_a_run_that_did_not_complete_is_not_corrected() -> None:
    history = _waiting()
    terminated = history.apply(ev.RunTerminated, by="op", reason="stop")
    assert closure.contradiction(terminated, closure.Report("x", ActionStatus.CONFIRMED, "1")) is None


def test_reports_read_what_late_action_events_say_became_of_an_effect() -> None:
    found = closure.reports([
        ev.ActionConfirmed(seq=1, at=0, logical_action="a", external_id="1"),
        ev.ActionFailed(seq=2, at=0, logical_action="b", error="no"),
        ev.ActionReconciled(seq=3, at=0, logical_action="c", outcome=ActionStatus.UNKNOWN),
        ev.ActionReconciled(seq=4, at=0, logical_action="d", outcome=ActionStatus.NEEDS_ATTENTION, note="x"),
        ev.ReconciliationStarted(seq=5, at=0, logical_action="e"),
        ev.FactRecorded(seq=6, at=0, key="k", value=1, source="tool:t")])
    assert found == [closure.Report("a", ActionStatus.CONFIRMED, "1"), closure.Report("b", ActionStatus.FAILED),
                     closure.Report("d", ActionStatus.NEEDS_ATTENTION)]


def test_the_timeline_tells_a_summary_and_a_correction_in_a_line() -> None:
    run = _completed_with_merge().snapshot
    at = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)
    summary = ev.event_to_dict(ev.RunSummarized(seq=8, at=7.0, summary=closure.summarize(run)))
    assert describe(8, "run.summary", summary, True, at).endswith(
        "SUMMARY   1 action(s) done, 1 tool and 3 model call(s), cost 0.500, 6.0s")
    correction = ev.event_to_dict(ev.CorrectionNeeded(seq=9, at=8.0, logical_action="merge", reason="gone"))
    assert describe(9, "run.correction_needed", correction, True, at).endswith("CORRECTION merge: gone")
