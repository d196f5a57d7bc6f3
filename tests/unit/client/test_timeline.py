"""A timeline line for a person's act on a run and for a question: who, what and why in one line (the
console's run page and ``longrunctl run timeline`` print these)."""

from __future__ import annotations

from datetime import UTC, datetime

from longrun_client.timeline import describe

from longrun.domain import PinnedVersions, RunStatus, Wait
from longrun.domain import events as ev

AT = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)


def _line(event: ev.RunEvent) -> str:
    return describe(event.seq, event.type, ev.event_to_dict(event), True, AT)


def test_a_wait_for_an_answer_names_its_question_and_whom_it_asks() -> None:
    asked = ev.WaitStarted(seq=3, at=0, status=RunStatus.WAITING_USER, wait=Wait(
        wait_id="w", kind="question", deadline=60, question_id="module", owner="user_42", subject="which?"))
    anyone = ev.WaitStarted(seq=3, at=0, status=RunStatus.WAITING_USER, wait=Wait(
        wait_id="w", kind="question", deadline=60, question_id="module", subject="which?"))
    assert _line(asked).endswith("STATUS -> WAITING_USER     answer to question module by user_42")
    assert _line(anyone).endswith("answer to question module by an approver")


def test_each_operator_act_question_and_migration_is_one_line_naming_who_and_why() -> None:
    versions = PinnedVersions(workflow="2", prompt="p", model_policy="m", tool_schemas="t")
    lines = [_line(e) for e in (
        ev.RunPaused(seq=4, at=0, by="ana", reason="freeze"), ev.RunResumed(seq=5, at=0, by="ana", reason="thaw"),
        ev.CancelRequested(seq=6, at=0, by="ana", reason="stop"), ev.RunTerminated(seq=7, at=0, by="ana", reason="now"),
        ev.VersionsMigrated(seq=8, at=0, versions=versions, by="ana", reason="release 2"),
        ev.QuestionOpened(seq=9, at=0, question_id="module", text="Which module?", answer_schema={}),
        ev.QuestionResolved(seq=10, at=0, question_id="module", answer={"module": "core"}, answered_by="ana"))]
    assert [line.split(None, 2)[-1] for line in lines] == [
        "PAUSED    by ana: freeze", "RESUMED   by ana: thaw", "CANCEL    by ana: stop", "TERMINATED by ana: now",
        "MIGRATED  to workflow version 2 by ana: release 2", "QUESTION  module asked: Which module?",
        "ANSWER    to module by ana: {'module': 'core'}"]
