"""What a client has heard about one run.create it sent, until the run ends.

Matched precisely, not by correlation id alone (a producer may reuse one for many creates, and the
same idempotency key sent twice makes two creates of one run): the answer to a create names it as
its cause (``causation_id``, and a refusal's ``refused_event_id``); from the answer on, the run's
status events are matched by its run id.
"""

from __future__ import annotations

import asyncio

from longrun_client.bus import TERMINAL_STATUSES
from longrun_client.errors import RunRejected
from longrun_client.model import Envelope
from longrun_client.payloads import RunOutcomeV3

__all__ = ["PendingCreate", "correlation_id_of"]


def correlation_id_of(request: Envelope) -> str:
    """The correlation id every event of the created run carries: the producer's, else the idempotency key."""
    return request.correlation_id or request.payload.idempotency_key


class PendingCreate:
    """Two answers awaited for one create: accepted-or-rejected, then the run's terminal event.

    Each future settles once, with the event, or with None when the client closes first; a
    refusal settles both (there will be no run)."""

    def __init__(self, request: Envelope) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.run_id: str | None = None
        self.answer: asyncio.Future[Envelope | None] = loop.create_future()
        self.end: asyncio.Future[Envelope | None] = loop.create_future()

    @property
    def finished(self) -> bool:
        return self.end.done()

    def offer(self, event: Envelope) -> None:
        """Take whatever of the tenant's events concerns this create; ignore the rest (and repeats)."""
        sent = self.request.event_id
        if event.type == "run.accepted" and event.causation_id == sent:
            self.run_id = event.payload.run_id
            _settle(self.answer, event)
            if event.payload.outcome is not None:  # a repeat of a run that had ended: nothing more comes
                _settle(self.end, event)
        elif event.type == "run.rejected" and sent in (event.causation_id, event.payload.refused_event_id):
            _settle(self.answer, event)
            _settle(self.end, event)
        elif (event.type == "run.event" and self.run_id is not None and event.run_id == self.run_id
              and (event.payload.outcome is not None or event.payload.status in TERMINAL_STATUSES)):
            _settle(self.end, event)

    def close(self) -> None:
        _settle(self.answer, None)
        _settle(self.end, None)

    def accepted(self) -> Envelope:
        """The run.accepted of a settled answer; RunRejected for a refusal."""
        return _unless_rejected(self.answer.result(), "accepted")

    def outcome(self) -> RunOutcomeV3:
        """How the run ended, from its terminal event; RunRejected for a refusal."""
        event = _unless_rejected(self.end.result(), "ended")
        if event.type == "run.accepted":
            return event.payload.outcome
        return event.payload.outcome or RunOutcomeV3(status=event.payload.status)


def _settle(future: asyncio.Future[Envelope | None], value: Envelope | None) -> None:
    if not future.done():
        future.set_result(value)


def _unless_rejected(event: Envelope | None, what: str) -> Envelope:
    if event is None:
        raise ConnectionError(f"the client was closed before the run {what}")
    if event.type == "run.rejected":
        raise RunRejected(event)
    return event
