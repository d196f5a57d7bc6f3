"""The run kinds the tests' services load: ``LONGRUN_RUN_KINDS``' default (the benchmark's ``steps``)
and the installed example's ``dependency_upgrade`` (its entry point); and the test-only kinds a test
names to its services (``LONGRUN_RUN_KINDS=tests.kinds:ASKING``, ``tests.kinds:long_call``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun import run_kinds
from longrun.authoring import Registry, RunKind, Tool, ToolResult, heartbeat
from longrun.config import Settings
from longrun.domain import (
    ANSWER_FACT_PREFIX,
    APPROVAL_FACT_PREFIX,
    RECEIPT_FACT_PREFIX,
    ActionStatus,
    AskUser,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    RetryPolicy,
    RunSnapshot,
    ScheduleRetry,
    WaitForUser,
    WakeReason,
    freeze,
    request_hash,
    thaw,
)


def registry(settings: Settings | None = None) -> Registry:
    return run_kinds.load(settings or Settings.from_env({}))


MODULE_SCHEMA = FrozenMap({"type": "object", "required": ["module"], "additionalProperties": False,
                           "properties": {"module": {"type": "string", "minLength": 1},
                                          "urgent": {"type": "boolean"}}})
"""What an answer to ``asking``'s question must look like."""
ANSWER = ANSWER_FACT_PREFIX + "module"


def attention(goal: Mapping[str, Any]) -> dict[str, Any]:
    """A wait's reminders and escalation as ``goal`` declares them (``remind_after``, a list of seconds;
    ``escalate_after`` seconds and ``escalate_to``)."""
    return {"remind_after": tuple(goal.get("remind_after", ())), "escalate_after": goal.get("escalate_after"),
            "escalate_to": goal.get("escalate_to")}


class Asking:
    """Asks a person which module its task is about (``goal.owner`` may answer; within
    ``goal.answer_within`` seconds, default an hour; reminded and escalated as ``attention`` reads),
    then completes with the answer as its evidence; unanswered by the deadline, it fails saying so."""

    kind = "asking"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        answer = state.fact(ANSWER)
        if answer is not None:
            return Complete(evidence=freeze({"answer": thaw(answer.value), "answered_by": answer.source}))
        if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
            return Fail(reason="nobody said which module before the question's deadline")
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        return AskUser(question_id="module", text=f"Which module is {goal['task']!r} about?",
                       answer_schema=MODULE_SCHEMA, deadline=ctx.now + float(goal.get("answer_within", 3600)),
                       owner=goal.get("owner"), **attention(goal))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        answer = state.fact(ANSWER)
        return () if answer is not None and evidence["answer"] == answer.value else ("the evidence is not the answer",)


ASKING = RunKind("asking", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none"),
                 Asking(), {})


LONG_START_TO_CLOSE = 6.0
LONG_HEARTBEAT_TIMEOUT = 2.0


class LongArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    branch: str
    beats: int
    every: float
    stall: str = ""
    """How the call misbehaves once, when the file ``stall_file`` exists (it is removed): ``silent``
    (stops heartbeating), ``overrun`` (heartbeats past start-to-close), ``ignore_cancel`` (a write:
    acts, then heartbeats past start-to-close refusing to be cancelled)."""
    stall_file: str = ""
    stall_seconds: float = 30.0


async def _beating(seconds: float, every: float, *, shielded: bool = False) -> None:
    """Heartbeat every ``every`` seconds for ``seconds``; ``shielded``: a cancel is swallowed."""
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        try:
            await asyncio.sleep(every)
        except asyncio.CancelledError:
            if not shielded:
                raise
        await heartbeat({"stalled": True})


