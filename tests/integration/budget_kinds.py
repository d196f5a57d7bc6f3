"""Run kinds for the tenant budget tests, loaded by the real services
(``LONGRUN_RUN_KINDS=tests.integration.budget_kinds:kinds``): ``thinker`` asks the model once (the
scripted model charges 250 tokens and 0.001 of cost per call) and completes; ``napper`` asks it, naps
``NAP`` seconds (a wait its deadline's timer ends), asks it again and completes."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import (
    AskModel,
    Complete,
    Decision,
    DecisionContext,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    WaitForEvent,
    freeze,
)

TOKENS_PER_CALL = 250
"""What the scripted model reports a call used (``model.ScriptedModel``'s default usage)."""
NAP = 1.5
"""Seconds a napper naps between its two questions: longer than a worker keeps its copy of the spent
tenants (``db.spent_tenants``)."""


class Thinker:
    kind = "thinker"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.fact("proposal:think:1") is None:
            return AskModel(purpose="think")
        return Complete(evidence=freeze({"thought": True}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


class Napper:
    kind = "napper"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.fact("proposal:think:1") is None:
            return AskModel(purpose="think")
        if state.last_wake is None:
            return WaitForEvent(kind="nap", correlation_key=f"nap/{state.run_id}", deadline=ctx.now + NAP)
        if state.fact("proposal:again:1") is None:
            return AskModel(purpose="again")
        return Complete(evidence=freeze({"thought": 2}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="t-1")
ANSWER = [{"action": "proceed", "args": {}, "rationale": "thought it over"}]


def kinds(settings: Settings) -> list[RunKind]:
    return [RunKind("thinker", VERSIONS, Thinker(), {}, allowed_actions=lambda state, purpose: ("proceed",),
                    model_script={"think": ANSWER}),
            RunKind("napper", VERSIONS, Napper(), {}, allowed_actions=lambda state, purpose: ("proceed",),
                    model_script={"think": ANSWER, "again": ANSWER})]
