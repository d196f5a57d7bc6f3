"""The values the stores take and give for runs: a worker's fence, a run as stored, a transition
planned in memory (``plan``, ``defer``) and what commits with it (``Transition``), a ledger
request, and the answers of creation (``AtOnce``, ``Found``). The adapters under ``longrun.db``
and ``longrun.testing`` implement the stores over them; the use cases import them from here,
never from an adapter. Everything here is pure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from longrun.domain import (
    ActionStatus,
    PinnedVersions,
    RunSnapshot,
    RunStatus,
    cleanup,
    closure,
    evolve,
    is_late,
    queue_stint_starts,
)
from longrun.domain import events as ev
from longrun.domain import reminders
from longrun.domain.slots import gives_slot_back
from longrun.envelope import Envelope


@dataclass(frozen=True, slots=True)
class Message:
    """An envelope and where the relay will publish it."""

    envelope: Envelope
    exchange: str
    routing_key: str
    partition: int


@dataclass(frozen=True, slots=True)
class Fence:
    """A worker's claim: its writes land only while it still holds this lease."""

    owner: str
    token: int


@dataclass(frozen=True, slots=True)
class StoredRun:
    snapshot: RunSnapshot
    stored_seq: int
    partition: int
    lease_owner: str | None
    lease_until: datetime | None
    fencing_token: int
    admitted: bool
    written: StoredRun | None = None
    """The run as last written, when this state holds events (``unwritten``) not written yet
    (``defer``): the next transition writes them first, guarded by that state's revision."""
    unwritten: tuple[tuple[ev.RunEvent, bool], ...] = ()
    unwritten_request: LedgerRequest | None = None
    """The ledger request of a first call recorded among the unwritten events: its row is written
    with them."""
    trace_root: str | None = None
    """The traceparent of the run's root span (``runs.trace_root``), as read."""

    def seq(self, offset: int = 1) -> int:
        """The seq the ``offset``-th event appended next will take."""
        return self.stored_seq + offset


@dataclass(frozen=True, slots=True)
class Rides:
    """Rows that commit with a transition, in its statement: nothing is written unless it applies."""

    messages: Sequence[Message] = ()
    notices: Sequence[tuple[str, str]] = field(default=())
    """(channel, payload) to NOTIFY, delivered at commit."""
    handover: Handover | None = None
    timers: Sequence[Mapping[str, Any]] = ()
    """Timers to schedule (``timers.schedule``'s arguments without the run): a call's timeouts, due
    from the statement's time."""
    tenant_charge: TenantCharge | None = None


@dataclass(frozen=True, slots=True)
class TenantCharge:
    """A model call's use added to its tenant's budget period by the statement that charges the run,
    only when the tenant has a budget (its own limits', else the platform's ``*_default``; ``None``:
    unlimited). ``period``: the budget period's length in seconds."""

    tenant_id: str
    tokens: int
    cost: float
    period: float
    tokens_default: int | None
    cost_default: float | None


@dataclass(frozen=True, slots=True)
class Handover:
    """The slot of an admitted run that finishes goes to its tenant's best queued run, admitted and
    woken in the same statement. Admission's count of active runs cannot see one without the
    other, so no admitter over-admits. A tenant at or above ``slots`` (they were lowered) hands
    nothing on, so it shrinks to them; whenever no run takes the slot, ``channel`` is notified."""

    tenant_id: str
    slots: int
    aging_seconds: float
    wake: Mapping[str, Any]
    """The chosen run's wakeup as the outbox keeps it (``bus.wakeup.wake``), but for the run, its
    revision, and the wakeup's own id and time, which the statement adds."""
    exchange: str
    """Where wakeups are published."""
    routes: Mapping[int, str]
    """Routing key of each partition."""
    channel: str


@dataclass(frozen=True, slots=True)
class AtOnce:
    """Admission at creation: a run created while its tenant has a free slot and no queued run is
    admitted and woken in its creating statement, the choice admission would make. The caller holds
    the tenant's admission lock, so the statement's count is the one admission would see. With a
    free slot but runs queued, ``channel`` is notified: admission picks among them by priority and
    age. With no free slot the run stays queued; the run that finishes next hands its slot on."""

    slots: int
    wakeup: Message
    """The new run's wakeup, written only if it is admitted."""
    channel: str


