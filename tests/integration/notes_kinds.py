"""Run kinds for the permission tests, loaded by the real services (``LONGRUN_RUN_KINDS``).

``notes`` makes the calls its goal lists, in order (``{"doc": ..., "calls": ["write", "delete"]}``),
each on the document ``doc:<doc>``; with ``"approve": true`` each call first waits for a person's
approval of exactly that request; with ``"wait": true`` it first waits for an event that never
comes. Its declared maximum is ``notes.read`` and ``notes.write`` on any document: it declares
``notes.delete`` but may never call it. ``notes_asking`` is the same workflow with a wider
maximum (``notes.*``) whose calls outside a run's scope ask user_42 for an approval instead.

The far side is a file (``NOTES_CALLS``): every call that reaches it appends one line, so a test
counts exactly what was called.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, ScopeApproval, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    APPROVAL_FACT_PREFIX,
    RECEIPT_FACT_PREFIX,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    Scope,
    WaitForEvent,
    WaitForUser,
    freeze,
    request_hash,
    thaw,
)

OWNER = "user_42"


class DocArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    doc: str


def _tool(verb: str, effect: EffectKind, calls: str) -> Tool:
    async def execute(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        with open(calls, "a") as far_side:
            far_side.write(json.dumps({"tool": f"notes.{verb}", "doc": args["doc"], "key": idempotency_key}) + "\n")
        return ToolResult(f"{verb}:{args['doc']}", {"done": verb})

    return Tool(f"notes.{verb}", "1", effect, DocArgs, execute, resource=lambda args: f"doc:{args['doc']}")


class Notes:
    def __init__(self, kind: str, tools: Mapping[str, Tool]) -> None:
        self.kind = kind
        self.tools = tools

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if goal.get("wait") and state.last_wake is None:
            return WaitForEvent(kind="never", correlation_key=f"never/{state.run_id}", deadline=ctx.now + 3600)
        for i, verb in enumerate(goal["calls"]):
            name, tool, args = f"{verb}:{i}", self.tools[f"notes.{verb}"], {"doc": goal["doc"]}
            if state.fact(RECEIPT_FACT_PREFIX + name) is not None:
                continue
            approval_id = None
            if goal.get("approve"):
                approval_id = f"ok:{i}"
                decided = state.fact(APPROVAL_FACT_PREFIX + approval_id)
                if decided is None:
                    return WaitForUser(approval_id=approval_id, owner=OWNER, deadline=ctx.now + 3600,
                                       approved_hash=request_hash(tool.name, tool.version, args=args),
                                       summary=f"{verb} {goal['doc']}")
                if not thaw(decided.value)["approved"]:  # type: ignore[index]
                    return Fail(reason=f"{name} was denied")
            return CallTool(tool=tool.name, args=freeze(args), logical_action=name, approval_id=approval_id)
        return Complete(evidence=freeze({"calls": len(goal["calls"])}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kinds(settings: Settings) -> list[RunKind]:
    calls = os.environ["NOTES_CALLS"]
    tools = {t.name: t for t in (_tool("read", EffectKind.READ, calls),
                                 _tool("write", EffectKind.IDEMPOTENT_WRITE, calls),
                                 _tool("delete", EffectKind.IDEMPOTENT_WRITE, calls))}
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="notes-1")
    return [RunKind("notes", versions, Notes("notes", tools), tools,
                    scope=Scope(tools=("notes.read", "notes.write"), resources=("doc:*",))),
            RunKind("notes_asking", versions, Notes("notes_asking", tools), tools,
                    scope=Scope(tools=("notes.*",), resources=("doc:*",)),
                    scope_approval=ScopeApproval(owner=OWNER, timeout=3600))]
