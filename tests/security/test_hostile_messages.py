"""Messages the fuzzer (tests/fuzz) found ending a consumer's loop or retried forever: each is now kept in
quarantine with its reason, at once, and the consumer goes on with the next message."""

from __future__ import annotations

import asyncio
import json

import aio_pika
import pytest
from sqlalchemy import text

from longrun.bus import topology
from longrun.bus.codec import to_message
from longrun.bus.consumer import QueueConsumer
from longrun.envelope import make
from longrun.services.reconciler.dead_letters import ingest_quarantine_queue
from tests.fixtures import DELIVERY_LIMIT, eventually
from tests.integration.bus_helpers import create_probe_table, publish, route, wakeup
from tests.integration.ensemble import Ensemble, new_key, publish_create, run_id_for
from tests.probe_consumer import make_handler

pytestmark = pytest.mark.integration


async def _quarantine(engine, n: int) -> list:  # type: ignore[no-untyped-def, type-arg]
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT * FROM quarantine ORDER BY id"))).all()
    return rows if len(rows) >= n else []


async def test_a_message_whose_properties_and_headers_hold_nul_is_quarantined_and_the_consumer_goes_on(
        clean, engine, bus) -> None:
    # Given a consumer of a worker partition
    await create_probe_table(engine)
    exchange, key, k = route("run-hostile")
    consumer = QueueConsumer(bus=bus, engine=engine, service="worker", queue=topology.partition_queue("worker", k),
                             handler=make_handler("in-test"), prefetch=10, max_attempts=2)
    await consumer.start()
    try:
        # When a body that is not an envelope arrives with U+0000 in its message id, type and headers,
        # claiming a type with U+0000 and a schema version beyond any integer column
        body = json.dumps({"type": "run.\x00", "schema_version": 2**64}).encode()
        await bus.publish(exchange, key, aio_pika.Message(body=body, message_id="m\x00", type="t\x00",
                                                          headers={"h\x00": "v\x00", "n": {"x": "\x00"}}))
        # and a valid wakeup after it
        await publish(bus, wakeup("run-hostile", "w-after"))
        # Then the first is kept whole with the text around it made storable, the second handled
        rows = await eventually(lambda: _quarantine(engine, 1), what="the hostile message quarantined")
        assert (rows[0].body, rows[0].message_id, rows[0].message_type, rows[0].schema_version) == (
            body, "m\\x00", "run.\\x00", None)
        assert rows[0].headers["h\\x00"] == "v\\x00" and rows[0].error_code == "decode_error"
        await eventually(lambda: _handled(engine, "w-after"), what="the next message handled")
        assert consumer.alive
    finally:
        await consumer.stop()


async def _handled(engine, wakeup_id: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return bool((await conn.execute(text("SELECT count(*) FROM probe_handled WHERE wakeup_id = :w"),
                                        {"w": wakeup_id})).scalar())


async def test_the_ingress_quarantines_what_is_not_a_readable_run_create_at_once_and_still_creates_runs(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the scheduler
    Ensemble(services, tmp_path).start("scheduler", "longrun.services.scheduler")
    # When a wakeup arrives on the ingress, and a run.create whose id holds U+0000 (its answer could not
    # be stored), and then a valid run.create
    stray = wakeup("run-stray", "w-stray")
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(stray))
    nul_id = make("run.create", {"workflow": "steps", "idempotency_key": "k"}, producer="tests", tenant_id="t")
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", aio_pika.Message(
        body=nul_id.model_dump_json().replace(nul_id.event_id, "e\\u0000").encode()))
    # and a run.signal that names no signal_id and a name no kind could declare
    signal = make("run.signal", {"signal_id": "s", "name": "ship"}, producer="tests", tenant_id="t", run_id="r")
    unnamed = {**signal.model_dump(mode="json"), "payload": {"name": "ship it!"}}
    await bus.publish(topology.INGRESS_EXCHANGE, "run.signal", aio_pika.Message(body=json.dumps(unnamed).encode()))
    key = new_key()
    await publish_create(bus, tenant="t", key=key, input_={"steps": 1}, workflow="steps")
    # Then all three are quarantined on their first attempt, naming why, and the run is created
    assert await eventually(lambda: run_id_for(engine, "t", key), timeout=30, what="the valid run created")
    rows = await eventually(lambda: _quarantine(engine, 3), what="all three quarantined")
    assert [(r.error_code, r.attempts) for r in rows] == [("decode_error", 1)] * 3
    reasons = sorted(r.reason for r in rows)  # a batch quarantines what does not decode first
    assert "a run.wakeup on the ingress, where only run.create and run.signal are read" in reasons[0]
    assert "run.signal v1 failed validation: payload.signal_id: Field required; payload.name: String should " \
           "match pattern" in reasons[1]
    assert "the text at ['event_id'] holds U+0000" in reasons[2]


async def test_a_wakeup_naming_no_run_is_quarantined_at_once(clean, engine, bus, services, tmp_path) -> None:
    # Given a worker owning every partition
    Ensemble(services, tmp_path).start("worker", "longrun.services.worker")
    # When a wakeup without a run id reaches its queue
    stray = make("run.wakeup", {"wakeup_id": "w", "reason": "r"}, producer="tests", tenant_id="t")
    await bus.publish(topology.work_exchange("worker"), topology.partition_key(0), to_message(stray))
    # Then it is quarantined on its first attempt, naming why
    rows = await eventually(lambda: _quarantine(engine, 1), timeout=30, what="the wakeup quarantined")
    assert (rows[0].error_code, rows[0].attempts) == ("decode_error", 1)
    assert "names no run to wake" in rows[0].reason


async def test_a_dead_letter_whose_properties_and_headers_hold_nul_is_kept(clean, engine, bus) -> None:
    # Given the dead-letter keeper
    keeper = asyncio.create_task(ingest_quarantine_queue(bus, engine, delivery_limit=DELIVERY_LIMIT))
    try:
        # When a dead letter holds U+0000 in its message id, type, subject and headers
        await bus.publish(topology.QUARANTINE_EXCHANGE, "", aio_pika.Message(
            body=b"{}", message_id="d\x00", type="run.wakeup\x00",
            headers={"cloudEvents:subject": "run-\x00", "x-first-death-queue": "longrun.worker.p\x00",
                     "x-first-death-reason": "rejected"}))
        # Then it is kept, its text made storable
        rows = await eventually(lambda: _quarantine(engine, 1), what="the dead letter kept")
        assert (rows[0].message_id, rows[0].queue, rows[0].headers["cloudEvents:subject"]) == (
            "d\\x00", "longrun.worker.p\\x00", "run-\\x00")
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