@dataclass(frozen=True, slots=True)
class Found:
    """A run found by its creating key: what a repeated create is answered with."""

    run_id: str
    input_hash: str
    partition: int
    workflow: str
    versions: PinnedVersions
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Planned:
    """A transition computed in memory: the state after ``events``, the rows to write, and what
    the move ends and starts besides (its closure, a queue stint), decided here for every writer
    (when it is written: a move deferred to the next write is never asked)."""

    before: StoredRun
    after: StoredRun
    rows: tuple[tuple[ev.RunEvent, bool], ...]
    """Each event with whether it was applied (False: stored as late)."""
    release_lease: bool

    @property
    def cancel(self) -> closure.Cancel | None:
        """The open timers the move leaves without a purpose (``closure.timers_to_cancel``)."""
        return closure.timers_to_cancel(self.before.snapshot, self.after.snapshot)

    @property
    def owes_cleanup(self) -> bool:
        """The move finishes the run in a way that owes its kind's cleanup (``cleanup.starts``): its
        cleanup row is written with it, for the reconciler."""
        return cleanup.starts(self.before.snapshot, self.after.snapshot)

    @property
    def ends_run(self) -> bool:
        """The move finishes the run: a child run's end goes to its parent with it (``domain.children``)."""
        return closure.finishes(self.before.snapshot, self.after.snapshot)

    @property
    def queue_stint(self) -> bool:
        """The move queues the run for a worker with a schedule-to-start clock (``queue_stint_starts``)."""
        return queue_stint_starts(self.before.snapshot, self.after.snapshot)

    @property
    def gives_slot_back(self) -> bool:
        """The move parks the run in a wait that holds no slot (``domain.slots``): its slot goes to
        its tenant's next queued run, in the move's statement."""
        return gives_slot_back(self.before.snapshot, self.after.snapshot)


def plan(stored: StoredRun, events: Sequence[ev.RunEvent], *, release_lease: bool = False) -> Planned:
    """``events`` applied to ``stored``, after the events it holds unwritten, if any. A transition that
    finishes the run, whoever writes it, records its ``run.summary`` after them and releases its lease
    (a worker still running it is fenced out)."""
    snapshot = stored.snapshot
    rows = list(stored.unwritten)
    for event in events:
        late = is_late(snapshot, event)
        snapshot = evolve(snapshot, event)
        rows.append((event, not late))
    if events and closure.finishes(stored.snapshot, snapshot):
        summary = ev.RunSummarized(seq=max(stored.stored_seq, *(e.seq for e in events)) + 1,
                                   at=snapshot.status_since, summary=closure.summarize(snapshot))
        snapshot = evolve(snapshot, summary)
        rows.append((summary, True))
        events = [*events, summary]
        release_lease = True
    before = stored.written or stored
    # A run parked in a wait that holds no slot is admitted no more (``domain.slots``).
    admitted = stored.admitted and not gives_slot_back(before.snapshot, snapshot)
    after = StoredRun(snapshot, max([stored.stored_seq, *(e.seq for e in events)]), stored.partition,
                      None if release_lease else stored.lease_owner,
                      None if release_lease else stored.lease_until, stored.fencing_token, admitted)
    return Planned(before, after, tuple(rows), release_lease)


def defer(stored: StoredRun, events: Sequence[ev.RunEvent], *, request: LedgerRequest | None = None) -> StoredRun:
    """``events`` applied in memory only, to be written with the run's next transition (``plan``);
    ``request``: the ledger request of the first call they record (one per write)."""
    if request is not None and stored.unwritten_request is not None:
        raise ValueError(f"run {stored.snapshot.run_id}: a call is deferred already; write it first")
    planned = plan(stored, events)
    return replace(planned.after, written=planned.before, unwritten=planned.rows,
                   unwritten_request=request or stored.unwritten_request)


