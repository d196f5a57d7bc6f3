"""A process that exports no spans still carries the trace: the caller's traceparent passes through."""

from __future__ import annotations

import pytest
from longrun_client.registry import traceparent
from opentelemetry.sdk.trace import TracerProvider

from longrun import otel
from longrun.envelope import make

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _made() -> str | None:
    return make("run.wakeup", {"wakeup_id": "w-1", "reason": "probe"}, producer="tests", tenant_id="t",
                run_id="run-1").trace


def test_without_an_exporter_the_messages_made_in_a_consumer_carry_the_callers_traceparent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a process set up as a service without an exporter (an SDK provider exporting nowhere)
    monkeypatch.setattr(otel, "tracer", TracerProvider().get_tracer("longrun"))
    monkeypatch.setattr(otel, "_exporting", False)
    # When it handles a message, and advances a run within that
    with otel.run_span("process q", None, cause=CALLER, attributes={"messaging.message.id": "m-1"}):
        assert _made() == CALLER
        with otel.run_span("advance run", otel.root(), cause=traceparent()):
            assert _made() == CALLER
    # Then what it makes carries the caller's traceparent, unchanged; and a message that came
    # with no trace starts none
    with otel.run_span("process q", None, cause=None):
        assert _made() is None
    assert _made() is None
