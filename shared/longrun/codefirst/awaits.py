"""What a code-first function awaits: one request per decision type, each an awaitable that hands
itself to the replay driver (``driver.drive``) and receives what the history recorded for it.

Each request says how the history resolves it (``resolve``: its result, an error to raise at the
await, or ``PENDING``) and, when the history holds nothing for it yet, which decision asks the engine
for it (``decision``). The awaitables work through any chain of plain ``await`` (e.g. inside a
third-party agent loop): they yield themselves, and only the driver answers them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from longrun.codefirst.journal import PENDING, RECEIPTED, Journal, ReplayDiverged, Thrown
from longrun.domain import (
    ActionStatus,
    AskModel,
    AskUser,
    CallTool,
    CallTools,
    Child,
    Decision,
    FrozenMap,
    ScheduleRetry,
    StartChildren,
    WaitForChildren,
    WaitForEvent,
    WaitForSignal,
    WaitForUser,
    WakeReason,
    freeze,
    request_hash,
    thaw,
)
from longrun.domain import children, joins, signals

_request = dataclass(frozen=True, slots=True, kw_only=True)


class ApprovalVoided(Exception):
    """An outside change (the event ``invalidated_by`` names) voided the approval asked for: raised at the
    approval's await with the fact that event recorded (``fact``), so the code decides what to ask now."""

    def __init__(self, approval_id: str, fact: Any) -> None:
        self.approval_id, self.fact = approval_id, fact
        super().__init__(f"approval {approval_id} was voided by {fact!r}")


class ToolFailed(Exception):
    """The far side refused the call (the ledger's FAILED): raised at the call's await."""

    def __init__(self, tool: str, logical_action: str, detail: str | None) -> None:
        self.tool, self.logical_action, self.detail = tool, logical_action, detail
        super().__init__(f"{tool} ({logical_action}) failed: {detail or 'no detail'}")


class WaitTimedOut(Exception):
    """Nothing ended the wait before its timeout: raised at the wait's await."""


class Request:
    """An await of a code-first function: yielded to the driver, answered from the history."""

    __slots__ = ()
    mark_kind: ClassVar[str] = ""
    """What an await that is not a tool call is marked as once it resolved (``Journal.record_mark``)."""

    def mark_data(self) -> str:
        """What identifies this await in its mark (the purpose, the fact, the approval...)."""
        return ""

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield self)

    def resolve(self, journal: Journal, index: int) -> Any:
        """The recorded result of this await at ``index``, a ``Thrown`` error, or ``PENDING``."""
        raise NotImplementedError

    def decision(self, index: int, now: float) -> Decision:
        """What asks the engine for this await's result, ``now`` being the live clock."""
        raise NotImplementedError

    def parked(self, journal: Journal, index: int) -> None:
        """The replay stops at this await, which the history holds no result for."""

    def describe(self) -> str:
        raise NotImplementedError


def _no_call_at(journal: Journal, index: int, asked: Request) -> None:
    """Await ``index`` is not a tool call, and what the history marked there (if anything) is this await."""
    mark = journal.mark(index)
    if index in journal.calls or (mark is not None and mark[0] not in ("timeout", "voided") and (
            mark[0] != asked.mark_kind or (asked.mark_data() and mark[1] != asked.mark_data()))):
        raise ReplayDiverged(index, asked.describe(), journal.held(index))


def _timed_out(journal: Journal, index: int, what: str) -> Thrown | None:
    """The wait at ``index`` timed out: marked so, or its deadline's wake is the run's last wake."""
    mark = journal.mark(index)
    if mark is None and journal.woke(index) is WakeReason.DEADLINE:
        journal.record_mark(index, "timeout", repr(journal.clock))
        mark = journal.mark(index)
    if mark is not None and mark[0] == "timeout":
        journal.clock = max(journal.clock, float(mark[1]))
        return Thrown(WaitTimedOut(f"{what} timed out"))
    return None


