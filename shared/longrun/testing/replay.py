"""Replay a recorded history against new code: does the run kind of today take the path the run took?

    history = kit.history(run_id)                     # or events exported as JSON, or a snapshot
    replayed = replay(new_kind, history)
    assert replayed.divergence is None, replayed.divergence

A code-first kind replays its whole function against the history's last state: every await the
run made is checked (the tool and arguments, the model purpose, the wait), so one replay covers the
whole path, and ``divergence`` says where the new code leaves it (await index, what the code asks,
what the history holds). The history's patch points are taken where it took them. A decide-style
kind is asked for its next decision on the same state.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun.authoring import RunKind
from longrun.codefirst.journal import ReplayError
from longrun.domain import Decision, DecisionContext, RunSnapshot, event_from_dict, fold
from longrun.domain import events as ev

History = RunSnapshot | Sequence[ev.RunEvent] | Sequence[Mapping[str, Any]] | Mapping[str, Any]
"""A run's snapshot, its events, its events as JSON (``event_to_dict``, ``Kit.history``), or the run as
``longrunctl -o json run show`` prints it (its ``events``)."""


@dataclass(frozen=True, slots=True)
class Replayed:
    decision: Decision | None
    """What the kind decides next on the history's last state (None when it diverged)."""
    divergence: str | None
    """Where and how the code left the recorded path; None: it follows it."""


def snapshot_of(history: History) -> RunSnapshot:
    if isinstance(history, RunSnapshot):
        return history
    if isinstance(history, Mapping):
        history = history["events"]
    events = [e if isinstance(e, ev.RunEvent) else event_from_dict(e) for e in history]
    return fold(events)


def replay(kind: RunKind, history: History) -> Replayed:
    """Replay ``history`` under ``kind``'s workflow (ids and randomness fixed, patches as recorded)."""
    state = snapshot_of(history)
    counter = itertools.count(1)
    ctx = DecisionContext(now=state.status_since, new_id=lambda: f"replay-{next(counter)}", rng=random.Random(0),
                          patches=frozenset(state.patches))
    try:
        return Replayed(kind.workflow.decide(state, ctx), None)
    except ReplayError as e:
        return Replayed(None, str(e))
