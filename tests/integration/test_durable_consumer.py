"""longrun-client's durable consumer against the real broker and services: it resumes where it stopped
across a broker-side connection close and across a killed process, hands every event of a run on once
and in seq order, and reports what the broker dropped past its length limit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from longrun_client import Client, Envelope, Gap, Missed
from longrun_client.bus import consumer_queue
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures import eventually
from tests.infra import Infra, ctl
from tests.integration.durable_consumer_process import record
from tests.integration.ensemble import ROOT, Ensemble

pytestmark = pytest.mark.integration

TENANT = "acme"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TERMINATED", "TIMED_OUT", "BUDGET_EXHAUSTED"}


@pytest.fixture
def ensemble(services, tmp_path) -> Ensemble:  # type: ignore[no-untyped-def]
    started = Ensemble(services, tmp_path)
    started.start_services("scheduler", "worker", "relay")
    return started


async def _create_and_finish(producer: Client, count: int, tag: str) -> list[str]:
    """Create ``count`` 2-step runs and wait for each to end; their run ids."""
    requests = [await producer.create_run(TENANT, "steps", {"steps": 2}, idempotency_key=f"{tag}-{n}")
                for n in range(count)]
    for request in requests:
        assert (await producer.wait(request, timeout=120)).status == "COMPLETED"
    return [(await producer.accepted(request)).payload.run_id for request in requests]


async def _published(engine: AsyncEngine, run_ids: Iterable[str]) -> dict[str, set[str]]:
    """Per run, the event ids the runtime publishes on the events exchange (run.accepted and run.event):
    its outbox rows, the relay's marks aside (it may not have marked the last ones yet)."""
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT aggregate_id, event_id FROM outbox WHERE exchange = 'longrun.events' "
                                       "AND aggregate_id = ANY(:runs)"),
                                  {"runs": list(run_ids)})
        published: dict[str, set[str]] = {}
        for run_id, event_id in rows:
            published.setdefault(run_id, set()).add(event_id)
        return published


def _assert_each_once_in_order(handled: list[dict[str, Any]], published: dict[str, set[str]]) -> None:
    """Every published event of these runs handed on exactly once, each run's status events in rising seq."""
    ids = [h["event_id"] for h in handled if h["run_id"] in published]
    assert len(ids) == len(set(ids)), "an event was handed on twice"
    assert set(ids) == set().union(*published.values())
    for run_id in published:
        seqs = [h["seq"] for h in handled if h["run_id"] == run_id and h["type"] == "run.event"]
        assert seqs == sorted(seqs) and seqs, (run_id, seqs)


def _queue_state(vhost: str, name: str) -> tuple[int, int] | None:
    """(messages, consumers) of a queue, as the broker counts them; None when it does not exist."""
    rows = json.loads(ctl("list_queues", "-p", vhost, "name", "messages", "consumers", "--formatter", "json",
                          "-q").stdout or "[]")
    return next(((r["messages"], r["consumers"]) for r in rows if r["name"] == name), None)


def _close_connection(connection_name: str) -> None:
    """Close, from the broker's side, the connection a client named ``connection_name``."""
    rows = ctl("list_connections", "pid", "client_properties", "-q", "--no-table-headers").stdout.splitlines()
    named = [row.split("\t")[0] for row in rows if f'"{connection_name}"' in row]
    assert len(named) == 1, rows
    ctl("close_connection", named[0], "test: the broker closes the consumer's connection")


@pytest.mark.timeout(300)
@pytest.mark.long
async def test_across_a_broker_side_connection_close_every_event_is_handed_on_once_in_order(
        clean, infra: Infra, engine: AsyncEngine, ensemble: Ensemble) -> None:  # type: ignore[no-untyped-def]
    if not infra.rabbitmqctl:
        pytest.skip("needs rabbitmqctl on a local broker to close a connection")
    name, connection_name = f"billing-{uuid.uuid4().hex[:8]}", f"durable-{uuid.uuid4().hex}"
    handled: list[dict[str, Any]] = []
    missed: list[Missed] = []

    async def handle(event: Envelope) -> None:
        handled.append(record(event))

    # Given a durable consumer on a connection that reconnects 10 s after it is lost
    url = f"{infra.amqp_url}?reconnect_interval=10"
    async with await Client.connect(url, producer="tests", connection_name=connection_name) as follower, \
            await Client.connect(infra.amqp_url, producer="tests") as producer:
        await follower.consume(TENANT, handle, name=name, on_missed=missed.append, window=2)
        # and runs it has followed to their end
        before = await _create_and_finish(producer, 3, f"before-{name}")
        await eventually(lambda: _ended(handled, before), timeout=30, what="the first runs' events")
        # When the broker closes its connection, and runs are created and end while it is away
        await asyncio.to_thread(_close_connection, connection_name)
        during = await _create_and_finish(producer, 3, f"during-{name}")
        # Then their events wait in its queue, with nobody consuming it
        waiting = await asyncio.to_thread(_queue_state, infra.vhost, consumer_queue(TENANT, name))
        assert waiting is not None and waiting[1] == 0 and waiting[0] >= 3 * 2, waiting
        # and once it has reconnected it hands on every event of every run, once each, in seq order
        await eventually(lambda: _ended(handled, during), timeout=60, what="the runs created while it was away")
        _assert_each_once_in_order(handled, await _published(engine, [*before, *during]))
        assert missed == []

        # When a create of a run that has ended is sent again, Then waiting on it answers at once
        again = await producer.create_run(TENANT, "steps", {"steps": 2}, idempotency_key=f"before-{name}-0")
        await producer.accepted(again, timeout=30)
        started = time.monotonic()
        assert (await producer.wait(again, timeout=5)).status == "COMPLETED"
        assert time.monotonic() - started < 0.5


