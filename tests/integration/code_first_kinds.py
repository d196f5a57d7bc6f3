"""Code-first run kinds for the tests, loaded by the kit and by the real services
(``LONGRUN_RUN_KINDS=tests.integration.code_first_kinds:kinds``). ``tour`` awaits every kind of decision:
a tool call, the model, a webhook event, parallel calls, a question, a signal, a durable timer, a child
run, an approval bound to the exact request, and the gated write."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.author import (
    Child,
    Context,
    EffectKind,
    PinnedVersions,
    RunKind,
    Tool,
    ToolResult,
    request_hash,
    workflow,
)
from longrun.config import Settings
from longrun.workflows import STEPS_VERSIONS, steps

VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="scripted", tool_schemas="tour-v1")
PROVIDER = "forge"
ANSWER_SCHEMA = {"type": "object", "required": ["module"], "properties": {"module": {"type": "string"}}}
WAIT = 3600.0


class TextArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


async def _echo(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    return ToolResult(idempotency_key, {"text": args["text"]})


async def _publish(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    return ToolResult(f"pub-{idempotency_key[:8]}", {"id": f"pub-{idempotency_key[:8]}", "text": args["text"]})


async def _find(idempotency_key: str) -> ToolResult | None:
    return None


ECHO = Tool("tour.echo", "1", EffectKind.PURE, TextArgs, _echo)
PUBLISH = Tool("tour.publish", "1", EffectKind.NON_IDEMPOTENT_WRITE, TextArgs, _publish, lookup=_find)
TOOLS = {ECHO.name: ECHO, PUBLISH.name: PUBLISH}


class TourInput(BaseModel):
    name: str
    child: bool = True
    event: bool = True
    """Wait for a CI webhook (the kit sends it; the services' test leaves it out)."""
    pause: float = 60.0


class TourOutput(BaseModel):
    greeting: str
    plan: str
    ci: str
    parallel: list[str]
    module: str
    signal: Any
    children: list[str]
    published: str
    started_at: float
    token: str


def publish_args(name: str) -> dict[str, str]:
    return {"text": f"release of {name}"}


@workflow("tour", input=TourInput, output=TourOutput)
async def tour(value: TourInput, ctx: Context) -> TourOutput:
    return await touring(value, ctx)


async def touring(value: TourInput, ctx: Context, salutation: str = "hello") -> TourOutput:
    """The tour; a test changes its ``salutation`` to change its first call's arguments."""
    started_at, token = ctx.now(), ctx.uuid()
    greeting = await ctx.call_tool(ECHO.name, {"text": f"{salutation} {value.name}"}, name="greet")
    plan = await ctx.ask_model("plan")
    ci = {"status": "skipped"}
    if value.event:
        ci = await ctx.wait_event("ci", f"ci/{value.name}", fact=f"ci_result:{value.name}", timeout=WAIT,
                                  provider=PROVIDER)
    parallel = await ctx.call_tools([ctx.call_tool(ECHO.name, {"text": "a"}), ctx.call_tool(ECHO.name, {"text": "b"})])
    answer = await ctx.ask("module", "Which module?", answer_schema=ANSWER_SCHEMA, timeout=WAIT)
    signal = await ctx.wait_signal("go", timeout=WAIT)
    await ctx.sleep(value.pause)
    started: list[str] = []
    if value.child:
        started = await ctx.start_children([Child(name="kid", kind=steps.KIND, input={"steps": 1})])
        await ctx.wait_children(["kid"], timeout=WAIT)
    args = publish_args(value.name)
    decided = await ctx.approval("publish", owner="alice", approved_hash=request_hash(PUBLISH.name, PUBLISH.version,
                                                                                      args=args),
                                 summary=f"publish {value.name}", timeout=WAIT)
    if not decided["approved"]:
        raise PermissionError(f"publishing denied by {decided['decided_by']}")
    published = await ctx.call_tool(PUBLISH.name, args, name="publish", approval_id="publish")
    return TourOutput(greeting=greeting["text"], plan=plan["action"], ci=ci["status"],
                      parallel=[r["text"] for r in parallel], module=answer["module"], signal=signal,
                      children=started, published=published["id"], started_at=started_at, token=token)


MODEL_SCRIPT = {"plan": [{"action": "publish", "rationale": "ship it", "args": {}}]}
SIGNALS = {"go": {"type": "object"}}


def tour_kind(workflow_: Any = tour, versions: PinnedVersions = VERSIONS) -> RunKind:
    return RunKind("tour", versions, workflow_, TOOLS, lambda state, purpose: ("publish",), input_schema=TourInput,
                   model_script=MODEL_SCRIPT, signals=SIGNALS)


def steps_kind() -> RunKind:
    return RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO},
                   input_schema=steps.StepsInput)


def kinds(settings: Settings) -> list[RunKind]:
    return [tour_kind(), steps_kind()]
