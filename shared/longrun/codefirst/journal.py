"""The journal a code-first run kind replays against: an index over the run's snapshot, built once per
``decide``, from which each await resolves in O(1).

Responsibility: say, for the n-th await of a replay, whether the history holds its result (and what it
is), holds something else at that point (a divergence, ``ReplayDiverged``), or holds nothing yet (the
first unrecorded await: the engine's next decision).

Invariants:
- What resolves an await is what the engine recorded for the decision that await asked for: a tool
  call's ledger action (its name, or ``<n>:<tool>``; ``<n>.<k>:<name>`` inside a parallel call) and its
  receipt, the
  k-th model proposal of a purpose, an event's fact, an approval, an answer, a child's outcome.
- Where each await that is not an unnamed tool call stands in the function, and what the snapshot
  would otherwise forget (a timer that fired, a wait that timed out, which signal ended a wait, what
  voided an approval), is recorded as a mark (``run.patch_taken`` of ``longrun.await:<n>:<what>:<data>``)
  written with the decision that follows it, through the same channel as patch points.
- The journal position is derived (the replay counts its awaits), never searched for; building the
  index is one pass over the snapshot's actions, facts and patches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.domain import ActionRecord, DecisionContext, Fact, RunSnapshot, WakeReason, thaw
from longrun.domain.action import ActionStatus

MARK_PREFIX = "longrun.await:"
"""Marks share the patch points' record (``run.patch_taken``) under this prefix; no patch point uses it."""
WAIT_ID_PREFIX = "await-"
"""A code-first wait's id is ``await-<n>-<uuid>``: the wake that ends it names the await it belongs to."""
PROPOSAL_PREFIX = "proposal:"
RECEIPTED = frozenset({ActionStatus.CONFIRMED, ActionStatus.COMPENSATING, ActionStatus.COMPENSATED})
"""A call that happened: its receipt is its result (a compensation later does not undo that it ran)."""


class ReplayError(Exception):
    """The run's code cannot be replayed against its history: running the same code again changes
    nothing, so the step is not retried and the run goes to NEEDS_ATTENTION for a person."""


class ReplayDiverged(ReplayError):
    """A replay took another path than the history: await ``index`` asks for ``asked`` where the
    history holds ``held``."""

    def __init__(self, index: int, asked: str, held: str) -> None:
        self.index, self.asked, self.held = index, asked, held
        super().__init__(f"replay diverged at await #{index}: the code asks for {asked}; the history holds {held}")


@dataclass(frozen=True, slots=True)
class Thrown:
    """An await whose recorded outcome is an error: raised into the function at that await."""

    error: Exception


PENDING: Any = object()
"""An await the history holds no result for yet: the replay stops there."""


def call_index(logical_action: str) -> int | None:
    """The await index a code-first logical action was made at (``<n>:...`` or ``<n>.<k>:...``)."""
    head, sep, _ = logical_action.partition(":")
    number = head.partition(".")[0]
    return int(number) if sep and number.isdigit() else None


class Journal:
    """One ``decide``'s view of the history, indexed once (O(actions + facts + patches))."""

    def __init__(self, state: RunSnapshot, ctx: DecisionContext) -> None:
        self.state, self.ctx = state, ctx
        self.facts: Mapping[str, Fact] = {f.key: f for f in state.facts}
        self.actions: Mapping[str, ActionRecord] = {a.logical_action: a for a in state.actions}
        self.calls: dict[int, list[ActionRecord]] = {}
        for record in state.actions:
            index = call_index(record.logical_action)
            if index is not None:
                self.calls.setdefault(index, []).append(record)
        self.marks: dict[int, tuple[str, str]] = {}
        for patch in state.patches:
            if patch.startswith(MARK_PREFIX):
                index, what, data = patch.removeprefix(MARK_PREFIX).split(":", 2)
                self.marks[int(index)] = (what, data)
        self.proposals: Counter[str] = Counter(
            key[len(PROPOSAL_PREFIX):].rpartition(":")[0] for key in self.facts if key.startswith(PROPOSAL_PREFIX))
        self.asked: Counter[str] = Counter()
        self.last_recorded = max((*self.calls, *self.marks), default=-1)
        self.clock = state.created_at
        self.position = 0
        """The index of the next await the function makes: set by the replay driver."""
        self.recorded_patches = frozenset(state.patches)

    def fact(self, key: str) -> Any:
        """The value of fact ``key`` (None: not recorded); reading it moves the replay's clock to it."""
        fact = self.facts.get(key)
        if fact is None:
            return None
        self.clock = max(self.clock, fact.recorded_at)
        return thaw(fact.value)

    def patched(self, patch: str) -> bool:
        """Patch point ``patch`` at the replay's position: where the history has recorded what follows (a
        stretch the run went through before the patch existed) only if it was taken there; beyond it, as a
        decide-style kind takes it (live: taken and recorded)."""
        if patch in self.recorded_patches:
            return self.ctx.patched(patch)
        if self.position <= self.last_recorded:
            return False
        return self.ctx.patched(patch)

    def mark(self, index: int) -> tuple[str, str] | None:
        return self.marks.get(index)

    def record_mark(self, index: int, what: str, data: str) -> None:
        """Remember ``what`` happened at await ``index``: written with the decision this replay ends in."""
        self.marks[index] = (what, data)
        self.ctx.taken.append(f"{MARK_PREFIX}{index}:{what}:{data}")

    def woke(self, index: int) -> WakeReason | None:
        """How the wait of await ``index`` ended, if the run's last wake ended it and no mark says so yet."""
        wake = self.state.last_wake
        if wake is None or not wake.wait_id.startswith(f"{WAIT_ID_PREFIX}{index}-"):
            return None
        self.clock = max(self.clock, wake.at)
        return wake.reason

    def ask_model(self, purpose: str) -> Any:
        """The proposal answering the next ask of ``purpose`` (the k-th ask reads ``proposal:<purpose>:<k>``)."""
        self.asked[purpose] += 1
        return self.fact(f"{PROPOSAL_PREFIX}{purpose}:{self.asked[purpose]}")

    def check_consumed(self, index: int, asked: str, *, parked: bool) -> None:
        """At the end of a replay (``parked`` at await ``index``, which may be under way, or the function
        returned after ``index`` awaits): nothing the history holds lies beyond it, or the code took another
        path than the one recorded."""
        beyond = index + 1 if parked else index
        if self.last_recorded >= beyond:
            later = min(i for i in (*self.calls, *self.marks) if i >= beyond)
            raise ReplayDiverged(index, asked, f"#{later}: {self.held(later)}, which this code never reaches")
        for purpose, recorded in self.proposals.items():
            if recorded > self.asked[purpose]:
                raise ReplayDiverged(index, asked, f"{recorded} answers of the model for purpose {purpose!r}, "
                                                   f"which this code asked {self.asked[purpose]} times")

    def held(self, index: int) -> str:
        """What the history holds at await ``index``, for a divergence's message."""
        records = self.calls.get(index)
        if records:
            return ", ".join(f"a call of {r.tool!r} (logical action {r.logical_action!r}, request hash "
                             f"{r.request_hash[:12]})" for r in records)
        mark = self.marks.get(index)
        if mark is not None and mark[0] == "call":
            named = self.actions.get(mark[1])
            return (f"a call named {mark[1]!r}" if named is None else
                    f"a call of {named.tool!r} (logical action {named.logical_action!r}, request hash "
                    f"{named.request_hash[:12]})")
        if mark is not None:
            return f"a {mark[0]} await ({mark[1]})"
        return "no call or wait recorded there"
