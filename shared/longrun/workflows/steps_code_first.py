"""``steps_code_first``: the benchmark's ``steps`` written code-first, the same K echo calls through the
ledger (logical actions ``<i>:bench.echo``), so the bench compares what replaying a function costs with
what ``decide`` costs on one workload. Its services load it by name:
``LONGRUN_RUN_KINDS=longrun.workflows:builtin,longrun.workflows.steps_code_first:STEPS_CODE_FIRST``."""

from __future__ import annotations

from pydantic import BaseModel

from longrun.authoring import RunKind
from longrun.codefirst.context import Context
from longrun.codefirst.kind import workflow
from longrun.workflows import STEPS_VERSIONS
from longrun.workflows.steps import ECHO, StepsInput

KIND = "steps_code_first"


class StepsDone(BaseModel):
    steps: int


@workflow(KIND, input=StepsInput, output=StepsDone)
async def steps_code_first(value: StepsInput, ctx: Context) -> StepsDone:
    for i in range(value.steps):
        await ctx.call_tool(ECHO.name, {"step": i})
    return StepsDone(steps=value.steps)


STEPS_CODE_FIRST = RunKind(KIND, STEPS_VERSIONS, steps_code_first, {ECHO.name: ECHO}, input_schema=StepsInput)
