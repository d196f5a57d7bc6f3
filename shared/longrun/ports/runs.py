"""The values the stores take and give for runs: a worker's fence, a run as stored, a transition
planned in memory and what rides along with it, and the answers of creation (``AtOnce``,
``Found``). The adapters under ``longrun.db`` and ``longrun.testing`` implement the stores over
them; the use cases import them from here, never from an adapter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from longrun.domain import PinnedVersions, RunSnapshot
from longrun.domain import events as ev
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
    unwritten_request: Mapping[str, Any] | None = None
    """The ledger request (``actions.prepare``'s arguments) of a first call recorded among the
    unwritten events: its row is written with them."""
    trace_root: str | None = None
    """The traceparent of the run's root span (``runs.trace_root``), as read."""

    def seq(self, offset: int = 1) -> int:
        """The seq the ``offset``-th event appended next will take."""
        return self.stored_seq + offset


@dataclass(frozen=True, slots=True)
class Rides:
    """Rows that commit with a transition, in its statement: nothing is written unless it applies."""

    action: dict[str, Any] | None = None
    """A ledger row whose idempotency key is new (a used key fails the statement: unique violation)."""
    messages: Sequence[Message] = ()
    notices: Sequence[tuple[str, str]] = field(default=())
    """(channel, payload) to NOTIFY, delivered at commit."""
    handover: Handover | None = None
    timers: Sequence[Mapping[str, Any]] = ()
    """Timers to schedule (``timers.schedule``'s arguments without the run): a call's timeouts, due
    from the statement's time."""


@dataclass(frozen=True, slots=True)
class Handover:
    """The slot of an admitted run that finishes goes to its tenant's best queued run, admitted and
    woken in the same statement. Admission's count of active runs cannot see one without the
    other, so no admitter over-admits. A tenant at or above ``slots`` (they were lowered) hands
    nothing on, so it shrinks to them; whenever no run takes the slot, ``channel`` is notified."""

    tenant_id: str
    slots: int
    aging_seconds: float
    wakeup: Message
    """A wakeup for this tenant: the chosen run's id, revision and route replace its own, and its
    event and wakeup ids are new."""
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
    """A transition computed in memory: the state after ``events`` and the rows to write."""

    before: StoredRun
    after: StoredRun
    rows: tuple[tuple[ev.RunEvent, bool], ...]
    """Each event with whether it was applied (False: stored as late)."""
    release_lease: bool
