"""A run kind that fans out writes and joins them, loaded by the real services (``LONGRUN_RUN_KINDS=
tests.integration.join_kinds:kinds``) and by the kit (``FANNED``, whose tools the kit sends to its own far side).

``fanned`` makes ``goal.calls`` writes at once (``CallTools`` named ``writes``: ``put:0``, ``put:1``...,
of ``far.put``, an idempotent write, or with ``goal.tool`` ``far.send``, a non-idempotent one whose far
side answers lookups, or ``far.read``, a read), joined on ``goal.join``: ``all`` (the default), ``first`` or a number. Once
joined it waits for the signal ``go`` if ``goal.then_wait`` is set, makes one more write (``next``,
of ``far.put``) if ``goal.then_call`` is set, then completes with which calls satisfied the join and
each call's status as evidence.

The far side of the real services is a file (``JOIN_FAR_SIDE``), written under a lock: each request
appends ``start`` (its key and fencing token), is held ``JOIN_HOLD_SECONDS`` (in flight; item i
``JOIN_STAGGER_SECONDS`` times i longer), then, unless
a request with a higher token for its key started meanwhile (``fenced``: refused, nothing done),
appends ``effect`` the first time its key is written (a write asked again under its key returns the
object it made) and ``end``. A request whose token is below one already seen for its key is refused
at once (``fenced``). ``far_side_log`` reads it back.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.config import Settings
from longrun.domain import (
    FIRST,
    CallTool,
    CallTools,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    Join,
    PinnedVersions,
    RunSnapshot,
    WaitForSignal,
    at_least,
    freeze,
    joins,
    received_signals,
    thaw,
)
from longrun.errors import ToolRejected

PUT, SEND, READ = "far.put", "far.send", "far.read"
JOIN = "writes"
NEXT = "next"
FAR_SIDE, HOLD, STAGGER = "JOIN_FAR_SIDE", "JOIN_HOLD_SECONDS", "JOIN_STAGGER_SECONDS"


class ItemArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: int


def fan(state: RunSnapshot) -> CallTools:
    goal = thaw(state.goal)
    assert isinstance(goal, dict)
    join = goal.get("join", "all")
    tool = goal.get("tool", PUT)
    calls = [CallTool(tool=tool, args=freeze({"item": i}), logical_action=f"put:{i}")
             for i in range(int(goal.get("calls", 3)))]
    return CallTools(calls=calls, join=_join(join), name=JOIN)


def _join(join: object) -> Join:
    if join == "all":
        return joins.ALL
    return FIRST if join == "first" else at_least(int(join))  # type: ignore[call-overload]


class Fanned:
    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        joined = joins.joined(state, JOIN)
        if joined is None:
            return fan(state)
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        if goal.get("then_wait") and not received_signals(state, "go"):
            return WaitForSignal(name="go", deadline=ctx.now + 3600)
        if goal.get("then_call") and joins.to_make(state, (NEXT,)):
            return CallTool(tool=PUT, args=freeze({"item": 0}), logical_action=NEXT)
        statuses = {c: state.action(c).status.value for c in joined.calls}  # type: ignore[union-attr]
        return Complete(evidence=freeze({"by": list(joined.by), "statuses": statuses}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if joins.joined(state, JOIN) is not None else ("the writes were not joined",)


class _Log(list):  # type: ignore[type-arg]
    """The far side's log as read; what is appended is written back under the same lock."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        super().__init__(lines)
        self.added: list[dict[str, Any]] = []

    def append(self, line: dict[str, Any]) -> None:
        super().append(line)
        self.added.append(line)


@contextmanager
def _locked(path: Path) -> Iterator[_Log]:
    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        log = _Log([json.loads(line) for line in f if line.strip()])
        yield log
        f.write("".join(json.dumps(line) + "\n" for line in log.added))
        f.flush()


def far_side_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _put(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
    path = Path(os.environ[FAR_SIDE])
    hold = float(os.environ.get(HOLD, "1")) + args["item"] * float(os.environ.get(STAGGER, "0"))

    def note(log: list[dict[str, Any]], edge: str) -> None:
        log.append({"edge": edge, "key": key, "token": token, "at": time.time()})

    def fenced(log: list[dict[str, Any]]) -> bool:
        return any(line["key"] == key and line["token"] > token for line in log if line["edge"] == "start")

    with _locked(path) as log:
        stale = fenced(log)
        note(log, "fenced" if stale else "start")
    if stale:
        raise ToolRejected(PUT, 409, f"fencing token {token} is stale for {key}")
    await asyncio.sleep(hold)
    with _locked(path) as log:
        stale = fenced(log)
        if not stale and not any(line["key"] == key and line["edge"] == "effect" for line in log):
            note(log, "effect")
        note(log, "fenced" if stale else "end")
    if stale:
        raise ToolRejected(PUT, 409, f"fencing token {token} is stale for {key}")
    return ToolResult(f"put:{key}", {"item": args["item"], "key": key})


async def _look_up(key: str) -> ToolResult | None:
    log = far_side_log(Path(os.environ[FAR_SIDE]))
    return ToolResult(f"put:{key}", {"key": key}) if any(
        line["key"] == key and line["edge"] == "effect" for line in log) else None


VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="join-1")
FANNED = RunKind("fanned", VERSIONS, Fanned(), tools={
    PUT: Tool(PUT, "1", EffectKind.IDEMPOTENT_WRITE, ItemArgs, _put, start_to_close=60.0),
    SEND: Tool(SEND, "1", EffectKind.NON_IDEMPOTENT_WRITE, ItemArgs, _put, _look_up, start_to_close=60.0),
    READ: Tool(READ, "1", EffectKind.READ, ItemArgs, _put, start_to_close=60.0)},
    signals={"go": {"type": "object"}})


def kinds(settings: Settings) -> list[RunKind]:
    return [FANNED]
