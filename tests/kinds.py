"""The run kinds the tests' services load: ``LONGRUN_RUN_KINDS``' default (the benchmark's ``steps``)
and the installed example's ``dependency_upgrade`` (its entry point); and the test-only kinds a test
names to its services (``LONGRUN_RUN_KINDS=tests.kinds:ASKING``)."""

from __future__ import annotations

from longrun import run_kinds
from longrun.authoring import Registry, RunKind
from longrun.config import Settings
from longrun.domain import (
    ANSWER_FACT_PREFIX,
    AskUser,
    Complete,
    Decision,
    DecisionContext,
    Fail,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    WakeReason,
    freeze,
    thaw,
)


def registry(settings: Settings | None = None) -> Registry:
    return run_kinds.load(settings or Settings.from_env({}))


MODULE_SCHEMA = FrozenMap({"type": "object", "required": ["module"], "additionalProperties": False,
                           "properties": {"module": {"type": "string", "minLength": 1},
                                          "urgent": {"type": "boolean"}}})
"""What an answer to ``asking``'s question must look like."""
ANSWER = ANSWER_FACT_PREFIX + "module"


class Asking:
    """Asks a person which module its task is about (``goal.owner`` may answer; within
    ``goal.answer_within`` seconds, default an hour), then completes with the answer as its evidence;
    unanswered by the deadline, it fails saying so."""

    kind = "asking"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        answer = state.fact(ANSWER)
        if answer is not None:
            return Complete(evidence=freeze({"answer": thaw(answer.value), "answered_by": answer.source}))
        if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
            return Fail(reason="nobody said which module before the question's deadline")
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        return AskUser(question_id="module", text=f"Which module is {goal['task']!r} about?",
                       answer_schema=MODULE_SCHEMA, deadline=ctx.now + float(goal.get("answer_within", 3600)),
                       owner=goal.get("owner"))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        answer = state.fact(ANSWER)
        return () if answer is not None and evidence["answer"] == answer.value else ("the evidence is not the answer",)


ASKING = RunKind("asking", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none"),
                 Asking(), {})
