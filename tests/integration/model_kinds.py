"""A run kind that asks the model for its plan again and again, loaded by the real services
(``LONGRUN_RUN_KINDS``): ``asking`` never completes by itself, so only its budget ends it."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import AskModel, Decision, DecisionContext, FrozenMap, PinnedVersions, RunSnapshot


class Asking:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        return AskModel(purpose="plan")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none")
    return [RunKind("asking", versions, Asking(), {}, allowed_actions=lambda state, purpose: ("plan",))]