def wait_timers(run: RunSnapshot, *, decided_at: float) -> list[dict[str, Any]]:
    """The durable timers a parked run's wait needs (``timers.schedule``'s arguments): its deadline
    (naming the question, for a question's), for retries and sleeps its wake-up time, and for a person's
    wait its reminders and escalation (``domain.reminders``). Pure.

    The wait's times were computed from the deciding process's clock at ``decided_at``; only the
    delays are kept, counted from the store's clock (a worker minutes fast must not delay a retry).
    """
    wait = run.wait
    if wait is None:
        return []
    due = []
    if wait.wake_at is not None:
        due.append({"timer_key": f"{run.run_id}:{wait.wait_id}:wake", "run_id": run.run_id,
                    "kind": "retry_backoff" if run.status is RunStatus.RETRY_SCHEDULED else "sleep",
                    "delay": wait.wake_at - decided_at, "payload": {"wait_id": wait.wait_id, "reason": "timer"}})
    if wait.deadline is not None and wait.deadline != wait.wake_at:
        # A question's deadline closes the question too: the timer service leaves it to the domain.
        question = {} if wait.question_id is None else {"question_id": wait.question_id}
        due.append({"timer_key": f"{run.run_id}:{wait.wait_id}:deadline", "run_id": run.run_id,
                    "kind": "wait_deadline", "delay": wait.deadline - decided_at,
                    "payload": {"wait_id": wait.wait_id, "reason": "deadline", **question}})
    return due + reminders.timers(run.run_id, wait, decided_at=decided_at)


@dataclass(frozen=True, slots=True)
class LedgerRequest:
    """A call as the action ledger records it: the request and, for a call recorded only once it
    answered, the answer's columns (``answer``: status CONFIRMED with them)."""

    action_id: str
    run_id: str
    logical_action: str
    tool: str
    tool_version: str
    effect_kind: str
    idempotency_key: str
    request_hash: str
    request: Mapping[str, Any]
    fencing_token: int
    answer: Mapping[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """The arguments of the ledger's ``first_row`` and ``prepare``."""
        fields = {name: getattr(self, name) for name in self.__slots__ if name != "answer"}  # type: ignore[attr-defined]
        fields["request"] = dict(self.request)
        if self.answer is not None:
            fields.update(status=ActionStatus.CONFIRMED, **self.answer)
        return fields


@dataclass(frozen=True, slots=True)
class LedgerOutcome:
    """What the far side answered for the ledger row of ``key``: its status and columns."""

    key: str
    status: ActionStatus
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Artifact:
    """An uploaded receipt (``ArtifactStore.put``), registered in the transaction that refers to it."""

    ref: str
    size: int
    tenant_id: str
    """The tenant whose prefix holds it: the run's."""


@dataclass(frozen=True, slots=True)
class Transition:
    """One step of a worker, as a value: the planned move and everything that commits with it, all
    or nothing (``WorkerStore.commit``). The adapters only persist it."""

    planned: Planned
    fence: Fence
    rides: Rides = Rides()
    """Rows that ride in the transition's statement: broadcasts, NOTIFYs, a slot's hand-over, a
    call's timers."""
    call: LedgerRequest | None = None
    """A call recorded with the move: a first attempt when the run has no ledger row for its logical
    action, else one more attempt of the same request (refused if its hash differs)."""
    first_call: bool = True
    """Whether ``call`` is the logical action's first attempt (its key is new to the run)."""
    outcome: LedgerOutcome | None = None
    """What the far side answered, for the ledger row of its key."""
    artifact: Artifact | None = None
    """An uploaded receipt the move refers to, registered with it."""
    creates: Callable[[Any], Awaitable[None]] | None = None
    """Runs created with the move, in its transaction, after it is written (a parent's children, through
    admission), given the store's ``RunTransaction``: an exception it raises undoes the move too."""

    @property
    def settles_wait(self) -> bool:
        """The move parks the run in a wait: its timers are scheduled and an event kept for its key
        ends it at once."""
        return self.planned.release_lease and self.planned.after.snapshot.wait is not None

    @property
    def wait_timers(self) -> list[dict[str, Any]]:
        """The timers of the wait it parks the run in (none when it settles no wait)."""
        if not self.settles_wait:
            return []
        return wait_timers(self.planned.after.snapshot, decided_at=self.planned.rows[-1][0].at)

    @property
    def alone(self) -> bool:
        """Whether one statement writes it all (no transaction around it): a move with at most a first
        call riding along, nothing uploaded, no outcome and no wait to settle."""
        return (self.artifact is None and self.outcome is None and not self.settles_wait and self.creates is None
                and (self.call is None or self.first_call))
