"""Signals: named messages a producer or operator sends to an open run, and a run's wait for one.

Responsibility: how a ``signal.received`` changes a run (the fact it records, the wait it ends), the
wait a ``WaitForSignal`` decision starts, and how ``decide`` reads the signals a run received.

Invariants:
- A signal is the fact ``signal:<signal_id>`` (``{"name", "payload"}``, its sender as the source):
  ``decide`` sees every signal the run received while open, whether or not it was waiting for it.
- A signal ends the pending wait only when that wait is for a signal of its name (kind ``signal``,
  key ``signal:<name>``); the wake names the signal's fact (``Wake.correlation_key``). Arriving
  while the run is open but not waiting for it, it is recorded and wakes nothing.
- After the run ended a signal is late (``evolve.is_late``): kept in the history, not applied.
- Deduplication by ``signal_id`` is the sender's side (``app.signals``): the same id is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from longrun.domain import events as ev
from longrun.domain.codec import FrozenMap, JsonValue, freeze
from longrun.domain.lifecycle import Handler, end_wait, put_fact
from longrun.domain.run import RunStatus
from longrun.domain.snapshot import SIGNAL_FACT_PREFIX, Fact, RunSnapshot, Wait, Wake, WakeReason

SIGNAL_WAIT = "signal"
"""The kind of a wait a signal ends."""


@dataclass(frozen=True, slots=True)
class ReceivedSignal:
    signal_id: str
    name: str
    payload: JsonValue
    sent_by: str
    received_at: float


def wait_key(name: str) -> str:
    """The correlation key of a wait for a signal named ``name``."""
    return f"{SIGNAL_WAIT}:{name}"


def signal_wait(wait_id: str, name: str, deadline: float) -> tuple[RunStatus, Wait]:
    """The status and wait a ``WaitForSignal`` records."""
    return RunStatus.WAITING_EVENT, Wait(wait_id=wait_id, kind=SIGNAL_WAIT, deadline=deadline,
                                         correlation_key=wait_key(name))


def waits_for(state: RunSnapshot, name: str) -> bool:
    """Whether the run's pending wait (also one a pause keeps) ends with a signal named ``name``."""
    wait = state.wait
    return wait is not None and wait.kind == SIGNAL_WAIT and wait.correlation_key == wait_key(name)


def received(state: RunSnapshot, name: str | None = None) -> tuple[ReceivedSignal, ...]:
    """The signals the run received (those named ``name``, if given), oldest first."""
    found = []
    for fact in state.facts:
        value = fact.value
        if not fact.key.startswith(SIGNAL_FACT_PREFIX) or not isinstance(value, FrozenMap):
            continue
        if name is None or value.get("name") == name:
            found.append(ReceivedSignal(fact.key.removeprefix(SIGNAL_FACT_PREFIX), str(value.get("name")),
                                        cast(JsonValue, value.get("payload")), fact.source, fact.recorded_at))
    return tuple(sorted(found, key=lambda s: s.received_at))


def woken_by(state: RunSnapshot) -> ReceivedSignal | None:
    """The signal whose arrival ended the run's last wait, if a signal did."""
    wake = state.last_wake
    if wake is None or wake.reason is not WakeReason.SIGNAL or wake.correlation_key is None:
        return None
    signal_id = wake.correlation_key.removeprefix(SIGNAL_FACT_PREFIX)
    return next((s for s in received(state) if s.signal_id == signal_id), None)


def _signal_received(s: RunSnapshot, e: ev.SignalReceived) -> RunSnapshot:
    key = SIGNAL_FACT_PREFIX + e.signal_id
    recorded = put_fact(s, Fact(key, freeze({"name": e.name, "payload": e.payload}), e.sent_by, e.at))
    if not waits_for(s, e.name):
        return recorded
    assert s.wait is not None
    return end_wait(recorded, e.at, Wake(WakeReason.SIGNAL, s.wait.wait_id, e.at, key))


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {ev.SignalReceived: _signal_received}
