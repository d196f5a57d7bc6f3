"""A ``run.wakeup`` as the outbox keeps it, the wake as data, and the one function that renders it.

A wakeup asks a worker to advance a run: it names the run and the revision it expects, why and who
woke it, and carries its own id and time. The outbox keeps exactly that (``wake``), and the relay
renders the envelope when it publishes (``render``). So a statement that chooses the run it wakes,
a finished run's slot handed on (``db.runs``) or a batch of timers (``db.timers``), writes data,
not a message; every wakeup on the bus is rendered here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longrun.envelope import ENVELOPES, LATEST, Envelope
from longrun.envelope.model import new_event_id, utcnow

TYPE = "run.wakeup"
KEPT = ("event_id", "occurred_at", "tenant_id", "run_id", "revision", "reason", "cause", "producer", "trace")
"""What the outbox keeps of a wakeup, by key: the JSON object ``render`` reads."""


def wake(*, tenant_id: str, run_id: str | None, revision: int | None, reason: str, cause: str | None, producer: str,
         trace: str | None = None, event_id: str | None = None, occurred_at: str | None = None) -> dict[str, Any]:
    """A wakeup as the outbox keeps it: the run it wakes at ``revision``, ``reason`` and ``cause`` (what
    made the run ready: a message's event_id, or who acted), with a fresh id and the time now unless
    given (``occurred_at``: ISO 8601 text, which a batch of wakes made at one time shares)."""
    return {"event_id": event_id or new_event_id(), "occurred_at": occurred_at or utcnow().isoformat(),
            "tenant_id": tenant_id, "run_id": run_id, "revision": revision, "reason": reason, "cause": cause,
            "producer": producer, "trace": trace}


def render(kept: Mapping[str, Any]) -> dict[str, Any]:
    """The wakeup's envelope in its JSON form, from what the outbox keeps (``wake``). Its ``wakeup_id``
    is its event id: one id per wakeup, which a redelivered copy shares."""
    return {"event_id": kept["event_id"], "type": TYPE, "schema_version": LATEST[TYPE], "producer": kept["producer"],
            "tenant_id": kept["tenant_id"], "trace": kept["trace"], "run_id": kept["run_id"], "step_id": None,
            "attempt_id": None, "causation_id": kept["cause"], "correlation_id": None,
            "expected_state_version": kept["revision"], "occurred_at": kept["occurred_at"], "data_class": "internal",
            "payload": {"wakeup_id": kept["event_id"], "reason": kept["reason"]}}


def envelope(kept: Mapping[str, Any]) -> Envelope:
    """``render``'s envelope, parsed: for a writer that hands it on in memory as well as to the outbox."""
    return ENVELOPES[(TYPE, LATEST[TYPE])].model_validate(render(kept))


def kept_of(envelope: Envelope) -> dict[str, Any]:
    """What the outbox keeps of a wakeup made elsewhere (a test's, an operator tool's): its wake."""
    return wake(tenant_id=envelope.tenant_id, run_id=envelope.run_id, revision=envelope.expected_state_version,
                reason=envelope.payload.reason, cause=envelope.causation_id, producer=envelope.producer,
                trace=envelope.trace, event_id=envelope.event_id, occurred_at=envelope.occurred_at.isoformat())