@_request
class ToolCall(Request):
    tool: str
    args: FrozenMap
    name: str | None = None
    """What the call is for, unique in the run: its logical action (its idempotency key derives from it).
    None: ``<await index>:<tool>``."""
    approval_id: str | None = None
    raises: bool = False
    """A call the far side refused (FAILED): True, ``ToolFailed`` is raised at the await; False, the run
    goes to NEEDS_ATTENTION, where an operator may retry the action (as a decide-style kind asking again)."""

    def logical_action(self, index: int | str) -> str:
        return self.name if self.name and isinstance(index, int) else f"{index}:{self.name or self.tool}"

    def describe(self) -> str:
        return f"a call of {self.tool!r} (logical action name {self.name or self.tool!r}) with {dict(self.args)!r}"

    def check(self, journal: Journal, index: int, record: Any, logical_action: str) -> None:
        if (record.logical_action != logical_action or record.tool != self.tool
                or record.request_hash != request_hash(record.tool, record.tool_version, args=self.args)):
            raise ReplayDiverged(index, self.describe(), journal.held(index))

    def outcome(self, journal: Journal, record: Any, *, raises: bool) -> Any:
        if record.status in RECEIPTED:
            return journal.fact(f"receipt:{record.logical_action}")
        if record.status is ActionStatus.FAILED and raises:
            return Thrown(ToolFailed(self.tool, record.logical_action, record.detail))
        return PENDING

    def resolve(self, journal: Journal, index: int) -> Any:
        if self.name:
            return self._resolve_named(journal, index)
        records = journal.calls.get(index)
        if not records:
            _no_mark_at(journal, index, self)
            return PENDING
        if len(records) != 1:
            raise ReplayDiverged(index, self.describe(), journal.held(index))
        self.check(journal, index, records[0], self.logical_action(index))
        return self.outcome(journal, records[0], raises=self.raises)

    def _resolve_named(self, journal: Journal, index: int) -> Any:
        """A named call is placed by its mark (``call:<name>``, written with the call's decision)."""
        mark, record = journal.mark(index), journal.actions.get(self.name or "")
        if index in journal.calls or (mark is not None and mark != ("call", self.name)) or (
                mark is None and record is not None):
            raise ReplayDiverged(index, self.describe(), journal.held(index) if mark or index in journal.calls
                                 else f"a call named {self.name!r} made at another await")
        if record is None:
            return PENDING
        self.check(journal, index, record, self.logical_action(index))
        return self.outcome(journal, record, raises=self.raises)

    def parked(self, journal: Journal, index: int) -> None:
        if self.name and journal.mark(index) is None:
            journal.record_mark(index, "call", self.name)

    def decision(self, index: int, now: float) -> Decision:
        return self.call(self.logical_action(index))

    def call(self, logical_action: str) -> CallTool:
        return CallTool(tool=self.tool, args=self.args, logical_action=logical_action, approval_id=self.approval_id)


def _no_mark_at(journal: Journal, index: int, asked: Request) -> None:
    if journal.mark(index) is not None:
        raise ReplayDiverged(index, asked.describe(), journal.held(index))


@_request
class ToolCalls(Request):
    """Several calls at once (``CallTools``); the result lists each call's receipt, its ``ToolFailed``,
    or None for a call that had no outcome when the join was satisfied."""

    calls: tuple[ToolCall, ...]
    join: joins.Join = joins.ALL

    def describe(self) -> str:
        return "parallel calls of " + ", ".join(repr(c.tool) for c in self.calls)

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_mark_at(journal, index, self)
        records = {r.logical_action: r for r in journal.calls.get(index, ())}
        expected = {c.logical_action(f"{index}.{k}"): c for k, c in enumerate(self.calls)}
        for logical_action, record in records.items():
            call = expected.get(logical_action)
            if call is None:
                raise ReplayDiverged(index, self.describe(), journal.held(index))
            call.check(journal, index, record, logical_action)
        if journal.facts.get(f"{joins.JOINED_FACT_PREFIX}{index}:join") is None:
            return PENDING
        results = []
        for logical_action, call in expected.items():
            outcome = (call.outcome(journal, records[logical_action], raises=True) if logical_action in records
                       else PENDING)
            results.append(outcome.error if isinstance(outcome, Thrown) else None if outcome is PENDING else outcome)
        return results

    def decision(self, index: int, now: float) -> Decision:
        return CallTools(calls=tuple(c.call(c.logical_action(f"{index}.{k}")) for k, c in enumerate(self.calls)),
                         join=self.join, name=f"{index}:join")


