"""A run kind for the tenant budget tests, loaded by the real services
(``LONGRUN_RUN_KINDS=tests.integration.budget_kinds:kinds``): ``thinker`` asks the model once (the
scripted model charges 250 tokens and 0.001 of cost per call) and completes."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import AskModel, Complete, Decision, DecisionContext, FrozenMap, PinnedVersions, RunSnapshot, freeze

TOKENS_PER_CALL = 250
"""What the scripted model reports a call used (``model.ScriptedModel``'s default usage)."""


class Thinker:
    kind = "thinker"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.fact("proposal:think:1") is None:
            return AskModel(purpose="think")
        return Complete(evidence=freeze({"thought": True}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    return [RunKind("thinker", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="t-1"),
                    Thinker(), {}, allowed_actions=lambda state, purpose: ("proceed",),
                    model_script={"think": [{"action": "proceed", "args": {}, "rationale": "thought it over"}]})]
