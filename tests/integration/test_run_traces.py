"""One trace per run, across every service, exported over OTLP/HTTP to a receiver in the test.

Two runs of two tenants call a tool, ask the model, nap until a timer wakes them (both in one
timer batch), wait for a webhook and complete. Each run's spans, from the scheduler's span for its
run.create (the root stored with the run) to the publish of its COMPLETED event, share one trace
id, and no span of one run is in the other's trace. Every span of a run, whatever woke it, is a
child of the root and links to the span that made the message that caused it; the tool call and
the model call have spans of their own. A tool's log line is a JSON line naming its run and trace.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from longrun_dependency_upgrade.forge import sign_payload
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures import eventually
from tests.integration.ensemble import WEBHOOK_SECRET, Ensemble, new_key, publish_create, run_id_for
from tests.integration.otlp_receiver import ReceivedSpan, Receiver
from tests.integration.traced_kind import NAP

pytestmark = pytest.mark.integration

SIGNAL_SECRET = "signal-own-secret"
"""The signal provider's secret: each provider has its own."""
MODULES = {"gateway": "longrun.services.gateway", "scheduler": "longrun.services.scheduler", "worker": "longrun.services.worker",
           "relay": "longrun.services.outbox_relay", "timer": "longrun.services.timer", "reconciler": "longrun.services.reconciler"}
SERVICES = {f"longrun-{name}" for name in ("scheduler", "outbox-relay", "worker", "timer", "gateway")}


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    received = Receiver()
    yield received
    received.close()


async def _waiting_on(engine: AsyncEngine, run_id: str) -> str | None:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT wait_correlation_key FROM runs WHERE run_id = :r AND status = "
                                        "'WAITING_EVENT'"), {"r": run_id})).scalar()


async def _row(engine: AsyncEngine, run_id: str) -> tuple[str, str]:
    async with engine.connect() as conn:
        status, root = (await conn.execute(text("SELECT status, trace_root FROM runs WHERE run_id = :r"),
                                           {"r": run_id})).one()
        return status, root


async def _completed_event(engine: AsyncEngine, run_id: str) -> str:
    """The event id of the run's broadcast that it COMPLETED."""
    async with engine.connect() as conn:
        return (await conn.execute(text(
            "SELECT event_id FROM outbox WHERE aggregate_id = :r AND type = 'run.event' "
            "AND payload -> 'payload' ->> 'status' = 'COMPLETED' ORDER BY id LIMIT 1"), {"r": run_id})).scalar_one()