@_request
class ModelAsk(Request):
    purpose: str
    payload: FrozenMap | None = None
    mark_kind: ClassVar[str] = "model"

    def mark_data(self) -> str:
        """The purpose, and a digest of the payload: a replay asking with other messages diverges."""
        if self.payload is None:
            return self.purpose
        digest = hashlib.sha256(json.dumps(thaw(self.payload), sort_keys=True).encode()).hexdigest()[:16]
        return f"{self.purpose}#{digest}"

    def describe(self) -> str:
        return f"the model, for purpose {self.purpose!r}" + ("" if self.payload is None else " with a payload")

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        proposal = journal.ask_model(self.purpose)
        return PENDING if proposal is None else proposal

    def decision(self, index: int, now: float) -> Decision:
        return AskModel(purpose=self.purpose, payload=self.payload)


@_request
class EventWait(Request):
    kind: str
    correlation_key: str
    fact: str
    """The fact the event is recorded as (its webhook provider's translation names it)."""
    timeout: float
    provider: str | None = None
    mark_kind: ClassVar[str] = "event"

    def mark_data(self) -> str:
        return self.fact

    def describe(self) -> str:
        return f"an event {self.kind!r} keyed {self.correlation_key!r} (fact {self.fact!r})"

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        value = journal.fact(self.fact)
        if value is not None:
            return value
        return _timed_out(journal, index, self.describe()) or PENDING

    def decision(self, index: int, now: float) -> Decision:
        return WaitForEvent(kind=self.kind, correlation_key=self.correlation_key, deadline=now + self.timeout,
                            provider=self.provider)


@_request
class ApprovalWait(Request):
    """A person's decision on the exact request hashed ``approved_hash``; its result is the decision
    (``approved``, ``decided_by``, ``approved_hash``)."""

    approval_id: str
    owner: str
    approved_hash: str
    summary: str
    timeout: float
    invalidated_by: str | None = None
    invalidated_fact: str | None = None
    """The fact the event ``invalidated_by`` names records: ``ApprovalVoided`` carries its value."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """``WaitForUser``'s other fields (provider, remind_after, escalate_after, valid_for...)."""
    mark_kind: ClassVar[str] = "approval"

    def mark_data(self) -> str:
        return self.approval_id

    def describe(self) -> str:
        return f"approval {self.approval_id!r} of request hash {self.approved_hash[:12]}"

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        decided = journal.fact(f"approval.{self.approval_id}")
        if decided is not None and decided.get("approved_hash") == self.approved_hash:
            return decided
        mark = journal.mark(index)
        if mark is None and journal.woke(index) is WakeReason.EVENT:
            voided = journal.fact(self.invalidated_fact) if self.invalidated_fact else None
            journal.record_mark(index, "voided", json.dumps(voided, sort_keys=True, separators=(",", ":")))
            mark = journal.mark(index)
        if mark is not None and mark[0] == "voided":
            return Thrown(ApprovalVoided(self.approval_id, json.loads(mark[1])))
        return _timed_out(journal, index, self.describe()) or PENDING

    def decision(self, index: int, now: float) -> Decision:
        return WaitForUser(approval_id=self.approval_id, owner=self.owner, deadline=now + self.timeout,
                           approved_hash=self.approved_hash, summary=self.summary,
                           invalidated_by=self.invalidated_by, **self.options)


