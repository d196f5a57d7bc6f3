"""Child runs: a run starts runs of its own (``StartChildren``), waits for one, any or all of them
(``WaitForChildren``) and reads how they ended as facts.

Responsibility: how ``run.child_started`` and ``run.child_ended`` change the parent, the wait a
``WaitForChildren`` starts and when it is satisfied, the budget a child may draw, and how ``decide``
reads a child's outcome.

Invariants:
- A child is the fact ``child:<name>`` of its parent: its run id, kind, the budget it drew and, once it
  ended, its terminal status with its evidence (COMPLETED) or reason (any other end). A child's failure is
  such a fact, never the parent's failure: ``decide`` decides what it means.
- A child draws its budget from the parent's remaining when it starts (per dimension, the least of what
  it asks and what remains), charged to the parent then; when it ends, what it did not spend of it is
  given back. The parent's usage therefore always covers what its children spent or may still spend:
  the tree never spends more than the parent's limits.
- The parent waits for its children holding no tenant slot (``domain.slots``): the children need the
  slots. The wait ends when enough of the names it waits for have ended (all, any, or at least n), or
  at its deadline.
- A child's end reaches its parent once (keyed by the child's run id); after the parent ended it is late.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from longrun.domain import events as ev
from longrun.domain.budget import Budget, Usage, remaining
from longrun.domain.codec import FrozenMap, freeze, thaw
from longrun.domain.lifecycle import Handler, end_wait, put_fact, reject
from longrun.domain.run import TERMINAL, RunStatus
from longrun.domain.snapshot import Fact, RunSnapshot, Wait, Wake, WakeReason

CHILDREN_WAIT = "children"
"""The kind of a wait for children; it holds no tenant slot."""
ENDED_TIMER = "child_ended"
"""The timer kind that carries a child's end to its parent; closure never cancels one (a finished parent
keeps the end in its history, late)."""
CHILD_FACT_PREFIX = "child:"
"""A child is the fact ``child:<name>`` of its parent."""
NAME_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
"""What a child's name (1 to 100 of them) is made of: it keys the child's fact and its idempotency key."""


class ParentCancel(str, Enum):
    """What cancelling (or terminating) the parent does to a child still open."""

    CANCEL = "cancel"
    """The child is cancelled through the cancel protocol, as an operator would cancel it."""
    ABANDON = "abandon"
    """The child runs on, detached: its end still reaches the parent, late."""


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """A child as its parent knows it: ``status`` None while it is open."""

    name: str
    run_id: str
    kind: str
    status: RunStatus | None
    evidence: FrozenMap
    reason: str | None


def valid_name(name: str) -> bool:
    return 1 <= len(name) <= 100 and set(name) <= NAME_CHARACTERS


def fact_key(name: str) -> str:
    return CHILD_FACT_PREFIX + name


def outcome(state: RunSnapshot, name: str) -> ChildOutcome | None:
    """The child ``name`` of the run, None if it started none of that name."""
    fact = state.fact(fact_key(name))
    if fact is None or not isinstance(fact.value, FrozenMap):
        return None
    value = fact.value
    status = value.get("status")
    evidence = value.get("evidence")
    reason = value.get("reason")
    return ChildOutcome(name, str(value.get("run_id")), str(value.get("kind")),
                        RunStatus(status) if isinstance(status, str) else None,
                        evidence if isinstance(evidence, FrozenMap) else FrozenMap(),
                        reason if isinstance(reason, str) else None)


def started(state: RunSnapshot) -> tuple[ChildOutcome, ...]:
    """Every child the run started, in the order they last changed."""
    found = (outcome(state, f.key.removeprefix(CHILD_FACT_PREFIX)) for f in state.facts
             if f.key.startswith(CHILD_FACT_PREFIX))
    return tuple(c for c in found if c is not None)


def needed(names: tuple[str, ...], until: str | int) -> int:
    """How many of ``names`` must have ended for a wait ``until`` "all", "any" or at least n of them."""
    if until == "all":
        return len(names)
    if until == "any":
        return 1
    if isinstance(until, int) and not isinstance(until, bool) and 1 <= until <= len(names):
        return until
    raise ValueError(f"until is 'all', 'any' or a count from 1 to {len(names)}, got {until!r}")


def satisfied(state: RunSnapshot, names: tuple[str, ...], count: int) -> bool:
    """Whether at least ``count`` of the children ``names`` have ended."""
    ended = 0
    for name in names:
        child = outcome(state, name)
        ended += child is not None and child.status is not None
    return ended >= count


def children_wait(wait_id: str, names: tuple[str, ...], count: int, deadline: float) -> tuple[RunStatus, Wait]:
    """The status and wait a ``WaitForChildren`` records: the names in ``subject``, the count in the key."""
    return RunStatus.WAITING_EVENT, Wait(wait_id=wait_id, kind=CHILDREN_WAIT, deadline=deadline,
                                         correlation_key=f"{CHILDREN_WAIT}:{count}", subject=",".join(names))


def _waited(wait: Wait) -> tuple[tuple[str, ...], int]:
    assert wait.correlation_key is not None and wait.subject is not None
    return tuple(wait.subject.split(",")), int(wait.correlation_key.removeprefix(f"{CHILDREN_WAIT}:"))


def draw(parent: Budget, asked: Usage | None) -> Usage:
    """The budget a child starting now gets: per dimension the least of what it asks (None: all) and what
    the parent has left."""
    left = remaining(parent)
    if asked is None:
        return left
    return Usage(min(asked.model_calls, left.model_calls), min(asked.tool_calls, left.tool_calls),
                 min(asked.cost, left.cost))


def given_back(drawn: Usage, spent: Usage) -> Usage:
    """What a child that ended gives back of what it drew: what it did not spend (never negative)."""
    return Usage(max(0, drawn.model_calls - spent.model_calls), max(0, drawn.tool_calls - spent.tool_calls),
                 max(0.0, drawn.cost - spent.cost))


def _usage(value: object) -> Usage:
    if not isinstance(value, FrozenMap):
        return Usage()
    return Usage(int(value.get("model_calls", 0)), int(value.get("tool_calls", 0)),  # type: ignore[arg-type]
                 float(value.get("cost", 0.0)))  # type: ignore[arg-type]


def _plain(usage: Usage) -> dict[str, int | float]:
    return {"model_calls": usage.model_calls, "tool_calls": usage.tool_calls, "cost": usage.cost}


def end_report(run: RunSnapshot) -> dict[str, object]:
    """What finished ``run`` tells its parent, if it has one (the payload of the ``child_ended`` timer its
    finishing transition writes): its status, evidence or reason, and what it spent."""
    evidence = run.acceptance.evidence if run.status is RunStatus.COMPLETED and run.acceptance is not None else {}
    return {"status": run.status.value, "evidence": thaw(evidence), "reason": run.terminal_reason,
            "spent": _plain(run.budget.used)}


def ended(report: Mapping[str, object], *, seq: int, at: float) -> ev.ChildEnded:
    """The ``run.child_ended`` of a ``child_ended`` timer's payload (``end_report`` with the child's name
    and run id); KeyError or ValueError for a payload that is not one."""
    return ev.ChildEnded(seq=seq, at=at, name=str(report["name"]), child_run_id=str(report["child_run_id"]),
                         status=RunStatus(report["status"]), evidence=FrozenMap(report["evidence"]),  # type: ignore[arg-type]
                         reason=report["reason"] if isinstance(report["reason"], str) else None,
                         spent=_usage(freeze(report["spent"])))


def _child_started(s: RunSnapshot, e: ev.ChildStarted) -> RunSnapshot:
    if s.status is not RunStatus.RUNNING:
        reject(s, e, f"only a worker step starts a child; the run is {s.status.value}")
    if s.fact(fact_key(e.name)) is not None:
        reject(s, e, f"a child named {e.name!r} was started before")
    left = remaining(s.budget)
    if any(getattr(e.budget, d) > getattr(left, d) for d in ("model_calls", "tool_calls", "cost")):
        reject(s, e, f"child {e.name!r} draws more than the run has left")
    value = freeze({"run_id": e.child_run_id, "kind": e.kind, "status": None, "drawn": _plain(e.budget)})
    recorded = put_fact(s, Fact(fact_key(e.name), value, "runtime", e.at))
    used = s.budget.used + e.budget
    return recorded.replace(budget=Budget(s.budget.limit, used))


def _child_ended(s: RunSnapshot, e: ev.ChildEnded) -> RunSnapshot:
    fact = s.fact(fact_key(e.name))
    if fact is None or not isinstance(fact.value, FrozenMap) or fact.value.get("run_id") != e.child_run_id:
        reject(s, e, f"run {e.child_run_id} is not the run's child {e.name!r}")
    if fact.value.get("status") is not None:
        reject(s, e, f"child {e.name!r} ended before")
    if e.status not in TERMINAL:
        reject(s, e, f"{e.status.value} is not an end")
    back = given_back(_usage(fact.value.get("drawn")), e.spent)
    used = s.budget.used
    budget = Budget(s.budget.limit, Usage(used.model_calls - back.model_calls, used.tool_calls - back.tool_calls,
                                          max(0.0, used.cost - back.cost)))
    value = freeze({**fact.value, "status": e.status.value, "evidence": e.evidence,
                    "reason": e.reason, "spent": _plain(e.spent)})
    recorded = put_fact(s, Fact(fact.key, value, f"run:{e.child_run_id}", e.at)).replace(budget=budget)
    wait = s.wait
    if wait is None or wait.kind != CHILDREN_WAIT:
        return recorded
    names, count = _waited(wait)
    if e.name not in names or not satisfied(recorded, names, count):
        return recorded
    return end_wait(recorded, e.at, Wake(WakeReason.EVENT, wait.wait_id, e.at, fact.key))


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {ev.ChildStarted: _child_started, ev.ChildEnded: _child_ended}
