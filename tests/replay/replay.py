"""Recorded run histories and the decisions in them: derive, verify, replay.

A history file (``histories/*.json``) keeps one run as it was stored: every event (its JSON as
in ``run_events.data``, and whether it was applied or stored as late), the stored snapshot (in
the snapshot schema of the release that wrote it) and the decisions the worker took.

The decisions are not logged by the runtime; they are derived, once, when the history is
recorded: at every point where a worker called ``decide`` (the run is RUNNING, nothing is in
flight or in doubt, and what follows is the work of a decision), the pinned workflow's
``decide`` is called on the fold of the events so far, with the time of the event that followed
as ``now``, and what it returns must match what actually followed (the action prepared, the
wait started with its key, approval and hash, the question asked, the completion and its
evidence...). Replaying repeats the same calls under the code of today and must get the same
decisions.

A patch point (``ctx.patched``) is taken where the history took it: the patches folded so far,
and those recorded (``run.patch_taken``) with the decision itself, ahead of its own events. A
history recorded before a patch existed replays through the old branch.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun.authoring import Registry
from longrun.config import Settings
from longrun.domain import (
    TERMINAL,
    UNRECONCILED,
    AskModel,
    AskUser,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    Fail,
    Reconcile,
    RunSnapshot,
    RunStatus,
    SIGNAL_WAIT,
    ScheduleRetry,
    WaitForEvent,
    WaitForSignal,
    WaitForUser,
    event_from_dict,
    evolve,
    exhausted,
    request_hash,
    thaw,
    to_plain,
)
from longrun.app.worker.model_call import MODEL_RETRY_FACT_PREFIX
from longrun.domain import events as ev
from longrun.domain.breaker import TOOL_HEALTHY_WAIT
from tests.integration.signal_kinds import SIGNALLED
from tests.kinds import ASKING, registry

FORMAT = 1
CRASH_RECOVERY_CAUSE = "submitted before a crash; outcome not recorded"
_WORKER_EVENTS = (ev.ActionPrepared, ev.ActionRecorded, ev.ActionSubmitted, ev.BudgetCharged, ev.WaitStarted,
                  ev.QuestionOpened, ev.RunCompleted)
_DECIDED_MOVES = frozenset({RunStatus.FAILED, RunStatus.NEEDS_ATTENTION, RunStatus.ACTION_UNKNOWN})


@dataclass(frozen=True)
class Point:
    """A place where a worker decided: after the event at ``after_seq``, at time ``now``."""

    after_seq: int
    now: float
    decision: dict[str, Any]


def kinds() -> Registry:
    """The default run kinds, and the test-only ``asking`` (questions) and ``signalled`` (signals)."""
    found = registry(Settings.from_env({}))
    found.add(ASKING)
    found.add(SIGNALLED)
    return found


def decision_to_plain(decision: Decision) -> dict[str, Any]:
    return {"type": type(decision).__name__, **to_plain(decision)}  # type: ignore[dict-item]


def as_decided_today(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded decision with each field added to its type since (one with a default) at that default:
    what the decision meant when it was recorded."""
    declared = {t.__name__: t for t in typing.get_args(Decision)}.get(recorded["type"])
    if declared is None:
        return dict(recorded)
    defaults = {f.name: to_plain(f.default) for f in dataclasses.fields(declared)
                if f.default is not dataclasses.MISSING and f.name not in recorded}
    return {**recorded, **defaults}


def decide(kinds: Registry, state: RunSnapshot, now: float, taken: frozenset[str] = frozenset()) -> Decision:
    """The pinned workflow's decision, with ``now`` as the clock, ids and randomness fixed, and the
    patches the run had taken there (``taken``: those recorded with this decision)."""
    counter = itertools.count(1)
    ctx = DecisionContext(now=now, new_id=lambda: f"replay-{next(counter)}", rng=random.Random(0),
                          patches=frozenset(state.patches) | taken)
    return kinds.get(state.kind, state.versions.workflow).workflow.decide(state, ctx)


def patches_ahead(following: Iterable[ev.RunEvent]) -> tuple[frozenset[str], ev.RunEvent | None]:
    """The patches recorded at the head of ``following`` (with the decision they changed), and the
    first event after them: the decision's own."""
    taken = []
    for event in following:
        if not isinstance(event, ev.PatchTaken):
            return frozenset(taken), event
        taken.append(event.patch)
    return frozenset(taken), None


def _mid_commit(previous: ev.RunEvent | None) -> bool:
    """``previous`` is not the last event of the worker's commit, or a call is out after it.

    A decision commits together: prepared + submitted + charged (then the tool call is out, and
    what follows is its outcome), charged + the model's proposal, or a question + the wait for its
    answer; the patches it took come first. An unavailable answer commits with the wait for its retry;
    a model's unavailable answer is charged and counted (``model_retry:``) with its wait, or with the
    move to NEEDS_ATTENTION.
    """
    return isinstance(previous, ev.ActionPrepared | ev.ActionSubmitted | ev.BudgetCharged | ev.PatchTaken
                      | ev.QuestionOpened | ev.ActionUnavailable) or (
        isinstance(previous, ev.FactRecorded) and previous.key.startswith(MODEL_RETRY_FACT_PREFIX))


