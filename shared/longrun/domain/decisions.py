"""Decisions: what a workflow's deterministic ``decide(state, ctx)`` may ask the runtime to do.

Responsibility: the vocabulary between workflow code and the runtime. ``decide`` returns
one of these values and never calls a port; the worker carries it out (through the action
ledger, the model adapter, the timer table) and records the resulting events.

Invariants:
- ``decide`` is pure: time, ids, randomness and patch points reach it only through
  ``DecisionContext``, so replaying a history under the same pinned versions reproduces its
  decisions. A patch point (``ctx.patched``) is taken live and recorded by the worker; a replay
  takes it only where the history recorded it, so old histories keep their old decisions.
- Every wait a decision asks for has a wake condition and a deadline by construction
  (``wait_for``); a retry waits on a timer whose deadline is its fire time, a question on
  its answer, a signal wait on a signal of its name.
- ``Complete`` carries evidence; the workflow's ``accept`` judges it deterministically,
  and only an empty list of unmet conditions lets the run complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from longrun.domain import joins
from longrun.domain.action import ActionStatus
from longrun.domain.budget import Usage
from longrun.domain.children import ParentCancel, needed, valid_name
from longrun.domain.codec import FrozenMap, freeze
from longrun.domain.retry import Rng
from longrun.domain.run import RunStatus
from longrun.domain.signals import signal_wait
from longrun.domain.snapshot import QUESTION_WAIT, RunSnapshot, Wait

_decision = dataclass(frozen=True, slots=True, kw_only=True)


@_decision
class CallTool:
    tool: str
    args: FrozenMap
    logical_action: str
    """The business intent; its idempotency key derives from it, not from this model turn."""
    approval_id: str | None = None
    """The approval this request needs; preparing it is refused unless that approval covers its exact hash."""


@_decision
class CallTools:
    """Several tool calls made at once, each its own ledger entry, idempotency key and effect kind. Once
    ``join`` is satisfied (all of them, ``joins.FIRST``, or ``joins.at_least(n)`` have an outcome),
    ``run.joined`` records which calls satisfied it (read it with ``joins.joined(state, name)``) and
    ``decide`` is asked again at once. Every call made runs to its outcome and is recorded, the losers
    of a first-or-N join too (as they answer), before the run completes. Tool calls only: a model call
    is ``AskModel``, on its own."""

    calls: tuple[CallTool, ...]
    join: joins.Join = joins.ALL
    name: str | None = None
    """Names the join in ``run.joined``; None: the calls' logical actions joined with ``+``."""

    def __post_init__(self) -> None:
        if not isinstance(self.calls, list | tuple) or not all(isinstance(c, CallTool) for c in self.calls):
            raise ValueError(f"CallTools.calls is a list or tuple of CallTool, got {self.calls!r}")
        object.__setattr__(self, "calls", tuple(self.calls))
        joins.check(self.logical_actions, self.join)
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"CallTools.name names the join, got {self.name!r}")

    @property
    def logical_actions(self) -> tuple[str, ...]:
        return tuple(c.logical_action for c in self.calls)

    @property
    def join_name(self) -> str:
        return self.name if self.name is not None else "+".join(self.logical_actions)


@_decision
class AskModel:
    purpose: str
    payload: FrozenMap | None = None
    """What the model is asked beside the run's resume context (sent as its ``request``), e.g. an agent
    framework's messages and tool definitions; None: the resume context alone."""

    def __post_init__(self) -> None:
        if self.payload is not None:
            object.__setattr__(self, "payload", freeze(self.payload))


@_decision
class WaitForEvent:
    kind: str
    correlation_key: str
    deadline: float
    provider: str | None = None
    """The webhook provider (``POST /webhooks/<provider>``) whose event with ``correlation_key`` ends
    the wait: another provider's event with the same key does not. None: no webhook ends it."""


