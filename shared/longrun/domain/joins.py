"""Joins: several calls a decision makes at once (``CallTools``), and when the run goes on after them.

Responsibility: which of a fan-out's calls are still to be made, which have an outcome, when its join
(all of them, the first, or at least N) is satisfied and by which calls; how ``run.joined`` changes
a run (the fact ``joined:<name>``); and which calls in doubt hold a run back.

Invariants:
- A call has an outcome once the far side's answer is definite (``action.SETTLED``: confirmed, failed
  or compensated). RETRYABLE and SUBMITTED calls are still to be made (a resend is the same submission
  under the same key); a call in doubt (UNRECONCILED) is neither: only the reconciler settles it.
- A join is satisfied once ``Join.need`` of its calls have an outcome. ``run.joined`` records that once
  per join name, with the calls that satisfied it (``by``, in the order their outcomes were recorded):
  ``decide`` reads it with ``joined(state, name)``, at once. The other calls lost the join; they still
  run to their outcome and are recorded (a write that was submitted cannot be taken back), after
  ``run.joined`` if they answer later; after a crash the next worker sends the ones still submitted
  again, or records them in doubt, without ``decide`` asking for them.
- A call in doubt holds the run back (it parks ACTION_UNKNOWN) while a join may still need it: one that
  lost a satisfied join does not, until the run asks for something that needs every effect settled
  (another call, or its completion), which waits for the reconciler as any call in doubt makes it wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longrun.domain import events as ev
from longrun.domain.action import SETTLED, UNRECONCILED, ActionStatus
from longrun.domain.codec import FrozenMap, freeze
from longrun.domain.lifecycle import Handler, put_fact, reject
from longrun.domain.run import RunStatus
from longrun.domain.snapshot import Fact, RunSnapshot

JOINED_FACT_PREFIX = "joined:"
"""A satisfied join is the fact ``joined:<name>`` (``{"calls": [...], "by": [...]}``)."""
TO_MAKE: frozenset[ActionStatus] = frozenset({ActionStatus.SUBMITTED, ActionStatus.RETRYABLE})
"""Statuses of a call a fan-out makes (again): a resend under its key, or the next attempt."""


@dataclass(frozen=True, slots=True)
class Join:
    """How many of a fan-out's calls need an outcome before the run goes on."""

    at_least: int | None = None
    """None: every call (ALL)."""

    def need(self, calls: int) -> int:
        return calls if self.at_least is None else self.at_least


ALL = Join()
FIRST = Join(1)


def at_least(n: int) -> Join:
    """The join satisfied once ``n`` calls have an outcome."""
    return Join(n)


@dataclass(frozen=True, slots=True)
class Joined:
    """A satisfied join, as ``run.joined`` recorded it."""

    name: str
    calls: tuple[str, ...]
    by: tuple[str, ...]
    """The calls whose outcomes satisfied it, in the order they were recorded."""

    @property
    def lost(self) -> tuple[str, ...]:
        return tuple(c for c in self.calls if c not in self.by)


def check(calls: Sequence[str], join: Join) -> None:
    """ValueError unless ``calls`` are at least two distinct logical actions and ``join`` needs 1..all of them."""
    if len(calls) < 2:
        raise ValueError(f"a fan-out makes at least two calls, got {len(calls)}: use CallTool for one")
    if len(set(calls)) != len(calls):
        raise ValueError(f"a fan-out's calls are distinct logical actions, got {list(calls)}")
    if join.at_least is not None and (isinstance(join.at_least, bool) or not 1 <= join.at_least <= len(calls)):
        raise ValueError(f"a join needs 1 to {len(calls)} of its calls, got {join.at_least!r}")


def joined(state: RunSnapshot, name: str) -> Joined | None:
    """The join named ``name`` once it was satisfied (``run.joined``), else None."""
    fact = state.fact(JOINED_FACT_PREFIX + name)
    return None if fact is None else _joined(fact)


def with_outcome(state: RunSnapshot, calls: Sequence[str]) -> tuple[str, ...]:
    """Those of ``calls`` whose outcome is definite, in the order given."""
    return tuple(c for c in calls if (a := state.action(c)) is not None and a.status in SETTLED)


def to_make(state: RunSnapshot, calls: Sequence[str]) -> tuple[str, ...]:
    """Those of ``calls`` a fan-out makes now: not made yet, submitted before (sent again under their
    key) or retryable; not those with an outcome or in doubt."""
    return tuple(c for c in calls if (a := state.action(c)) is None or a.status in TO_MAKE)


def charged(state: RunSnapshot, calls: Sequence[str]) -> int:
    """How many of ``calls`` making them now charges: those not made yet and those retried (a call sent
    again after a crash is the same submission, charged when it was first made)."""
    return sum(1 for c in to_make(state, calls)
               if (a := state.action(c)) is None or a.status is ActionStatus.RETRYABLE)


def satisfied_by(state: RunSnapshot, calls: Sequence[str], join: Join,
                 arrived: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The calls that satisfy ``join`` on ``state`` (None: not satisfied yet): the first ``need`` to have
    an outcome, those whose outcomes this turn recorded (``arrived``) in that order, after those recorded
    before it (in the order of ``calls``)."""
    done = with_outcome(state, calls)
    need = join.need(len(calls))
    if len(done) < need:
        return None
    order = [c for c in done if c not in arrived] + [c for c in arrived if c in done]
    return tuple(order[:need])


def holding(state: RunSnapshot, *, settling: bool = False) -> tuple[str, ...]:
    """The calls in doubt that hold the run back: all of them when what it does next needs every effect
    settled (``settling``: a call or its completion), else those no satisfied join left behind."""
    doubtful = tuple(a.logical_action for a in state.actions if a.status in UNRECONCILED)
    if settling or not doubtful:
        return doubtful
    left_behind = {c for f in state.facts if f.key.startswith(JOINED_FACT_PREFIX) for c in _joined(f).lost}
    return tuple(c for c in doubtful if c not in left_behind)


def _joined(fact: Fact) -> Joined:
    value = fact.value
    assert isinstance(value, FrozenMap)
    calls, by = value["calls"], value["by"]
    assert isinstance(calls, tuple) and isinstance(by, tuple)
    return Joined(fact.key.removeprefix(JOINED_FACT_PREFIX), tuple(map(str, calls)), tuple(map(str, by)))


def _run_joined(s: RunSnapshot, e: ev.RunJoined) -> RunSnapshot:
    if s.status is not RunStatus.RUNNING:
        reject(s, e, f"a join is recorded by a worker step; the run is {s.status.value}")
    if joined(s, e.join) is not None:
        reject(s, e, f"join {e.join!r} was recorded already")
    if not e.by or not set(e.by) <= set(e.calls):
        reject(s, e, f"the calls that satisfied join {e.join!r} are some of its calls")
    late = [c for c in e.by if (a := s.action(c)) is None or a.status not in SETTLED]
    if late:
        reject(s, e, f"join {e.join!r}: {', '.join(late)} has no outcome")
    value = freeze({"calls": list(e.calls), "by": list(e.by)})
    return put_fact(s, Fact(JOINED_FACT_PREFIX + e.join, value, "join", e.at))


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {ev.RunJoined: _run_joined}
