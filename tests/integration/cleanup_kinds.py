"""The run kind of the cleanup tests, loaded by the real services (``LONGRUN_RUN_KINDS``).

``tidy`` ends as its goal says: ``{"fail": true}`` FAILED, ``{"park": true}`` waiting an hour for an
event that never comes (for an operator to cancel or terminate), otherwise COMPLETED. Its cleanup
releases the run's workspace (``tidy.release``, a non-idempotent write with a lookup); the far side
refuses the first ``fail_first`` attempts of each release as unavailable.

The far side is two files: ``TIDY_ATTEMPTS`` gets a line per attempt that reached it, ``TIDY_EFFECTS``
a line per release that took effect, each with its idempotency key, so a test counts exactly what
happened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import CleanupStep, RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    RetryPolicy,
    RunSnapshot,
    WaitForEvent,
    freeze,
    thaw,
)
from longrun.errors import ToolUnavailable

KIND = "tidy"
VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="tidy-1")
RETRY = RetryPolicy(initial_interval=0.5, maximum_interval=1.0, jitter=0.0)


class ReleaseArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workspace: str
    fail_first: int = 0


def _lines(path: Path, key: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, path.read_text().splitlines()) if line["key"] == key]


def _append(path: Path, line: dict[str, Any]) -> None:
    with path.open("a") as far_side:
        far_side.write(json.dumps(line) + "\n")


def _release_tool(attempts: Path, effects: Path) -> Tool:
    async def release(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        earlier = len(_lines(attempts, idempotency_key))
        _append(attempts, {"key": idempotency_key})
        if earlier < args["fail_first"]:
            raise ToolUnavailable("tidy.release", f"attempt {earlier + 1} refused (fails the first {args['fail_first']})")
        _append(effects, {"key": idempotency_key, "workspace": args["workspace"]})
        return ToolResult(f"released:{args['workspace']}", {"workspace": args["workspace"]})

    async def lookup(idempotency_key: str) -> ToolResult | None:
        found = _lines(effects, idempotency_key)
        return ToolResult(f"released:{found[0]['workspace']}", found[0]) if found else None

    return Tool("tidy.release", "1", EffectKind.NON_IDEMPOTENT_WRITE, ReleaseArgs, release, lookup=lookup,
                start_to_close=5.0)


def _workspace(run: RunSnapshot) -> dict[str, Any]:
    goal = thaw(run.goal)
    assert isinstance(goal, dict)
    return {"workspace": f"ws-{run.run_id}", "fail_first": int(goal.get("fail_first", 0))}


class Tidy:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if goal.get("fail"):
            return Fail(reason="asked to fail")
        if goal.get("park"):
            return WaitForEvent(kind="never", correlation_key=f"never/{state.run_id}", deadline=ctx.now + 3600)
        return Complete(evidence=freeze({}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    release = _release_tool(Path(os.environ["TIDY_ATTEMPTS"]), Path(os.environ["TIDY_EFFECTS"]))
    return [RunKind(KIND, VERSIONS, Tidy(), {release.name: release},
                    cleanup=(CleanupStep("release_workspace", release.name, _workspace),), cleanup_retry=RETRY)]