def _decides(state: RunSnapshot | None, previous: ev.RunEvent | None, following: ev.RunEvent) -> bool:
    """Whether the worker called ``decide`` on ``state`` and ``following`` is the first thing it did about it."""
    if state is None or state.status is not RunStatus.RUNNING:
        return False
    if isinstance(previous, ev.BudgetCharged) and previous.tool_calls > 0:
        # The call was out. An outcome follows, unless that worker died before recording it: then
        # the next worker decided again, and re-ran the request or handed it to reconciliation.
        return (isinstance(following, ev.BudgetCharged) and following.tool_calls > 0) or (
            isinstance(following, ev.ActionUnknown) and following.cause == CRASH_RECOVERY_CAUSE)
    if _mid_commit(previous):
        return False
    if exhausted(state.budget) is not None or any(a.status in UNRECONCILED for a in state.actions):
        return False  # the worker ends or parks the run before it asks the workflow
    if isinstance(following, ev.ActionUnknown):
        return following.cause == CRASH_RECOVERY_CAUSE
    if isinstance(following, ev.RunStatusChanged):
        return following.to in _DECIDED_MOVES
    return isinstance(following, _WORKER_EVENTS)


def derive(kinds: Registry, events: Sequence[ev.RunEvent]) -> list[Point]:
    """Every decision point of a history, with what ``decide`` says there (unverified)."""
    points: list[Point] = []
    state: RunSnapshot | None = None
    previous: ev.RunEvent | None = None
    for i, event in enumerate(events):
        taken, following = patches_ahead(itertools.islice(events, i, None))
        if following is not None and _decides(state, previous, following):
            assert state is not None and previous is not None
            points.append(Point(previous.seq, event.at, decision_to_plain(decide(kinds, state, event.at, taken))))
        state = evolve(state, event)
        previous = event
    return points


def mismatch(kinds: Registry, events: Sequence[ev.RunEvent], point: Point) -> str | None:
    """Why the decision at ``point`` is not what the history shows next; None when it is."""
    state: RunSnapshot | None = None
    for event in events:
        if event.seq > point.after_seq:
            break
        state = evolve(state, event)
    assert state is not None
    nxt = list(itertools.dropwhile(lambda e: isinstance(e, ev.PatchTaken),
                                   (e for e in events if e.seq > point.after_seq)))
    first, second = nxt[0], (nxt[1] if len(nxt) > 1 else None)
    d = point.decision
    kind = d["type"]
    if kind == AskModel.__name__:
        ok = (isinstance(first, ev.BudgetCharged) and first.model_calls == 1 and isinstance(second, ev.FactRecorded)
              and second.key.startswith((f"proposal:{d['purpose']}:", f"{MODEL_RETRY_FACT_PREFIX}{d['purpose']}:")))
    elif kind == CallTool.__name__:
        ok = _tool_call_followed(state, d, first)
    elif kind == AskUser.__name__:
        ok = (isinstance(first, ev.QuestionOpened) and first.question_id == d["question_id"]
              and first.text == d["text"] and thaw(first.answer_schema) == d["answer_schema"]
              and isinstance(second, ev.WaitStarted) and second.status is RunStatus.WAITING_USER
              and second.wait.question_id == d["question_id"] and second.wait.owner == d["owner"])
    elif kind in (WaitForEvent.__name__, WaitForUser.__name__, WaitForSignal.__name__, ScheduleRetry.__name__):
        ok = isinstance(first, ev.WaitStarted) and _wait_matches(d, first)
    elif kind == Complete.__name__:
        ok = (isinstance(first, ev.RunCompleted) and thaw(first.evidence) == d["evidence"]) or (
            isinstance(first, ev.RunStatusChanged) and first.to is RunStatus.NEEDS_ATTENTION
            and first.reason.startswith("acceptance check failed"))
    elif kind == Fail.__name__:
        ok = isinstance(first, ev.RunStatusChanged) and first.to is RunStatus.FAILED and first.reason == d["reason"]
    elif kind == Reconcile.__name__:
        ok = isinstance(first, ev.RunStatusChanged) and first.to is RunStatus.ACTION_UNKNOWN
    else:
        return f"unknown decision type {kind}"
    return None if ok else f"after seq {point.after_seq}: decide said {d}, but the history goes on with {first}"


