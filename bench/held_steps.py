"""``held_steps``: the benchmark's ``steps``, each step's pure call held ``CALL_SECONDS``, so a worker
killed at any moment kills calls in flight (``bench.recovery``'s mid-call row). Loaded by the
services of that row only (``LONGRUN_RUN_KINDS=bench.held_steps:HELD_STEPS``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.domain import EffectKind, PinnedVersions
from longrun.workflows import steps

KIND = "held_steps"
CALL_SECONDS = 0.2


async def _held_echo(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    await asyncio.sleep(CALL_SECONDS)
    return ToolResult(idempotency_key, {"step": args["step"]})


class HeldSteps(steps.Steps):
    kind = KIND


HELD_ECHO = Tool(steps.ECHO.name, "1", EffectKind.PURE, steps.EchoArgs, _held_echo)
HELD_STEPS = RunKind(KIND, PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="bench-v1"),
                     HeldSteps(), {HELD_ECHO.name: HELD_ECHO}, input_schema=steps.StepsInput)
