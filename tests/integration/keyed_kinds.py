"""Run kinds with a concurrency key, loaded by the real services (``LONGRUN_RUN_KINDS``).

Each holds the key ``repo:<input.repo>`` (limit one) with its own policy: ``keyed_queue`` queues,
``keyed_cancel`` cancels the run in progress, ``keyed_refuse`` refuses the new one. A run with
``work`` seconds first makes one call to ``keyed.work``, which takes that long; then it waits ``hold``
seconds for an event that never comes (its wait's deadline wakes it), and completes. Without ``repo``
it takes no key.

The far side of ``keyed.work`` is a file (``KEYED_CALLS``): each call appends a line when it starts
and one when it ends, with its run, so a test reads what the repository went through.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import ConcurrencyKey, RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    WaitForEvent,
    freeze,
    thaw,
)
from longrun.domain.concurrency import KeyPolicy

VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="keyed-1")


class WorkArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str
    seconds: float


def repository(value: Mapping[str, Any]) -> str | None:
    return f"repo:{value['repo']}" if "repo" in value else None


class Holds:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if goal.get("work") and state.fact(RECEIPT_FACT_PREFIX + "work") is None:
            return CallTool(tool="keyed.work", args=freeze({"run": state.run_id, "seconds": goal["work"]}),
                            logical_action="work")
        if goal.get("hold") and state.last_wake is None:
            return WaitForEvent(kind="never", correlation_key=f"hold/{state.run_id}", deadline=ctx.now + goal["hold"])
        return Complete(evidence=FrozenMap({"held": goal.get("hold", 0)}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def _work(calls: str) -> Tool:
    def note(args: Mapping[str, Any], what: str) -> None:
        with open(calls, "a") as far_side:
            far_side.write(json.dumps({"run": args["run"], "event": what, "at": time.time()}) + "\n")

    async def work(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        note(args, "start")
        await asyncio.sleep(args["seconds"])
        note(args, "end")
        return ToolResult(None, {"worked": args["seconds"]})

    return Tool("keyed.work", "1", EffectKind.IDEMPOTENT_WRITE, WorkArgs, work, start_to_close=60)


def kinds(settings: Settings) -> list[RunKind]:
    tools = {"keyed.work": _work(os.environ.get("KEYED_CALLS", os.devnull))}
    return [RunKind(f"keyed_{policy.value.split('_')[0]}", VERSIONS, Holds(), tools,
                    concurrency=ConcurrencyKey(repository, limit=1, policy=policy))
            for policy in KeyPolicy]