@_decision
class WaitForUser:
    approval_id: str
    owner: str
    """Who may decide: a subject, ``role:<role>`` or ``group:<group>`` (``longrun.principals``)."""
    deadline: float
    approved_hash: str
    """Hash of the exact request being approved; use ``request_hash`` of the gated action."""
    summary: str
    invalidated_by: str | None = None
    """Correlation key of an outside change (e.g. a push to the branch) that voids this request:
    such an event ends the wait, so ``decide`` computes what to ask for now."""
    provider: str | None = None
    """The webhook provider whose event ``invalidated_by`` names."""
    remind_after: tuple[float, ...] = ()
    """Seconds after asking at which the owner is reminded (a ``run.notice`` of notice ``reminder`` each)."""
    escalate_after: float | None = None
    """Seconds after asking when ``escalate_to`` may also decide (a ``run.notice`` of notice ``escalated``)."""
    escalate_to: str | None = None
    """Who may also decide once escalated: a subject, ``role:<role>`` or ``group:<group>``."""
    valid_for: float | None = None
    """Seconds a decision stays valid: older than that when the run resumes, and not yet used by the
    call it gates, it expires (``run.approval_expired``) and ``decide`` finds no decision: ask again."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "remind_after", _delays(self.remind_after))
        _check_attention(self.remind_after, self.escalate_after, self.escalate_to)
        if self.valid_for is not None and not _positive(self.valid_for):
            raise ValueError(f"WaitForUser.valid_for must be a positive number of seconds, got {self.valid_for!r}")


@_decision
class AskUser:
    """Ask a person for information and wait for the answer: the operator API and ``longrunctl run
    answer`` take it, refuse one that breaks ``answer_schema``, and record the one that does not as
    the fact ``answer:<question_id>`` (``state.last_wake.reason`` is ANSWER). Unanswered by
    ``deadline``, the question closes and the run wakes with reason DEADLINE."""

    question_id: str
    """Names the question in the run; an id that was answered once cannot be asked again."""
    text: str
    answer_schema: FrozenMap
    """A JSON Schema (draft 2020-12); the worker refuses a schema that is not one."""
    deadline: float
    owner: str | None = None
    """Who may answer: a subject, ``role:<role>`` or ``group:<group>`` (``longrun.principals``); None
    lets anyone who may answer (an approver) answer."""
    remind_after: tuple[float, ...] = ()
    """Seconds after asking at which the owner is reminded (a ``run.notice`` of notice ``reminder`` each)."""
    escalate_after: float | None = None
    """Seconds after asking when ``escalate_to`` may also answer (a ``run.notice`` of notice ``escalated``)."""
    escalate_to: str | None = None
    """Who may also answer once escalated: a subject, ``role:<role>`` or ``group:<group>``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "remind_after", _delays(self.remind_after))
        _check_attention(self.remind_after, self.escalate_after, self.escalate_to)


