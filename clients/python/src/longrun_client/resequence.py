"""Which deliveries a durable consumer hands on, in what order, and where it must admit a gap.

Pure: it is told what arrived and what time it is, and answers with steps to take; the consumer
(``longrun_client.consumer``) does the I/O. Delivery is at least once and a run's events may
arrive out of order (a repeat, a publish retried), so:

- an event whose ``event_id`` was handed on before is a repeat (``Repeat``: acknowledge, skip);
- a run's status events are chained: each ``run.status_changed`` names the status it left
  (``data["from"]``), which is the status of the run's previous event (a ``run.correction_needed``
  leaves the status as it was). An event that does not follow the last one handed on is held
  back, in ``seq`` order, until the events before it arrive;
- one held longer than ``window`` seconds, or one whose missing predecessor the broker reported
  lost (``lost``), means the events in between will not come: a ``Gap`` is reported, then the
  held events are handed on from the lowest ``seq``;
- an event arriving after a later one of its run was handed on (its ``seq`` is not above the
  last handed on) is ``Late``: acknowledged and reported, not handed on.

A run's chain starts at its (first) ``run.accepted``: a new run is ``READY``. When that was not
seen (a consumer may begin mid-run), the run's first event seen starts its chain. Memory is
bounded: the last ``remember`` event ids, and the chains of the last ``remember`` runs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from longrun_client.model import Envelope

__all__ = ["Deliver", "Gap", "Late", "Repeat", "Resequencer", "Step"]


@dataclass(frozen=True)
class Deliver:
    """Hand this event to the handler, then acknowledge it."""

    event: Envelope


@dataclass(frozen=True)
class Repeat:
    """This delivery is an event already handed on: acknowledge it, do not hand it on again."""

    event: Envelope


@dataclass(frozen=True)
class Late:
    """This event arrived after a later one of its run was handed on (after its gap was reported, or
    before the run's chain was known): acknowledge it; handing it on would break seq order."""

    event: Envelope


@dataclass(frozen=True)
class Gap:
    """Events of ``run_id`` after ``after_seq`` and before ``before_seq`` (None: not known yet) were
    published but will not reach this consumer. Usually ``after_seq`` is the last one handed on (0
    if none) and ``before_seq`` the next; a drop reported after later events of its run were handed
    on is placed below the last of those. ``lost_event_ids`` names those the broker reported
    dropped, when it did."""

    run_id: str | None
    after_seq: int
    before_seq: int | None
    lost_event_ids: tuple[str, ...] = ()


Step = Deliver | Repeat | Late | Gap

CREATED_STATUS = "READY"
"""Every run is created in this status: the first status change of a run leaves it."""


@dataclass(frozen=True)
class _Lost:
    event_id: str


@dataclass
class _Chain:
    """One run: the last event handed on, and the events held back waiting for their predecessors
    (a ``_Lost`` in a slot: the broker reported that event dropped)."""

    last_seq: int = 0
    last_status: str | None = None
    held: dict[int, Envelope | _Lost] = field(default_factory=dict)
    held_since: float | None = None


class Resequencer:
    """Turns one consumer's deliveries into steps: each event once, a run's in chain (and seq) order."""

    def __init__(self, *, window: float = 5.0, remember: int = 100_000) -> None:
        if window < 0:
            raise ValueError("window must not be negative")
        self.window = window
        self.remember = remember
        self._handed: OrderedDict[str, None] = OrderedDict()
        self._chains: OrderedDict[str, _Chain] = OrderedDict()

    def offer(self, event: Envelope, now: float) -> list[Step]:
        """Steps for one delivery (``now``: a monotonic clock, in seconds)."""
        if event.event_id in self._handed:
            return [Repeat(event)]
        if event.type != "run.event" or event.run_id is None:
            self._remember(event.event_id)
            if event.type == "run.accepted" and not event.payload.repeated:
                return [Deliver(event), *self._starts(event.payload.run_id, now)]
            return [Deliver(event)]
        chain = self._chain(event.run_id)
        if event.payload.seq <= chain.last_seq:
            self._remember(event.event_id)
            return [Late(event)]
        chain.held[event.payload.seq] = event  # a redelivery of one held replaces it
        return self._release(event.run_id, chain, now)

    def lost(self, event: Envelope, now: float) -> list[Step]:
        """The broker dropped ``event`` before this consumer read it (its queue's length limit)."""
        if event.event_id in self._handed:
            return []
        self._remember(event.event_id)
        if event.type != "run.event" or event.run_id is None:
            return [Gap(event.run_id, 0, None, (event.event_id,))]
        chain = self._chain(event.run_id)
        if event.payload.seq <= chain.last_seq:  # a later event was handed on before this report was read
            return [Gap(event.run_id, 0, chain.last_seq, (event.event_id,))]
        chain.held[event.payload.seq] = _Lost(event.event_id)
        return self._release(event.run_id, chain, now)

    def expire(self, now: float) -> list[Step]:
        """Steps for every run whose held events waited past the window: its gap, then what follows."""
        steps: list[Step] = []
        for run_id, chain in list(self._chains.items()):
            if chain.held_since is not None and now - chain.held_since >= self.window:
                steps += self._give_up(run_id, chain, now)
        return steps

    def next_deadline(self) -> float | None:
        """When ``expire`` next has something to do (monotonic seconds); None while nothing is held."""
        since = [c.held_since for c in self._chains.values() if c.held_since is not None]
        return min(since) + self.window if since else None

    def _starts(self, run_id: str, now: float) -> list[Step]:
        """A new run's chain starts at the status every run is created in, unless it started already."""
        chain = self._chain(run_id)
        if chain.last_status is not None or chain.last_seq:
            return []
        chain.last_status = CREATED_STATUS
        return self._release(run_id, chain, now)

    def _release(self, run_id: str, chain: _Chain, now: float) -> list[Step]:
        """Hand on held events for as long as the lowest follows the last one handed on."""
        steps: list[Step] = []
        while chain.held:
            seq = min(chain.held)
            event = chain.held[seq]
            if isinstance(event, _Lost):
                steps.append(Gap(run_id, chain.last_seq, None, (event.event_id,)))
                del chain.held[seq]
                chain.last_seq, chain.last_status = seq, None  # the chain goes on from whatever comes next
            elif chain.last_status is None or _follows(chain.last_status, event):
                steps.append(self._hand_on(chain, seq))
            else:
                break
        if not chain.held:
            chain.held_since = None
        elif steps or chain.held_since is None:
            chain.held_since = now  # the lowest held now waits from here
        return steps

    def _give_up(self, run_id: str, chain: _Chain, now: float) -> list[Step]:
        """The predecessor of the lowest held event did not come in time: report the gap, go on from it."""
        seq = min(chain.held)
        chain.last_status, gap = None, Gap(run_id, chain.last_seq, seq)
        return [gap, *self._release(run_id, chain, now)]

    def _hand_on(self, chain: _Chain, seq: int) -> Deliver:
        event = chain.held.pop(seq)
        assert isinstance(event, Envelope)
        chain.last_seq, chain.last_status = seq, event.payload.status
        self._remember(event.event_id)
        return Deliver(event)

    def _chain(self, run_id: str) -> _Chain:
        chain = self._chains.get(run_id)
        if chain is None:
            chain = self._chains[run_id] = _Chain()
            while len(self._chains) > self.remember:
                self._chains.popitem(last=False)
        else:
            self._chains.move_to_end(run_id)
        return chain

    def _remember(self, event_id: str) -> None:
        self._handed[event_id] = None
        while len(self._handed) > self.remember:
            self._handed.popitem(last=False)


def _follows(last_status: str, event: Envelope) -> bool:
    """Whether ``event`` comes straight after an event that left its run in ``last_status``."""
    if event.payload.event_type == "run.status_changed":
        return event.payload.data.get("from") == last_status
    return event.payload.status == last_status
