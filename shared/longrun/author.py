"""Everything a run kind's author imports, from one place, for both ways of writing a kind:

    from longrun.author import Context, EffectKind, RunKind, Tool, ToolResult, workflow   # code-first
    from longrun.author import CallTool, Complete, DecisionContext, RunSnapshot           # decide-style
    from longrun.author import Kit, every_crash, replay                                   # testing

The testing names (``Kit``, ``every_crash``, ``replay``, ``Replayed``) load the in-memory engine when first
used, not on import. Services never import this module: each imports only what it runs.
"""

from __future__ import annotations

from typing import Any

from longrun.authoring import (
    CleanupStep,
    ConcurrencyKey,
    RunKind,
    ScopeApproval,
    Tool,
    ToolResult,
    heartbeat,
)
from longrun.codefirst.awaits import ApprovalVoided, ToolFailed, WaitTimedOut
from longrun.codefirst.context import Context
from longrun.codefirst.driver import MAX_AWAITS, ForeignAwait, TooManyAwaits
from longrun.codefirst.journal import ReplayDiverged, ReplayError
from longrun.codefirst.kind import CodeFirst, workflow
from longrun.domain import (
    AskModel,
    AskUser,
    CallTool,
    CallTools,
    Child,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    Reconcile,
    RetryPolicy,
    RunSnapshot,
    RunStatus,
    ScheduleRetry,
    Scope,
    StartChildren,
    WaitForChildren,
    WaitForEvent,
    WaitForSignal,
    WaitForUser,
    WakeReason,
    Workflow,
    freeze,
    request_hash,
    thaw,
)
from longrun.domain.joins import ALL, FIRST, at_least

_TESTING = {"Kit": "longrun.testing.kit", "every_crash": "longrun.testing.kit",
            "replay": "longrun.testing.replay", "Replayed": "longrun.testing.replay"}


def __getattr__(name: str) -> Any:
    module = _TESTING.get(name)
    if module is None:
        raise AttributeError(f"module 'longrun.author' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ALL", "FIRST", "MAX_AWAITS", "ApprovalVoided", "AskModel", "AskUser", "CallTool", "CallTools", "Child",
    "CleanupStep", "CodeFirst",
    "Complete", "ConcurrencyKey", "Context", "Decision", "DecisionContext", "EffectKind", "Fail", "ForeignAwait",
    "FrozenMap", "Kit", "PinnedVersions", "Reconcile", "Replayed", "ReplayDiverged", "ReplayError", "RetryPolicy",
    "RunKind", "RunSnapshot", "RunStatus", "ScheduleRetry", "Scope", "ScopeApproval", "StartChildren", "Tool",
    "ToolFailed", "ToolResult", "TooManyAwaits", "WaitForChildren", "WaitForEvent", "WaitForSignal", "WaitForUser",
    "WaitTimedOut", "WakeReason", "Workflow", "at_least", "every_crash", "freeze", "heartbeat", "replay",
    "request_hash", "thaw", "workflow",
]
