"""A run kind whose one tool answers with megabytes, loaded by the real services (``LONGRUN_RUN_KINDS``).

``bulky`` reads a CI log (``bulk.read``, a read: recorded with its answer) of ``goal.megabytes`` MB,
made from ``goal.seed`` (``bulk_log``, so a test knows the bytes), then completes with the receipt's
reference as evidence. The receipt is far over the inline limit: the worker uploads it to the
artifact store under the run's tenant and the run keeps only its hash (a claim check).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    ActionStatus,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    freeze,
)


class BulkArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: str
    megabytes: int


def bulk_log(seed: str, megabytes: int) -> str:
    line = f"{seed}: step passed, 0 warnings\n"
    return line * (megabytes * 1024 * 1024 // len(line) + 1)


def receipt_body(seed: str, megabytes: int) -> bytes:
    """The receipt as the worker serializes it before deciding where it goes."""
    return json.dumps({"log": bulk_log(seed, megabytes)}, sort_keys=True).encode()


async def read(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
    return ToolResult(f"log-{args['seed']}", {"log": bulk_log(args["seed"], args["megabytes"])})


class Bulky:
    kind = "bulky"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        record = state.action("fetch")
        if record is None:
            return CallTool(tool="bulk.read", args=freeze({k: state.goal[k] for k in ("seed", "megabytes")}),
                            logical_action="fetch")
        if record.status is ActionStatus.CONFIRMED:
            return Complete(evidence=freeze({"log": record.receipt_ref}))
        return Fail(reason=f"fetch ended {record.status.value}: {record.detail}")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if state.fact(RECEIPT_FACT_PREFIX + "fetch") is not None else ("no receipt for fetch",)


def kinds(settings: Settings) -> list[RunKind]:
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="bulky-1")
    tool = Tool("bulk.read", "1", EffectKind.READ, BulkArgs, read)
    return [RunKind("bulky", versions, Bulky(), {tool.name: tool})]
