"""A run kind asks a person (``AskUser``) and uses the answer, through the kit: the answer is scripted
like an approval (``kit.answer``, or a ``people`` function for ``settle``), checked against the
question's schema, recorded once, and an unanswered question ends at its deadline."""

from __future__ import annotations

import pytest

from longrun.app.gateway.operate import AnswerRefused, NotPending, NotPermitted
from longrun.authoring import RunKind
from longrun.domain import (
    AskUser,
    Decision,
    DecisionContext,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    RunStatus,
    event_to_dict,
)
from longrun.testing.kit import Kit, every_crash
from tests.kinds import ASKING, MODULE_SCHEMA

GOAL = {"task": "retry storms", "owner": "alice"}


def alice_answers(kit: Kit, run: RunSnapshot) -> bool:
    if kit.question(run.run_id) is None:
        return False
    kit.answer(run.run_id, {"module": "billing"})
    return True


def history(kit: Kit, run_id: str) -> list[dict[str, object]]:
    return [event_to_dict(e) for e in kit.world.store.history(run_id)]


def test_a_question_is_asked_answered_and_the_answer_used() -> None:
    with Kit(ASKING) as kit:
        run_id = kit.start(GOAL)
        kit.settle(people=alice_answers)
        assert kit.status(run_id) is RunStatus.COMPLETED
        acceptance = kit.snapshot(run_id).acceptance
        assert acceptance is not None
        assert acceptance.evidence == {"answer": {"module": "billing"}, "answered_by": "user:alice"}
        types = [e["type"] for e in history(kit, run_id)]
        assert types.count("question.opened") == 1 and types.count("question.resolved") == 1
        assert [(a["actor"], a["action"]) for a in kit.world.audit_log] == [("alice", "answer")]
        assert kit.check() == []


def test_the_open_question_shows_its_text_schema_and_deadline() -> None:
    with Kit(ASKING) as kit:
        run_id = kit.start(GOAL | {"answer_within": 60})
        kit.settle(timers=False)
        question = kit.question(run_id)
        run = kit.snapshot(run_id)
        assert question is not None and run.wait is not None
        assert (question.text, question.answer_schema) == ("Which module is 'retry storms' about?", MODULE_SCHEMA)
        assert (run.status, run.wait.kind, run.wait.owner) == (RunStatus.WAITING_USER, "question", "alice")
        assert run.wait.deadline == pytest.approx(run.status_since + 60)


def test_an_answer_that_breaks_the_schema_is_refused_naming_why_and_nothing_is_recorded() -> None:
    with Kit(ASKING) as kit:
        run_id = kit.start(GOAL)
        kit.settle(timers=False)
        before, events, audit = kit.snapshot(run_id), history(kit, run_id), list(kit.world.audit_log)
        with pytest.raises(AnswerRefused) as refused:
            kit.answer(run_id, {"module": "", "colour": "red"})
        assert refused.value.problems == [
            "$: Additional properties are not allowed ('colour' was unexpected)",
            "$.module: '' should be non-empty"]
        with pytest.raises(NotPermitted, match="only alice may answer this question, not bob"):
            kit.answer(run_id, {"module": "billing"}, by="bob")
        assert (kit.snapshot(run_id), history(kit, run_id), kit.world.audit_log) == (before, events, audit)
        kit.answer(run_id, {"module": "billing"})
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.COMPLETED and kit.check() == []


def test_the_same_answer_again_changes_nothing_and_another_one_is_refused() -> None:
    with Kit(ASKING) as kit:
        run_id = kit.start(GOAL)
        kit.settle(timers=False)
        first = kit.answer(run_id, {"module": "billing"})
        events, audit = history(kit, run_id), list(kit.world.audit_log)
        again = kit.world.answer(run_id, question_id="module", answer={"module": "billing"}, actor="alice")
        assert (first["repeated"], again["repeated"]) == (False, True)
        assert (history(kit, run_id), kit.world.audit_log) == (events, audit)
        kit.settle(timers=False)
        assert kit.world.answer(run_id, question_id="module", answer={"module": "billing"}, actor="alice")["repeated"]
        with pytest.raises(NotPending, match="answer to question 'module' is not pending .alice answered it"):
            kit.world.answer(run_id, question_id="module", answer={"module": "payments"}, actor="alice")
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert [e["type"] for e in history(kit, run_id)].count("question.resolved") == 1


def test_an_unanswered_question_ends_at_its_deadline_and_is_not_answerable_after() -> None:
    with Kit(ASKING) as kit:
        run_id = kit.start(GOAL | {"answer_within": 30})
        kit.settle(timers=False)
        with pytest.raises(NotPending, match="question 'other' is not pending .it waits for the answer to question"):
            kit.world.answer(run_id, question_id="other", answer={"module": "billing"}, actor="alice")
        assert kit.advance(29) == 0 and kit.question(run_id) is not None
        kit.settle()  # time runs on to the deadline
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.FAILED and run.open_questions == ()
        assert run.terminal_reason == "nobody said which module before the question's deadline"
        with pytest.raises(NotPending, match="it is FAILED and waits for no answer"):
            kit.world.answer(run_id, question_id="module", answer={"module": "billing"}, actor="alice")
        assert kit.check() == []


def test_a_worker_killed_anywhere_still_asks_once_and_completes_with_the_answer() -> None:
    def scenario(kit: Kit) -> None:
        kit.start(GOAL)
        kit.settle(people=alice_answers)

    for outcome in every_crash(ASKING, scenario):
        (run_id,) = outcome.kit.run_ids()
        assert outcome.kit.status(run_id) is RunStatus.COMPLETED, outcome.point
        types = [e["type"] for e in history(outcome.kit, run_id)]
        assert types.count("question.opened") == 1, outcome.point
        assert outcome.kit.check() == [], outcome.point


class _Asks:
    """Asks ``question`` with ``schema`` every time it decides."""

    kind = "asks"

    def __init__(self, schema: FrozenMap) -> None:
        self.schema = schema

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        return AskUser(question_id="q", text="?", answer_schema=self.schema, deadline=ctx.now + 60)

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def _asks(schema: FrozenMap) -> RunKind:
    return RunKind("asks", PinnedVersions(workflow="1", prompt="-", model_policy="-", tool_schemas="-"),
                   _Asks(schema), {})


def test_a_question_whose_schema_is_not_a_json_schema_goes_to_a_person_unasked() -> None:
    with Kit(_asks(FrozenMap({"type": "no-such-type"}))) as kit:
        run_id = kit.start({})
        kit.settle(timers=False)
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.NEEDS_ATTENTION and run.open_questions == ()
        assert run.terminal_reason is None
        reason = [e["reason"] for e in history(kit, run_id) if e["type"] == "run.status_changed"][-1]
        assert str(reason).startswith("question 'q': its answer schema is not a JSON Schema (draft 2020-12): $.type:")
        assert kit.check() == []


def test_asking_an_answered_question_again_goes_to_a_person() -> None:
    with Kit(_asks(FrozenMap({"type": "integer"}))) as kit:
        run_id = kit.start({})
        kit.settle(timers=False)
        kit.answer(run_id, 42)
        kit.settle(timers=False)
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.NEEDS_ATTENTION and run.fact("answer:q") is not None
        reason = [e["reason"] for e in history(kit, run_id) if e["type"] == "run.status_changed"][-1]
        assert reason == "decide asked question 'q' again, answered already"