@pytest.mark.long
async def test_each_run_is_one_trace_across_every_service_through_a_timer_and_a_webhook(
        clean, engine, bus, services, tmp_path, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    # Given every service exporting spans over OTLP/HTTP to the receiver (the timer not started yet)
    ensemble = Ensemble(services, tmp_path)
    env = {"LONGRUN_RUN_KINDS": "tests.integration.traced_kind:kinds",
           "LONGRUN_WEBHOOK_PROVIDERS": "signal=tests.integration.traced_kind:signal",
           "LONGRUN_WEBHOOK_SECRETS": f"forge={WEBHOOK_SECRET},signal={SIGNAL_SECRET}",
           "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    for name in ("gateway", "scheduler", "relay", "worker", "reconciler"):
        ensemble.start(name, MODULES[name], **env)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    # When two tenants each create a run
    keys = {"acme": new_key(), "beta": new_key()}
    for tenant, key in keys.items():
        await publish_create(bus, tenant=tenant, key=key, input_={}, workflow="traced")

    async def created() -> bool:
        return all([await run_id_for(engine, tenant, key) for tenant, key in keys.items()])

    await eventually(created, timeout=30, what="both runs created")
    runs = {tenant: await run_id_for(engine, tenant, key) for tenant, key in keys.items()}
    # and both nap, their naps' timers due, before the timer service fires them in one batch
    for run_id in runs.values():
        await eventually(lambda: _is(engine, run_id, f"nap/{run_id}"), timeout=30, what=f"{run_id} napping")
    await asyncio.sleep(NAP + 0.5)
    timer = ensemble.start("timer", MODULES["timer"], **env)
    for run_id in runs.values():
        await eventually(lambda: _is(engine, run_id, f"signal/{run_id}"), timeout=30, what=f"{run_id} woken")
    assert '"fired 2 timer(s) applied=2' in timer.output(), timer.output()[-2000:]
    # and a signed webhook signals each
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as gateway:
        for run_id in runs.values():
            body = json.dumps({"id": f"sig-{run_id}", "key": f"signal/{run_id}"}).encode()
            answer = await gateway.post("/webhooks/signal", content=body, headers={
                "x-forge-signature": sign_payload(SIGNAL_SECRET, body), "content-type": "application/json"})
            assert answer.status_code < 300, answer.text
    for run_id in runs.values():
        await eventually(lambda: _status_is(engine, run_id, "COMPLETED"), timeout=30, what=f"{run_id} completed")
    # Then each run's spans are one trace, rooted at the root stored with it, across every service
    roots = {tenant: (await _row(engine, run_id))[1] for tenant, run_id in runs.items()}
    traces = {tenant: root.split("-")[1] for tenant, root in roots.items()}
    assert traces["acme"] != traces["beta"]
    finals = {tenant: await _completed_event(engine, run_id) for tenant, run_id in runs.items()}

    async def exported() -> bool:
        spans = receiver.received()
        return all(any(s.attributes.get("messaging.message.id") == finals[t] for s in spans) for t in runs)

    await eventually(exported, timeout=30, what="the COMPLETED events' publish spans exported")
    await asyncio.sleep(1.0)  # the batches still in flight in other services
    spans = receiver.received()
    for tenant, run_id in runs.items():
        other = runs["beta" if tenant == "acme" else "acme"]
        mine = [s for s in spans if s.trace_id == traces[tenant]]
        root_span_id = roots[tenant].split("-")[2]
        root = [s for s in mine if s.span_id == root_span_id]
        # from the scheduler's span for its run.create ...
        assert [(s.service, s.name) for s in root] == [("longrun-scheduler", "process longrun.scheduler.ingress")]
        # ... to the publish of its COMPLETED event
        assert any(s.name.startswith("publish ") and s.attributes.get("messaging.message.id") == finals[tenant]
                   for s in mine), tenant
        assert SERVICES <= {s.service for s in mine}, {s.service for s in mine}
        # every span that names a run is in that run's trace; none of the other run's is in this one
        assert all(s.trace_id == traces[tenant] for s in spans if s.attributes.get("longrun.run_id") == run_id)
        assert not [s for s in mine if s.attributes.get("longrun.run_id") == other]
        # the timer's fire, the webhook's intake and the worker's steps are children of the root ...
        children = {(s.service, s.name.split(" ")[0]) for s in mine if s.parent_span_id == root_span_id}
        assert {("longrun-timer", "fire"), ("longrun-gateway", "webhook"), ("longrun-worker", "process"),
                ("longrun-worker", "advance"), ("longrun-outbox-relay", "publish")} <= children, children
        # ... each consumer's and publisher's span linked to the span that made its message, in this trace
        linked = [s for s in mine if s.name.startswith(("process longrun.worker", "publish "))]
        assert linked and all(s.links and all(t == traces[tenant] for t, _ in s.links) for s in linked)
        # the tool call and the model call have their spans, with the GenAI attributes
        tool = _named(mine, "execute_tool traced.note")
        assert tool.attributes["gen_ai.tool.name"] == "traced.note"
        model = _named(mine, "chat ScriptedModel")
        assert (model.attributes["gen_ai.usage.input_tokens"], model.attributes["gen_ai.usage.output_tokens"],
                model.attributes["longrun.model.cost_usd"]) == (200, 50, 0.001)
    # And the tool's log line is a JSON line naming its run and its trace
    worker_lines = [json.loads(line) for p in services.started if p.name.startswith("worker")
                    for line in p.output().splitlines() if line.startswith("{")]
    for tenant, run_id in runs.items():
        (noted,) = [line for line in worker_lines if line["message"] == f"noting run {run_id}"]
        assert (noted["service"], noted["run_id"], noted["tenant"], noted["trace_id"]) == (
            "worker", run_id, tenant, traces[tenant])


def _named(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, sorted({s.name for s in spans}))
    return found[0]


async def _is(engine: AsyncEngine, run_id: str, key: str) -> bool:
    return await _waiting_on(engine, run_id) == key


async def _status_is(engine: AsyncEngine, run_id: str, status: str) -> bool:
    return (await _row(engine, run_id))[0] == status
