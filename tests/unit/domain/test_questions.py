"""Questions: a run asks a person (``AskUser``), waits in WAITING_USER for the answer, and the answer
(or the deadline) ends the wait; the question is open exactly while the run waits for its answer."""

from __future__ import annotations

import pytest

from longrun.domain import (
    ANSWER_FACT_PREFIX,
    AskUser,
    CancelRequested,
    DecisionContext,
    FrozenMap,
    QuestionOpened,
    QuestionResolved,
    RunPaused,
    RunResumed,
    RunSnapshot,
    RunStatus,
    RunStatusChanged,
    RunWoken,
    Wait,
    WaitStarted,
    WakeReason,
    evolve,
    fold,
    is_late,
    violations,
    wait_for,
)
from longrun.errors import EventRejected

from .support import History

S = RunStatus
SCHEMA = FrozenMap({"type": "object", "required": ["module"], "properties": {"module": {"type": "string"}}})
ASK = AskUser(question_id="q1", text="which module owns the retry?", answer_schema=SCHEMA, deadline=100.0,
              owner="alice")


def asking(decision: AskUser = ASK) -> History:
    """A run whose worker's step asked ``decision``, as the worker writes it."""
    h = History()
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    status, wait = wait_for(decision, DecisionContext(now=h.now, new_id=lambda: "w-q", rng=None))  # type: ignore[arg-type]
    h.apply(QuestionOpened, question_id=decision.question_id, text=decision.text,
            answer_schema=decision.answer_schema)
    h.apply(WaitStarted, status=status, wait=wait)
    return h


def test_asking_waits_for_the_answer_with_a_deadline_and_the_question_open() -> None:
    run = asking().snapshot
    assert run.status is S.WAITING_USER
    assert run.wait == Wait(wait_id="w-q", kind="question", deadline=100.0, owner="alice", question_id="q1")
    [question] = run.open_questions
    assert (question.question_id, question.text, question.answer_schema) == ("q1", ASK.text, SCHEMA)
    assert violations(run) == ()


def test_the_answer_becomes_a_fact_of_the_person_and_readies_the_run() -> None:
    h = asking()
    run = h.apply(QuestionResolved, question_id="q1", answer=FrozenMap({"module": "billing"}), answered_by="alice")
    assert run.status is S.READY and run.wait is None and run.open_questions == ()
    fact = run.fact(ANSWER_FACT_PREFIX + "q1")
    assert fact is not None and (fact.value, fact.source) == ({"module": "billing"}, "user:alice")
    assert run.last_wake is not None and run.last_wake.reason is WakeReason.ANSWER
    assert fold(h.events) == run


def test_an_unanswered_question_closes_at_its_deadline_and_a_late_answer_changes_nothing() -> None:
    h = asking()
    run = h.apply(RunWoken, wait_id="w-q", reason=WakeReason.DEADLINE)
    assert run.status is S.READY and run.open_questions == () and run.fact(ANSWER_FACT_PREFIX + "q1") is None
    assert run.last_wake is not None and run.last_wake.reason is WakeReason.DEADLINE
    late = h.event(QuestionResolved, question_id="q1", answer=FrozenMap({"module": "x"}), answered_by="alice")
    assert is_late(run, late) and evolve(run, late) is run


def test_an_answer_to_another_question_than_the_one_waited_for_is_late() -> None:
    run = asking().snapshot
    assert is_late(run, QuestionResolved(seq=9, at=9.0, question_id="q2", answer=1, answered_by="alice"))


def test_only_a_workers_step_asks_one_question_at_a_time_and_never_an_answered_one_again() -> None:
    ready = History()
    with pytest.raises(EventRejected, match="only a worker step asks a question; the run is READY"):
        ready.apply(QuestionOpened, question_id="q1", text="?", answer_schema=SCHEMA)
    h = History()
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    h.apply(QuestionOpened, question_id="q1", text="?", answer_schema=SCHEMA)
    with pytest.raises(EventRejected, match="question 'q1' is already open"):
        h.apply(QuestionOpened, question_id="q2", text="?", answer_schema=SCHEMA)
    answered = asking()
    answered.apply(QuestionResolved, question_id="q1", answer=FrozenMap({"module": "m"}), answered_by="alice")
    answered.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    with pytest.raises(EventRejected, match="question 'q1' was answered before"):
        answered.apply(QuestionOpened, question_id="q1", text="again?", answer_schema=SCHEMA)


def test_a_question_left_open_outside_the_step_that_asked_it_is_refused() -> None:
    h = History()
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    h.apply(QuestionOpened, question_id="q1", text="?", answer_schema=SCHEMA)
    with pytest.raises(EventRejected, match="question q1 is open but the run does not wait for its answer"):
        h.apply(RunStatusChanged, to=S.READY, reason="yield")


def test_a_question_wait_names_an_open_question_and_needs_no_approval_fields() -> None:
    run = asking().snapshot
    assert run.wait is not None
    no_question = run.replace(open_questions=())
    assert violations(no_question) == (
        "WAITING_USER: the wait is for an answer to question 'q1', which is not open",)
    unnamed = run.replace(wait=Wait(wait_id="w-q", kind="question", deadline=100.0))
    assert "WAITING_USER: a question wait names its question, and only a question wait does" in violations(unnamed)
    elsewhere = run.replace(status=S.WAITING_EVENT, wait=Wait(wait_id="w", kind="question", deadline=100.0,
                                                              correlation_key="ci", question_id="q1"))
    assert "WAITING_EVENT: an answer is waited for in WAITING_USER only" in violations(elsewhere)


def test_a_pause_keeps_the_question_and_an_answer_while_paused_readies_what_it_resumes_to() -> None:
    h = asking()
    paused = h.apply(RunPaused, by="ops", reason="look")
    assert paused.wait is not None and [q.question_id for q in paused.open_questions] == ["q1"]
    resumed = h.apply(RunResumed, by="ops", reason="go on")
    assert resumed.status is S.WAITING_USER and [q.question_id for q in resumed.open_questions] == ["q1"]
    h.apply(RunPaused, by="ops", reason="again")
    answered = h.apply(QuestionResolved, question_id="q1", answer=FrozenMap({"module": "m"}), answered_by="bob")
    assert (answered.status, answered.paused_from, answered.open_questions) == (S.PAUSED, S.READY, ())
    assert h.apply(RunResumed, by="ops", reason="go").status is S.READY


def test_cancelling_while_asking_closes_the_question() -> None:
    h = asking()
    run = h.apply(CancelRequested, by="ops", reason="stop")
    assert run.status is S.CANCELLING and run.wait is None and run.open_questions == ()


def test_a_snapshot_with_an_open_question_round_trips() -> None:
    run = asking().snapshot
    assert RunSnapshot.from_dict(run.to_dict()) == run
