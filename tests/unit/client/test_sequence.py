"""What a client's event stream lets through: each event once, a run's status events in seq order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from longrun_client import Envelope, make
from longrun_client.sequence import Sequencer
from longrun_client.stream import EventStream


def _status(run_id: str, seq: int, status: str = "RUNNING", *, correlation: str = "c-1",
            event_id: str | None = None) -> Envelope:
    meta: dict[str, Any] = {"event_id": event_id} if event_id else {}
    return make("run.event", {"seq": seq, "event_type": "run.status_changed", "status": status},
                producer="scheduler", tenant_id="acme", run_id=run_id, correlation_id=correlation, **meta)


def _accepted(run_id: str, correlation: str) -> Envelope:
    return make("run.accepted", {"run_id": run_id, "idempotency_key": "k", "workflow": "steps",
                                 "versions": {"workflow": "1", "prompt": "1", "model_policy": "1",
                                              "tool_schemas": "1"}},
                producer="scheduler", tenant_id="acme", run_id=run_id, correlation_id=correlation)


def _seen(sequencer: Sequencer, events: list[Envelope]) -> list[tuple[str | None, int]]:
    return [(e.run_id, e.payload.seq) for e in events if sequencer.admit(e)]


def test_a_redelivered_event_is_seen_once() -> None:
    sequencer = Sequencer()
    first = _status("r-1", 3)
    assert sequencer.admit(first) is True
    assert sequencer.admit(first) is False


def test_a_status_event_at_or_below_the_last_seq_of_its_run_is_dropped_and_runs_are_ordered_apart() -> None:
    # Given interleaved deliveries of two runs, with a late repeat (another event id) of run 1's seq 2
    sequencer = Sequencer()
    deliveries = [_status("r-1", 2), _status("r-2", 5), _status("r-1", 4), _status("r-1", 2),
                  _status("r-2", 5), _status("r-2", 9), _status("r-1", 3)]
    # Then each run's events come in rising seq order; what would go back is dropped, not held back
    assert _seen(sequencer, deliveries) == [("r-1", 2), ("r-2", 5), ("r-1", 4), ("r-2", 9)]


def test_a_run_filter_passes_that_run_only() -> None:
    sequencer = Sequencer(run_id="r-2")
    assert _seen(sequencer, [_status("r-1", 1), _status("r-2", 1), _status("r-1", 2)]) == [("r-2", 1)]


def test_a_correlation_filter_follows_the_run_it_was_accepted_as_even_under_another_correlation_id() -> None:
    # Given a stream for correlation id c-1 that sees its create accepted as run r-1
    sequencer = Sequencer(correlation_id="c-1")
    assert sequencer.admit(_accepted("r-1", "c-1")) is True
    # Then r-1's events pass whatever correlation id they carry, and other runs' do not
    assert sequencer.admit(_status("r-1", 2, correlation="c-other")) is True
    assert sequencer.admit(_status("r-9", 2, correlation="c-other")) is False
    assert sequencer.admit(_status("r-5", 2, correlation="c-1")) is True


def test_memory_is_bounded_and_a_finished_run_is_forgotten() -> None:
    # Given a sequencer that remembers two event ids
    sequencer = Sequencer(remember=2)
    events = [_status("r-1", 1), _status("r-1", 2), _status("r-1", 3, "COMPLETED")]
    assert _seen(sequencer, events) == [("r-1", 1), ("r-1", 2), ("r-1", 3)]
    # Then the oldest id was forgotten, the last two are still known, and the ended run keeps no seq
    assert sequencer.admit(events[2]) is False
    assert sequencer._last_seq == {}
    assert len(sequencer._seen) == 2


async def test_a_stream_yields_what_its_filter_admits_until_closed() -> None:
    # Given a stream of run r-1 over a tenant's deliveries
    listeners: set[Callable[[Envelope], None]] = set()
    closed: list[EventStream] = []
    stream = EventStream(listeners, run_id="r-1", correlation_id=None, on_close=closed.append)
    first = _status("r-1", 1)
    for event in (first, _status("r-2", 1), first, _status("r-1", 2)):
        for listener in tuple(listeners):
            listener(event)
    # When it is closed, Then what was buffered is still yielded, once each, and iteration ends
    async with stream:
        pass
    assert [e.payload.seq async for e in stream] == [1, 2]
    assert listeners == set() and closed == [stream]