def _tool_call_followed(state: RunSnapshot, d: Mapping[str, Any], first: ev.RunEvent) -> bool:
    name = d["logical_action"]
    record = state.action(name)
    if isinstance(first, ev.ActionPrepared | ev.ActionRecorded):  # a first request (recorded with its answer)
        return (record is None and first.logical_action == name and first.tool == d["tool"]
                and first.approval_id == d["approval_id"]
                and first.request_hash == request_hash(first.tool, first.tool_version, args=d["args"]))
    if isinstance(first, ev.ActionSubmitted):  # a resubmission after reconciliation proved nothing happened
        return first.logical_action == name and record is not None and record.status.value == "RETRYABLE"
    if isinstance(first, ev.BudgetCharged):  # a pure or idempotent request re-run after a crash
        return first.tool_calls == 1 and record is not None and record.status.value == "SUBMITTED"
    if isinstance(first, ev.ActionUnknown):  # a non-idempotent request that may have happened before a crash
        return first.logical_action == name and record is not None and record.status.value == "SUBMITTED"
    if isinstance(first, ev.RunStatusChanged):  # asked again for an action that already ended
        return first.to is RunStatus.NEEDS_ATTENTION and name in first.reason
    if isinstance(first, ev.WaitStarted):  # not worth calling now: its far side's breaker is open
        return (first.status is RunStatus.RETRY_SCHEDULED and first.wait.kind == TOOL_HEALTHY_WAIT
                and first.wait.subject == name)
    return False


def _wait_matches(d: Mapping[str, Any], started: ev.WaitStarted) -> bool:
    wait = started.wait
    if d["type"] == WaitForEvent.__name__:
        return (started.status is RunStatus.WAITING_EVENT and wait.kind == d["kind"]
                and wait.correlation_key == d["correlation_key"])
    if d["type"] == WaitForSignal.__name__:
        return (started.status is RunStatus.WAITING_EVENT and wait.kind == SIGNAL_WAIT
                and wait.correlation_key == f"{SIGNAL_WAIT}:{d['name']}")
    if d["type"] == WaitForUser.__name__:
        return (started.status is RunStatus.WAITING_USER and wait.approval_id == d["approval_id"]
                and wait.owner == d["owner"] and wait.approved_hash == d["approved_hash"]
                and wait.subject == d["summary"] and wait.correlation_key == d.get("invalidated_by"))
    return started.status is RunStatus.RETRY_SCHEDULED and wait.subject == d["logical_action"]


# -- files --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    name: str
    data: Mapping[str, Any]

    @property
    def events(self) -> list[ev.RunEvent]:
        return [event_from_dict(row["event"]) for row in self.data["events"]]

    @property
    def applied(self) -> list[bool]:
        return [bool(row["applied"]) for row in self.data["events"]]

    @property
    def points(self) -> list[Point]:
        return [Point(p["after_seq"], p["now"], p["decision"]) for p in self.data["decisions"]]

    @property
    def snapshot(self) -> RunSnapshot:
        return RunSnapshot.from_dict(self.data["snapshot"])

    @property
    def known_divergences(self) -> dict[int, dict[str, Any]]:
        return {d["after_seq"]: d for d in self.data.get("known_divergences", [])}


def record(*, name: str, story: str, source: Mapping[str, Any], rows: Sequence[tuple[Mapping[str, Any], bool]],
           snapshot: Mapping[str, Any], kinds: Registry) -> dict[str, Any]:
    """The history file for stored event rows ``(data, applied)`` and the stored snapshot; every
    derived decision is checked against what followed it (AssertionError naming the first that is not)."""
    events = [event_from_dict(data) for data, _ in rows]
    points = derive(kinds, events)
    problems = [m for m in (mismatch(kinds, events, p) for p in points) if m]
    assert not problems, "\n".join(problems)
    final = RunSnapshot.from_dict(snapshot)
    assert final.status in TERMINAL, f"record finished runs only (this one is {final.status.value})"
    return {
        "format": FORMAT,
        "name": name,
        "story": story,
        "recorded": dict(source),
        "kind": final.kind,
        "versions": to_plain(final.versions),
        "snapshot_schema_version": snapshot.get("schema_version"),
        "events": [{"applied": applied, "event": dict(data)} for data, applied in rows],
        "snapshot": dict(snapshot),
        "decisions": [{"after_seq": p.after_seq, "now": p.now, "decision": p.decision} for p in points],
    }


def divergences(kinds: Registry, data: Mapping[str, Any], *, why: str) -> list[dict[str, Any]]:
    """Where today's ``decide`` differs from the recorded decisions: per point, each differing field."""
    history = History(str(data["name"]), data)
    found = []
    for point, today in zip(history.points, replayed(kinds, history), strict=True):
        fields = sorted(k for k in point.decision.keys() | today.keys() if point.decision.get(k) != today.get(k))
        if fields:
            found.append({"after_seq": point.after_seq, "why": why,
                          "fields": {k: {"recorded": point.decision.get(k), "today": today.get(k)} for k in fields}})
    return found


def replayed(kinds: Registry, history: History) -> list[dict[str, Any]]:
    """Today's decision at each recorded point: fold the events up to it, call ``decide`` at its time."""
    events = history.events
    decisions = []
    state: RunSnapshot | None = None
    position = 0
    for point in history.points:
        while position < len(events) and events[position].seq <= point.after_seq:
            state = evolve(state, events[position])
            position += 1
        assert state is not None
        taken, _ = patches_ahead(events[position:])
        decisions.append(decision_to_plain(decide(kinds, state, point.now, taken)))
    return decisions
