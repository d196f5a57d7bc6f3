"""Run kinds for the run-timeout tests, loaded by the real services (``LONGRUN_RUN_KINDS``).

``timed`` makes the calls its goal lists, in order (``{"calls": ["book", "slow"]}``): ``timed.book``
books at once and declares a compensation (it cancels the booking), ``timed.slow`` answers after
``TIMED_SLOW_SECONDS`` and has none, ``timed.note`` notes at once and has none. With ``"nap": true``
the run first waits for an event that never comes, for one second: its wait's deadline wakes it and
it is queued again; with ``"park": true`` it ends by waiting an hour for an event that never comes
(it stays open). Its runs may sit queued ten minutes by default (``RunKind.timeouts``).

The far side is a file (``TIMED_CALLS``): every call and every compensation that reaches it appends
one line with its idempotency key, so a test counts exactly what took effect.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
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
    RunTimeouts,
    WaitForEvent,
    freeze,
    thaw,
)

DEFAULTS = RunTimeouts(schedule_to_start=600.0)


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _append(calls: str, line: dict[str, Any]) -> None:
    with open(calls, "a") as far_side:
        far_side.write(json.dumps(line) + "\n")


def _tools(calls: str, slow_seconds: float) -> dict[str, Tool]:
    async def book(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        _append(calls, {"tool": "timed.book", "key": idempotency_key})
        return ToolResult(f"booking:{idempotency_key}", {"booking": idempotency_key})

    async def cancel_booking(receipt: Mapping[str, Any]) -> ToolResult:
        _append(calls, {"tool": "timed.book.compensate", "key": receipt["booking"]})
        return ToolResult(None, {"cancelled": receipt["booking"]})

    async def slow(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        await asyncio.sleep(slow_seconds)
        _append(calls, {"tool": "timed.slow", "key": idempotency_key})
        return ToolResult(f"slow:{idempotency_key}", {"done": True})

    async def note(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        _append(calls, {"tool": "timed.note", "key": idempotency_key})
        return ToolResult(None, {"noted": True})

    return {"timed.note": Tool("timed.note", "1", EffectKind.IDEMPOTENT_WRITE, NoArgs, note),
            "timed.book": Tool("timed.book", "1", EffectKind.IDEMPOTENT_WRITE, NoArgs, book,
                               compensate=cancel_booking),
            "timed.slow": Tool("timed.slow", "1", EffectKind.IDEMPOTENT_WRITE, NoArgs, slow)}


class Timed:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if goal.get("nap") and state.last_wake is None:
            return WaitForEvent(kind="never", correlation_key=f"never/{state.run_id}", deadline=ctx.now + 1)
        for verb in goal.get("calls", []):
            if state.fact(RECEIPT_FACT_PREFIX + verb) is None:
                return CallTool(tool=f"timed.{verb}", args=freeze({}), logical_action=verb)
        if goal.get("park"):
            return WaitForEvent(kind="never", correlation_key=f"never/{state.run_id}/2", deadline=ctx.now + 3600)
        return Complete(evidence=freeze({"calls": len(goal.get("calls", []))}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    tools = _tools(os.environ["TIMED_CALLS"], float(os.environ.get("TIMED_SLOW_SECONDS", "0")))
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="timed-1")
    return [RunKind("timed", versions, Timed(), tools, timeouts=DEFAULTS)]