@_request
class QuestionWait(Request):
    question_id: str
    text: str
    answer_schema: FrozenMap
    timeout: float
    owner: str | None = None
    mark_kind: ClassVar[str] = "question"

    def mark_data(self) -> str:
        return self.question_id

    def describe(self) -> str:
        return f"the answer to question {self.question_id!r}"

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        answer = journal.facts.get(f"answer:{self.question_id}")
        if answer is not None:
            return journal.fact(answer.key)
        return _timed_out(journal, index, self.describe()) or PENDING

    def decision(self, index: int, now: float) -> Decision:
        return AskUser(question_id=self.question_id, text=self.text, answer_schema=self.answer_schema,
                       deadline=now + self.timeout, owner=self.owner)


@_request
class SignalWait(Request):
    name: str
    timeout: float
    mark_kind: ClassVar[str] = "signal"

    def describe(self) -> str:
        return f"a signal {self.name!r}"

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        mark = journal.mark(index)
        if mark is None and journal.woke(index) is WakeReason.SIGNAL:
            received = signals.woken_by(journal.state)
            if received is None:
                return PENDING
            journal.record_mark(index, "signal", received.signal_id)
            mark = journal.mark(index)
        if mark is not None and mark[0] == "signal":
            return (journal.fact(f"signal:{mark[1]}") or {}).get("payload")
        return _timed_out(journal, index, self.describe()) or PENDING

    def decision(self, index: int, now: float) -> Decision:
        return WaitForSignal(name=self.name, deadline=now + self.timeout)


@_request
class Sleep(Request):
    seconds: float
    mark_kind: ClassVar[str] = "timer"

    def describe(self) -> str:
        return f"a timer of {self.seconds}s"

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        mark = journal.mark(index)
        if mark is None and journal.woke(index) is WakeReason.TIMER:
            journal.record_mark(index, "timer", repr(journal.clock))
            mark = journal.mark(index)
        if mark is None or mark[0] != "timer":
            return PENDING
        journal.clock = max(journal.clock, float(mark[1]))
        return None

    def decision(self, index: int, now: float) -> Decision:
        return ScheduleRetry(logical_action=f"{index}:sleep", delay=self.seconds)


@_request
class ChildrenStart(Request):
    children: tuple[Child, ...]
    mark_kind: ClassVar[str] = "children_started"

    def mark_data(self) -> str:
        return ",".join(c.name for c in self.children)

    def describe(self) -> str:
        return "children " + ", ".join(f"{c.name!r} ({c.kind})" for c in self.children)

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        started = [journal.fact(children.fact_key(c.name)) for c in self.children]
        if any(value is None for value in started):
            return PENDING
        return [value["run_id"] for value in started]

    def decision(self, index: int, now: float) -> Decision:
        return StartChildren(children=self.children)


@_request
class ChildrenWait(Request):
    names: tuple[str, ...]
    timeout: float
    until: str | int = "all"
    mark_kind: ClassVar[str] = "children"

    def mark_data(self) -> str:
        return ",".join(self.names)

    def describe(self) -> str:
        return f"{self.until} of children {', '.join(self.names)}"

    def resolve(self, journal: Journal, index: int) -> Any:
        _no_call_at(journal, index, self)
        if children.satisfied(journal.state, self.names, children.needed(self.names, self.until)):
            return {name: children.outcome(journal.state, name) for name in self.names}
        return _timed_out(journal, index, self.describe()) or PENDING

    def decision(self, index: int, now: float) -> Decision:
        return WaitForChildren(names=self.names, deadline=now + self.timeout, until=self.until)


WAITS = (EventWait, ApprovalWait, QuestionWait, SignalWait, Sleep, ChildrenWait)
"""Awaits that park the run: the wait they start is named after their index (``WAIT_ID_PREFIX``)."""
