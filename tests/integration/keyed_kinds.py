"""Run kinds with a concurrency key, loaded by the real services (``LONGRUN_RUN_KINDS``).

Each holds the key ``repo:<input.repo>`` (limit one) with its own policy: ``keyed_queue`` queues,
``keyed_cancel`` cancels the run in progress, ``keyed_refuse`` refuses the new run. A run waits
``input.hold`` seconds for an event that never comes (its wait's deadline wakes it), then completes;
without ``repo`` it takes no key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longrun.authoring import ConcurrencyKey, RunKind
from longrun.config import Settings
from longrun.domain import Complete, Decision, DecisionContext, FrozenMap, PinnedVersions, RunSnapshot, WaitForEvent, thaw
from longrun.domain.concurrency import KeyPolicy

VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="keyed-1")


def repository(value: Mapping[str, Any]) -> str | None:
    return f"repo:{value['repo']}" if "repo" in value else None


class Holds:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if state.last_wake is None:
            return WaitForEvent(kind="never", correlation_key=f"hold/{state.run_id}", deadline=ctx.now + goal["hold"])
        return Complete(evidence=FrozenMap({"held": goal["hold"]}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    return [RunKind(f"keyed_{policy.value.split('_')[0]}", VERSIONS, Holds(), {},
                    concurrency=ConcurrencyKey(repository, limit=1, policy=policy))
            for policy in KeyPolicy]
