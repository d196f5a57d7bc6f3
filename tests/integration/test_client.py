"""longrun-client against the real ensemble: create a run, hear it accepted, wait for its outcome."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from longrun_client import Client, Envelope, RunRejected
from opentelemetry.sdk.trace import TracerProvider

from tests.infra import Infra
from tests.integration.ensemble import Ensemble

pytestmark = pytest.mark.integration

CALLER = TracerProvider().get_tracer("tests")


@pytest.fixture
def ensemble(services, tmp_path) -> Ensemble:  # type: ignore[no-untyped-def]
    started = Ensemble(services, tmp_path)
    for name, module in (("scheduler", "longrun.services.scheduler"), ("worker", "longrun.services.worker"),
                         ("relay", "longrun.services.outbox_relay")):
        started.start(name, module)
    return started


@pytest.mark.timeout(300)
async def test_a_created_run_is_accepted_then_ends_with_its_outcome_and_its_events_come_in_order(
        clean, infra: Infra, ensemble: Ensemble) -> None:  # type: ignore[no-untyped-def]
    key = f"key-{uuid.uuid4().hex[:10]}"
    async with await Client.connect(infra.amqp_url, producer="tests") as client:
        # Given a stream of the creates with the key as correlation id, opened before anything is sent
        stream = await client.events("acme", correlation_id=key)
        # When a producer creates a 2-step run inside a span of its own
        with CALLER.start_as_current_span("checkout") as span:
            request = await client.create_run("acme", "steps", {"steps": 2}, idempotency_key=key,
                                              labels={"order": "o-1"})
        # Then the run.create carries the producer's trace, and the create is accepted as one new run
        assert request.trace is not None and request.trace.split("-")[1] == f"{span.get_span_context().trace_id:032x}"
        accepted = await client.accepted(request, timeout=60)
        assert (accepted.payload.workflow, accepted.payload.repeated, accepted.payload.labels) == (
            "steps", False, {"order": "o-1"})
        # and waiting gives the outcome the terminal event carries
        outcome = await client.wait(key, timeout=180)
        assert outcome.status == "COMPLETED"
        assert outcome.acceptance is not None and outcome.acceptance.evidence == {"steps": 2}
        assert [(r.logical_action, r.tool) for r in outcome.receipts] == [("step:0", "bench.echo"),
                                                                           ("step:1", "bench.echo")]
        # and the stream saw run.accepted, then the run's status events in rising seq, ending there
        seen = await _until_terminal(stream)
        assert seen[0].type == "run.accepted" and seen[0].event_id == accepted.event_id
        statuses = [e.payload for e in seen[1:]]
        assert [s.seq for s in statuses] == sorted({s.seq for s in statuses})
        assert statuses[-1].status == "COMPLETED" and statuses[-1].outcome == outcome
        assert {e.run_id for e in seen} == {accepted.payload.run_id}

        # When the same create is sent again, Then it is answered with the same run, as a repeat
        again = await client.create_run("acme", "steps", {"steps": 2}, idempotency_key=key, labels={"order": "o-1"})
        repeated = await client.accepted(again, timeout=60)
        assert (repeated.payload.run_id, repeated.payload.repeated) == (accepted.payload.run_id, True)
        assert repeated.event_id != accepted.event_id
        # and, the run having ended, the answer carries its outcome: waiting on the repeat returns at once
        assert repeated.payload.outcome == outcome
        assert await client.wait(again, timeout=1) == outcome


@pytest.mark.timeout(120)
async def test_a_refused_create_raises_with_the_rejection_from_accepted_and_from_wait(
        clean, infra: Infra, ensemble: Ensemble) -> None:  # type: ignore[no-untyped-def]
    async with await Client.connect(infra.amqp_url, producer="tests") as client:
        # When a producer asks for a workflow nobody registered
        request = await client.create_run("acme", "no_such_workflow", {}, idempotency_key=f"k-{uuid.uuid4().hex}",
                                          correlation_id="order-404")
        # Then both the answer and the wait raise the refusal, naming the create and why
        with pytest.raises(RunRejected) as refused:
            await client.accepted("order-404", timeout=60)
        rejection = refused.value.rejection
        assert (rejection.code, rejection.refused_event_id) == ("unknown_workflow", request.event_id)
        assert "no_such_workflow" in rejection.reason
        with pytest.raises(RunRejected):
            await client.wait(request, timeout=5)


async def _until_terminal(stream) -> list[Envelope]:  # type: ignore[no-untyped-def]
    seen: list[Envelope] = []
    async with stream:
        async with asyncio.timeout(30):
            async for event in stream:
                seen.append(event)
                if event.type == "run.event" and event.payload.outcome is not None:
                    return seen
    raise AssertionError(f"the stream ended before the run did: {[e.type for e in seen]}")