def _delays(value: object) -> tuple[float, ...]:
    """Reminder delays as given (a list or a tuple), as the tuple a frozen decision holds."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValueError(f"remind_after must be a list or tuple of seconds, got {value!r}")
    return tuple(value)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _check_attention(remind_after: tuple[float, ...], escalate_after: float | None, escalate_to: str | None) -> None:
    """Reminders are positive delays; an escalation names both when and to whom. ValueError otherwise."""
    if not all(_positive(t) for t in remind_after):
        raise ValueError(f"remind_after must be positive numbers of seconds, got {remind_after!r}")
    if (escalate_after is None) != (escalate_to is None):
        raise ValueError("escalate_after and escalate_to go together: when, and who may then act too")
    if escalate_after is not None and not _positive(escalate_after):
        raise ValueError(f"escalate_after must be a positive number of seconds, got {escalate_after!r}")
    if escalate_to is not None and (not isinstance(escalate_to, str) or not escalate_to.strip()):
        raise ValueError("escalate_to must name a subject, role:<role> or group:<group>")


@_decision
class WaitForSignal:
    """Wait for a signal named ``name`` (one the run's kind declares in ``RunKind.signals``): the next
    one sent ends the wait (``state.last_wake.reason`` is SIGNAL; ``signals.woken_by(state)`` is it).
    Signals received before the wait do not end it: ``decide`` reads them first with
    ``signals.received(state, name)``. None by ``deadline``: the run wakes with reason DEADLINE."""

    name: str
    deadline: float


@_decision
class Child:
    """A child run to start: ``name`` keys it in its parent (``children.outcome(state, name)``) and makes
    starting it idempotent; ``kind`` and ``input`` are what a run.create would ask for."""

    name: str
    kind: str
    input: FrozenMap
    budget: Usage | None = None
    """What the child may spend, drawn from the parent's remaining (the least of the two per dimension);
    None: all the parent has left."""
    on_parent_cancel: ParentCancel = ParentCancel.CANCEL
    """Cancelling or terminating the parent cancels this child, or leaves it running (``abandon``)."""

    def __post_init__(self) -> None:
        if not valid_name(self.name):
            raise ValueError(f"a child's name is 1 to 100 of A-Z a-z 0-9 _ . -, got {self.name!r}")
        object.__setattr__(self, "input", freeze(self.input))
        object.__setattr__(self, "on_parent_cancel", ParentCancel(self.on_parent_cancel))


@_decision
class StartChildren:
    """Start ``children`` (runs of their own, created through admission with the step that records them:
    ``run.child_started`` each). A child of a name the run started before is refused."""

    children: tuple[Child, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", tuple(self.children))
        names = [c.name for c in self.children]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"StartChildren names one or more children, each once, got {names!r}")


@_decision
class WaitForChildren:
    """Wait, holding no tenant slot, until ``until`` of the children ``names`` have ended: "all", "any" or
    a count. ``decide`` reads each one's end with ``children.outcome(state, name)``; a wait that is
    satisfied already is not started (the run goes to NEEDS_ATTENTION). None by ``deadline``: the run
    wakes with reason DEADLINE."""

    names: tuple[str, ...]
    deadline: float
    until: str | int = "all"

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))
        needed(self.names, self.until)


@_decision
class ScheduleRetry:
    logical_action: str
    delay: float
    """Seconds, usually from ``next_delay``."""


@_decision
class Complete:
    evidence: FrozenMap


@_decision
class Fail:
    reason: str


@_decision
class Reconcile:
    logical_action: str


Decision: TypeAlias = (
    CallTool | CallTools | AskModel | WaitForEvent | WaitForUser | AskUser | WaitForSignal | ScheduleRetry | Complete | Fail
    | Reconcile | StartChildren | WaitForChildren
)


@dataclass(frozen=True, slots=True)
class DecisionContext:
    """Everything non-deterministic ``decide`` may use, passed in by the worker."""

    now: float
    """Epoch seconds, from the worker's clock port."""
    new_id: Callable[[], str]
    rng: Rng
    patches: frozenset[str] | None = None
    """The patches a replayed history had taken at this decision; None live, where every patch is taken."""
    taken: list[str] = field(default_factory=list, init=False, compare=False)
    """The patches ``decide`` took, in the order it asked: the worker records those the run had not."""

    def patched(self, patch: str) -> bool:
        """Whether to take the patched branch at patch point ``patch``. Live, always: the worker records
        ``run.patch_taken`` with the first decision that takes it. Replaying, only where the history
        recorded it, so a history recorded before the patch existed replays through the old branch."""
        taken = self.patches is None or patch in self.patches
        if taken and patch not in self.taken:
            self.taken.append(patch)
        return taken


class Workflow(Protocol):
    """A run kind as a workflow author writes it."""

    kind: str

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision: ...

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        """The acceptance conditions ``evidence`` does not meet; empty means accepted."""


def budget_needs(decision: Decision, state: RunSnapshot) -> tuple[str, ...]:
    """The budget dimensions carrying out ``decision`` spends, which must have room first.

    Only new work spends: completing, failing and waiting need no budget (a run whose last step
    used its last tool call still completes), and re-sending an action submitted before a crash
    is the same submission, already charged (a fan-out whose calls still to make are all such is too).
    """
    if isinstance(decision, AskModel):
        return ("model_calls", "cost")
    if isinstance(decision, CallTool):
        record = state.action(decision.logical_action)
        return () if record is not None and record.status is ActionStatus.SUBMITTED else ("tool_calls", "cost")
    if isinstance(decision, CallTools):
        return ("tool_calls", "cost") if joins.charged(state, decision.logical_actions) else ()
    return ()


def wait_for(
    decision: WaitForEvent | WaitForUser | AskUser | WaitForSignal | ScheduleRetry, ctx: DecisionContext
) -> tuple[RunStatus, Wait]:
    """The waiting status and ``Wait`` to record for a waiting decision."""
    wait_id = ctx.new_id()
    if isinstance(decision, WaitForEvent):
        wait = Wait(
            wait_id=wait_id, kind=decision.kind, deadline=decision.deadline,
            correlation_key=decision.correlation_key, provider=decision.provider,
        )  # fmt: skip
        return RunStatus.WAITING_EVENT, wait
    if isinstance(decision, WaitForUser):
        wait = Wait(
            wait_id=wait_id, kind="approval", deadline=decision.deadline, approval_id=decision.approval_id,
            owner=decision.owner, approved_hash=decision.approved_hash, subject=decision.summary,
            correlation_key=decision.invalidated_by, provider=decision.provider,
            reminders=decision.remind_after, escalate_after=decision.escalate_after, escalate_to=decision.escalate_to,
            valid_for=decision.valid_for,
        )  # fmt: skip
        return RunStatus.WAITING_USER, wait
    if isinstance(decision, AskUser):
        wait = Wait(wait_id=wait_id, kind=QUESTION_WAIT, deadline=decision.deadline, owner=decision.owner,
                    question_id=decision.question_id, reminders=decision.remind_after,
                    escalate_after=decision.escalate_after, escalate_to=decision.escalate_to)
        return RunStatus.WAITING_USER, wait
    if isinstance(decision, WaitForSignal):
        return signal_wait(wait_id, decision.name, decision.deadline)
    wake_at = ctx.now + decision.delay
    wait = Wait(
        wait_id=wait_id, kind="timer", deadline=wake_at, wake_at=wake_at, subject=decision.logical_action
    )
    return RunStatus.RETRY_SCHEDULED, wait
