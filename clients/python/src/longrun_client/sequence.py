"""Which of a tenant's event deliveries a consumer sees: each event once, a run's status events in order.

Delivery is at least once: the runtime's relay may publish an event again after a crash, so the
same event_id can arrive twice. This is the live view of ``Client.events``, which never waits: a
status event whose ``seq`` is not above the last one seen for its run (a repeat, or one that
arrived after a later one) is dropped, so the consumer sees a run's events in ``seq`` order, each
once, but may miss one. ``Client.consume`` holds such events back instead
(``longrun_client.resequence``).
"""

from __future__ import annotations

from collections import OrderedDict

from longrun_client.bus import TERMINAL_STATUSES
from longrun_client.model import Envelope

__all__ = ["Sequencer"]


class Sequencer:
    """Filters one consumer's deliveries: by run or correlation id, then once each, then in seq order.

    Filtered by ``correlation_id``, a run is followed from its ``run.accepted`` on by run id too, so a
    repeated create with another correlation id does not lose the run's status events. Memory is
    bounded: the last ``remember`` event ids, and a last seq per run until its terminal event.
    """

    def __init__(self, *, run_id: str | None = None, correlation_id: str | None = None,
                 remember: int = 100_000) -> None:
        self.run_id = run_id
        self.correlation_id = correlation_id
        self.remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._last_seq: dict[str, int] = {}
        self._followed: set[str] = set()

    def admit(self, envelope: Envelope) -> bool:
        """True when the consumer should see this delivery (and it is now remembered as seen)."""
        if not self._wanted(envelope) or envelope.event_id in self._seen:
            return False
        self._seen[envelope.event_id] = None
        if len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        if envelope.type == "run.event" and envelope.run_id is not None:
            return self._in_order(envelope.run_id, envelope.payload.seq, envelope.payload.status)
        return True

    def _wanted(self, envelope: Envelope) -> bool:
        if self.run_id is not None and envelope.run_id != self.run_id:
            return False
        if self.correlation_id is None or envelope.run_id in self._followed:
            return True
        if envelope.correlation_id != self.correlation_id:
            return False
        if envelope.type == "run.accepted":
            self._followed.add(envelope.payload.run_id)
        return True

    def _in_order(self, run_id: str, seq: int, status: str) -> bool:
        if seq <= self._last_seq.get(run_id, 0):
            return False
        if status in TERMINAL_STATUSES:
            self._last_seq.pop(run_id, None)
            self._followed.discard(run_id)
        else:
            self._last_seq[run_id] = seq
        return True
