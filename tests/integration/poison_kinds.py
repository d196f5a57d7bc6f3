"""A run kind whose ``decide`` cannot read some inputs, loaded by the real services (``LONGRUN_RUN_KINDS``).

``counting`` completes with the number of ``steps`` its input asks for as evidence. Its first release reads ``steps`` with ``int()`` and raises ``ValueError`` on ``{"steps": "abc"}``; the
same version deployed with ``POISON_FIXED=1`` (the fix) takes an unreadable count as one step. Its
failed steps are tried again after 0.5 s, then 1 s, and it gives up on the third (``STEP_RETRY``).
"""

from __future__ import annotations

import os

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import (
    Complete,
    Decision,
    DecisionContext,
    FrozenMap,
    PinnedVersions,
    RetryPolicy,
    RunSnapshot,
    freeze,
    thaw,
)

STEP_RETRY = RetryPolicy(initial_interval=0.5, backoff_coefficient=2.0, maximum_interval=5.0, maximum_attempts=3,
                         jitter=0.0)


class Counting:
    def __init__(self, fixed: bool) -> None:
        self.fixed = fixed

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        return Complete(evidence=freeze({"steps": self._steps(goal["steps"])}))

    def _steps(self, raw: object) -> int:
        if self.fixed and not str(raw).isdigit():
            return 1
        return int(str(raw))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none")
    return [RunKind("counting", versions, Counting(fixed=os.environ.get("POISON_FIXED") == "1"), {},
                    step_retry=STEP_RETRY)]