@pytest.mark.timeout(300)
async def test_across_a_killed_consumer_process_every_event_is_handed_on_once_in_order(
        clean, infra: Infra, engine: AsyncEngine, ensemble: Ensemble,
        tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name, out = f"audit-{uuid.uuid4().hex[:8]}", tmp_path / "handled.jsonl"

    async def start(block_at: int = 0) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "tests/integration/durable_consumer_process.py"), "--url", infra.amqp_url,
            "--tenant", TENANT, "--name", name, "--out", str(out), "--block-at", str(block_at),
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), timeout=30) == b"consuming\n"
        return process

    async with await Client.connect(infra.amqp_url, producer="tests") as producer:
        # Given a consumer process whose handler hangs on the 4th event it is handed
        process = await start(block_at=4)
        first = await _create_and_finish(producer, 2, f"first-{name}")
        await eventually(lambda: _lines(out, 4), timeout=30, what="three events handled, the fourth taken")
        # When it is killed there (that event taken, not handled), and more runs end while it is gone
        process.send_signal(signal.SIGKILL)
        await process.wait()
        second = await _create_and_finish(producer, 2, f"second-{name}")
        # Then a new process of the same name hands on every event of every run, once each, in seq order
        process = await start()
        try:
            await eventually(lambda: _ended([line for line in _read(out) if "event_id" in line], [*first, *second]),
                             timeout=60, what="every run's end")
        finally:
            process.send_signal(signal.SIGTERM)
            await process.wait()
    lines = _read(out)
    assert [line for line in lines if "missed" in line] == []
    blocked = [line["blocked_on"] for line in lines if "blocked_on" in line]
    handled = [line for line in lines if "event_id" in line]
    _assert_each_once_in_order(handled, await _published(engine, [*first, *second]))
    # and the event the killed process had taken came again, with its event_id, and was handled once
    assert len(blocked) == 1 and [h["event_id"] for h in handled].count(blocked[0]) == 1


@pytest.mark.timeout(300)
async def test_events_the_broker_drops_past_the_length_limit_are_reported_as_a_gap(
        clean, infra: Infra, engine: AsyncEngine, ensemble: Ensemble) -> None:  # type: ignore[no-untyped-def]
    name = f"small-{uuid.uuid4().hex[:8]}"
    handled: list[dict[str, Any]] = []
    missed: list[Missed] = []

    async def handle(event: Envelope) -> None:
        handled.append(record(event))

    async with await Client.connect(infra.amqp_url, producer="tests") as client:
        # Given a consumer whose queue holds 4 events, stopped (its queue stays)
        consumer = await client.consume(TENANT, handle, name=name, on_missed=missed.append, max_length=4, window=2)
        await consumer.close()
        # When runs publish more than 4 events while it is stopped
        runs = await _create_and_finish(client, 3, f"over-{name}")
        published = await _published(engine, runs)
        assert sum(len(ids) for ids in published.values()) > 4
        # and it starts again
        await client.consume(TENANT, handle, name=name, on_missed=missed.append, max_length=4, window=2)
        # Then the 4 newest are handed on, and every one the broker dropped is reported lost, by id
        every = set().union(*published.values())
        await eventually(lambda: _accounted(handled, missed, every), timeout=30, what="every event accounted for")
    handed = {h["event_id"] for h in handled}
    lost = {i for gap in missed if isinstance(gap, Gap) for i in gap.lost_event_ids}
    assert len(handed) == 4 and handed | lost == every and not handed & lost


async def _ended(handled: list[dict[str, Any]], run_ids: list[str]) -> bool:
    """Whether the terminal event of each of these runs has been handed on."""
    return set(run_ids) <= {h["run_id"] for h in handled if h.get("status") in TERMINAL}


async def _accounted(handled: list[dict[str, Any]], missed: list[Missed], every: set[str]) -> bool:
    lost = {i for gap in missed if isinstance(gap, Gap) for i in gap.lost_event_ids}
    return {h["event_id"] for h in handled} | lost >= every


async def _lines(out: Path, count: int) -> bool:
    return len(_read(out)) >= count


def _read(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


@pytest.mark.timeout(300)
async def test_a_handler_that_raises_stops_the_consumer_and_its_event_comes_again_at_the_next_start(
        clean, infra: Infra, engine: AsyncEngine, ensemble: Ensemble) -> None:  # type: ignore[no-untyped-def]
    name = f"flaky-{uuid.uuid4().hex[:8]}"
    handled: list[dict[str, Any]] = []
    failed: list[str] = []
    missed: list[Missed] = []

    async def fail_once(event: Envelope) -> None:
        if not failed:
            failed.append(event.event_id)
            raise RuntimeError("the handler's database is down")
        handled.append(record(event))

    async def handle(event: Envelope) -> None:
        handled.append(record(event))

    async with await Client.connect(infra.amqp_url, producer="tests") as client:
        # Given a consumer whose handler raises on the first event it is handed
        consumer = await client.consume(TENANT, fail_once, name=name, on_missed=missed.append)
        runs = await _create_and_finish(client, 1, f"flaky-{name}")
        # Then the consumer stops, and join raises the handler's error
        with pytest.raises(RuntimeError, match="database is down"):
            await asyncio.wait_for(consumer.join(), timeout=30)
        # When it starts again under the same name, Then that event and the rest are handed on, once each
        await client.consume(TENANT, handle, name=name, on_missed=missed.append)
        await eventually(lambda: _ended(handled, runs), timeout=30, what="the run's end")
    assert failed[0] in {h["event_id"] for h in handled} and missed == []
    _assert_each_once_in_order(handled, await _published(engine, runs))