def long_call(settings: Settings) -> RunKind:
    """A run that makes one long call, ``work``, heartbeating its progress (``{"done", "of"}``): a write
    (``goal.effect`` "write": a branch on the forge, counted there) or a read; then, given
    ``goal.rest``, waits that many seconds on a timer; then completes. The call misbehaves once as
    ``goal.stall`` says (``LongArgs``)."""
    from longrun_dependency_upgrade import forge_url
    from longrun_dependency_upgrade.forge_client import ForgeClient

    forge = ForgeClient(forge_url())

    async def work(args: Mapping[str, Any], key: str, token: int, *, acts: bool) -> ToolResult:
        for done in range(1, args["beats"] + 1):
            await asyncio.sleep(args["every"])
            await heartbeat({"done": done, "of": args["beats"]})
        stall = ""
        if args["stall"] and os.path.exists(args["stall_file"]):
            Path(args["stall_file"]).unlink()
            stall = args["stall"]
        if stall == "silent":
            await asyncio.sleep(args["stall_seconds"])
        elif stall == "overrun":
            await _beating(args["stall_seconds"], args["every"])
        if not acts:
            return ToolResult(None, {"done": args["beats"]})
        made = await forge.create_branch(args["repo"], name=args["branch"], from_ref="main", idempotency_key=key,
                                         fencing_token=token)
        if stall == "ignore_cancel":
            await _beating(args["stall_seconds"], args["every"], shielded=True)
        return ToolResult(made["name"], {"name": made["name"]})

    async def write(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        return await work(args, key, token, acts=True)

    async def read(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        return await work(args, key, token, acts=False)

    async def lookup(key: str) -> ToolResult | None:
        found = await forge.lookup(key)
        return None if found is None else ToolResult(found["object"]["name"], found["object"])

    retry = RetryPolicy(initial_interval=0.5, maximum_interval=1, maximum_attempts=3, jitter=0)
    timeouts = {"start_to_close": LONG_START_TO_CLOSE, "heartbeat_timeout": LONG_HEARTBEAT_TIMEOUT}
    tools = {t.name: t for t in (
        Tool("long.write", "1", EffectKind.IDEMPOTENT_WRITE, LongArgs, write, lookup, retry=retry, **timeouts),
        Tool("long.read", "1", EffectKind.READ, LongArgs, read, retry=retry, **timeouts))}
    return RunKind("long_call", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="1"),
                   LongCall(), tools)


class LongCall:
    kind = "long_call"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        record = state.action("work")
        goal = dict(thaw(state.goal))  # type: ignore[call-overload]
        if record is not None and record.status is ActionStatus.CONFIRMED:
            if goal.get("rest") and state.last_wake is None:
                return ScheduleRetry(logical_action="rest", delay=float(goal["rest"]))
            return Complete(evidence=freeze({"work": record.external_id}))
        if record is not None and record.status is ActionStatus.FAILED:
            return Fail(reason=f"work failed: {record.detail}")
        tool = "long.write" if goal.pop("effect", "write") == "write" else "long.read"
        goal.pop("rest", None)
        return CallTool(tool=tool, args=freeze(goal), logical_action="work")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if state.fact(RECEIPT_FACT_PREFIX + "work") is not None else ("no receipt for work",)


class HeldArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    branch: str
    hold_file: str = ""
    hold: float = 0.0
    acts_first: bool = True


def held_call(settings: Settings) -> RunKind:
    """A run of two steps that each make a call: ``call``, a write (a branch on the forge, counted
    there; the forge refuses a stale fencing token) or a pure call, as ``goal.effect`` says; then
    ``next``, a write of the branch ``<goal.branch>-next``; then it completes. ``call`` holds
    ``goal.hold`` seconds once, while the file ``goal.hold_file`` exists (it is removed as the hold
    starts): a write holds after it acted (``goal.acts_first``, the default) or before."""
    from longrun_dependency_upgrade import forge_url
    from longrun_dependency_upgrade.forge_client import ForgeClient

    forge = ForgeClient(forge_url())

    async def hold_once(args: Mapping[str, Any]) -> None:
        if args["hold_file"] and os.path.exists(args["hold_file"]):
            Path(args["hold_file"]).unlink()
            await asyncio.sleep(args["hold"])

    async def branch(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        made = await forge.create_branch(args["repo"], name=args["branch"], from_ref="main", idempotency_key=key,
                                         fencing_token=token)
        return ToolResult(made["name"], {"name": made["name"]})

    async def write(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        if not args["acts_first"]:
            await hold_once(args)
        made = await branch(args, key, token)
        if args["acts_first"]:
            await hold_once(args)
        return made

    async def pure(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        await hold_once(args)
        return ToolResult(None, {"branch": args["branch"]})

    async def lookup(key: str) -> ToolResult | None:
        found = await forge.lookup(key)
        return None if found is None else ToolResult(found["object"]["name"], found["object"])

    tools = {t.name: t for t in (
        # Never blind-retried: a successor that finds it SUBMITTED has the reconciler look it up.
        Tool("held.write", "1", EffectKind.NON_IDEMPOTENT_WRITE, HeldArgs, write, lookup),
        Tool("held.pure", "1", EffectKind.PURE, HeldArgs, pure),
        Tool("held.next", "1", EffectKind.NON_IDEMPOTENT_WRITE, HeldArgs, branch, lookup))}
    return RunKind("held_call", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="1"),
                   HeldCall(), tools)


class HeldCall:
    kind = "held_call"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = dict(thaw(state.goal))  # type: ignore[call-overload]
        for name in ("call", "next"):
            record = state.action(name)
            if record is not None and record.status is ActionStatus.FAILED:
                return Fail(reason=f"{name} failed: {record.detail}")
        call, following = state.action("call"), state.action("next")
        if following is not None and following.status is ActionStatus.CONFIRMED:
            return Complete(evidence=freeze({"next": following.external_id}))
        args = {"repo": goal["repo"], "branch": goal["branch"]}
        if call is not None and call.status is ActionStatus.CONFIRMED:
            return CallTool(tool="held.next", args=freeze({**args, "branch": f"{goal['branch']}-next"}),
                            logical_action="next")
        tool = "held.write" if goal["effect"] == "write" else "held.pure"
        return CallTool(tool=tool, args=freeze({**args, "hold_file": goal.get("hold_file", ""),
                                                "hold": goal.get("hold", 0.0),
                                                "acts_first": goal.get("acts_first", True)}),
                        logical_action="call")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if state.fact(RECEIPT_FACT_PREFIX + "next") is not None else ("no receipt for next",)


class ReleaseArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    release: str


async def _publish(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
    return ToolResult(f"published:{idempotency_key}", {"release": args["release"]})


PUBLISH_TOOL = "release.publish"


class Publishing:
    """Publishes ``goal.release`` once a person approves exactly that request (``goal.owner``; reminded
    and escalated as ``attention`` reads; within ``goal.decide_within`` seconds), in its maintenance
    window (from ``goal.window_at``, epoch seconds; none: at once). The decision is valid for
    ``goal.valid_for`` seconds (none: for ever): one that expired before the window opened is asked
    again. Denied, or undecided by the deadline, it fails."""

    kind = "publishing"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = dict(thaw(state.goal))  # type: ignore[call-overload]
        receipt = state.fact(RECEIPT_FACT_PREFIX + "publish")
        if receipt is not None:
            return Complete(evidence=freeze({"published": thaw(receipt.value)}))
        args = freeze({"release": goal["release"]})
        decision = state.fact(APPROVAL_FACT_PREFIX + "publish")
        if decision is None:
            if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
                return Fail(reason="nobody decided on publishing before the deadline")
            return WaitForUser(approval_id="publish", owner=goal["owner"],
                               deadline=ctx.now + float(goal.get("decide_within", 3600)),
                               approved_hash=request_hash(PUBLISH_TOOL, "1", args=args),
                               summary=f"Publish release {goal['release']}", valid_for=goal.get("valid_for"),
                               **attention(goal))
        value = thaw(decision.value)
        assert isinstance(value, dict)
        if not value["approved"]:
            return Fail(reason=f"publishing was denied by {value['decided_by']}")
        window = goal.get("window_at")
        if window is not None and ctx.now < window:
            return ScheduleRetry(logical_action="window", delay=float(window) - ctx.now)
        return CallTool(tool=PUBLISH_TOOL, args=args, logical_action="publish", approval_id="publish")

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if state.fact(RECEIPT_FACT_PREFIX + "publish") is not None else ("nothing was published",)


PUBLISHING = RunKind("publishing", PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="1"),
                     Publishing(), {PUBLISH_TOOL: Tool(PUBLISH_TOOL, "1", EffectKind.IDEMPOTENT_WRITE, ReleaseArgs,
                                                       _publish)})
"""``Publishing``: an approval with reminders, escalation and a validity
(``LONGRUN_RUN_KINDS=tests.kinds:PUBLISHING``)."""
