"""A run's live stream through the real services: status events in seq order and a call's chunks as it
emits them, none of them in the run's history; a reconnect with ``Last-Event-ID`` to another gateway
process misses and repeats no status event; a gateway that could keep only the last chunks says which
were missed; the console's run page shows a call's chunks as they arrive. The run kind is ``tests/integration/streaming_kinds.py``."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import expect
from sqlalchemy import text

from longrun_client import Chunk, ChunksMissed, Gap, StatusEvent, follow

from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.db import operator_reads, runs
from longrun.domain import PinnedVersions, Usage, freeze
from longrun.domain import events as ev
from longrun.domain.live_progress import Cursor
from longrun.envelope import make
from longrun.ports.runs import plan
from longrun.services.gateway import live
from tests.fixtures import eventually
from tests.integration import identities
from tests.integration.test_console import SHOTS, console_page
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble, new_key, run_id_for, status_of
from tests.ports import free_port

pytestmark = pytest.mark.integration
KINDS = "tests.integration.streaming_kinds:kinds"
AUTH = {"authorization": f"Bearer {OPERATOR_TOKEN}"}


async def _create(bus, engine, gate: Path, chunks: int) -> str:  # type: ignore[no-untyped-def]
    key = new_key()
    envelope = make("run.create", {"workflow": "chatty", "idempotency_key": key,
                                   "input": {"chunks": chunks, "gate": str(gate)}},
                    producer="tests", tenant_id="acme")
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    return str(await eventually(lambda: run_id_for(engine, "acme", key), what="the run"))


async def _sse(response: httpx.Response) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """(event, id, data) of each event of a Server-Sent Events stream."""
    event, id_, data = "message", "", ""
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, id_, json.loads(data)
            event, data = "message", ""
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("id: "):
            id_ = line[4:]
        elif line.startswith("data: "):
            data = line[6:]


def _open(gate: Path) -> None:
    gate.touch()
    Path(f"{gate}.done").touch()


async def _history(engine, run_id: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT seq, data::text AS data FROM run_events WHERE run_id = :r ORDER BY seq"),
                                  {"r": run_id})
        return [(r.seq, r.data) for r in rows]


async def test_a_follower_sees_status_events_in_order_and_chunks_live_and_resumes_on_another_gateway(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given two gateways, and a run whose call emits three chunks and a heartbeat, then waits for a gate
    ensemble = Ensemble(services, tmp_path)
    second = f"http://127.0.0.1:{free_port()}"
    ensemble.start_services("scheduler", "relay", "worker", "gateway", LONGRUN_RUN_KINDS=KINDS)
    ensemble.start("gateway-2", "longrun.services.gateway", LONGRUN_RUN_KINDS=KINDS,
                   LONGRUN_GATEWAY_PORT=second.rsplit(":", 1)[1])
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    await ensemble.wait_http(f"{second}/healthz")
    gate = tmp_path / "gate"
    run_id = await _create(bus, engine, gate, chunks=3)
    received: list[tuple[str, str, dict[str, Any]]] = []
    # When a follower reads the stream until the call's chunks came, while the call still runs
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=AUTH, timeout=30) as http:
        async with http.stream("GET", f"/runs/{run_id}/events/stream") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            async for event in _sse(response):
                received.append(event)
                if event[0] == "progress":
                    break
    assert not gate.exists() and await status_of(engine, run_id) == "RUNNING"
    chunks = [data["data"] for kind, _, data in received if kind == "chunk"]
    assert chunks == ["part 1", "part 2", "part 3"]
    assert received[-1][2]["data"] == {"said": 3}
    # and, the gate open, the client's follow resumes from that last id on the other gateway until the run ended
    _open(gate)
    resumed = [item async for item in follow(second, run_id, token=OPERATOR_TOKEN, last_event_id=received[-1][1])]
    # Then the status events are the run's history, each once, in seq order
    history = await _history(engine, run_id)
    seqs = [data["seq"] for kind, _, data in received if kind == "status"] + [
        item.seq for item in resumed if isinstance(item, StatusEvent)]
    assert seqs == [seq for seq, _ in history]
    assert [item.type for item in resumed if isinstance(item, StatusEvent)][-1] == "run.summary"
    assert await status_of(engine, run_id) == "COMPLETED"
    # the last chunk came live after the reconnect, no chunk twice and no gap
    assert [data["data"] for kind, _, data in received if kind == "chunk"] + [
        item.data for item in resumed if isinstance(item, Chunk) and item.kind == "chunk"] == [
        "part 1", "part 2", "part 3", "last part"]
    assert not [kind for kind, _, _ in received if kind == "gap"]
    assert not [item for item in resumed if isinstance(item, Gap | ChunksMissed)]
    # and no chunk is in the run's history
    assert not [data for _, data in history if "part" in data]


async def test_a_follower_that_comes_after_the_buffer_filled_is_told_which_chunks_it_missed(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a gateway keeping the last 4 chunks of a run, and a call that emitted 10 before anyone followed
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "relay", "worker", "gateway", LONGRUN_RUN_KINDS=KINDS,
                            LONGRUN_PROGRESS_BUFFER="4")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    gate = tmp_path / "gate"
    run_id = await _create(bus, engine, gate, chunks=10)
    async def emitted() -> bool:
        return Path(f"{gate}.said").exists()

    await eventually(emitted, timeout=30, what="the chunks emitted")
    received: list[tuple[str, str, dict[str, Any]]] = []
    # When a follower connects
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=AUTH, timeout=30) as http:
        async with http.stream("GET", f"/runs/{run_id}/events/stream") as response:
            async for event in _sse(response):
                received.append(event)
                if event[0] == "progress":
                    break
    _open(gate)
    # Then it gets a gap naming chunks 1 to 7 before the last ones the gateway kept
    told = [(kind, data.get("first"), data.get("last"), data.get("data")) for kind, _, data in received
            if kind in ("gap", "chunk")]
    assert told == [("gap", 1, 7, None), ("chunk", None, None, "part 8"), ("chunk", None, None, "part 9"),
                    ("chunk", None, None, "part 10")]


async def test_a_stream_of_another_tenants_run_or_from_a_bad_id_is_refused(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("gateway", LONGRUN_RUN_KINDS=KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    token = await identities.token(engine, "viewer-g", "viewer", tenants=("globex",))
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        missing = await http.get("/runs/no-such-run/events/stream", headers={"authorization": f"Bearer {token}"})
        bad = await http.get("/runs/no-such-run/events/stream", headers={**AUTH, "last-event-id": "x.y"})
        anonymous = await http.get("/runs/no-such-run/events/stream")
    assert (missing.status_code, bad.status_code, anonymous.status_code) == (404, 400, 401)
    assert "Last-Event-ID" in bad.json()["error"]


@pytest.mark.long
async def test_the_console_run_page_shows_a_calls_chunks_as_they_arrive(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Given a run whose call emitted three chunks and waits, and a viewer of its tenant on its run page
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "relay", "worker", "gateway", LONGRUN_RUN_KINDS=KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    viewer = await identities.token(engine, "vera", "viewer", tenants=("acme",))
    gate = tmp_path / "gate"
    run_id = await _create(bus, engine, gate, chunks=3)

    async def emitted() -> bool:
        return Path(f"{gate}.said").exists()

    await eventually(emitted, timeout=30, what="the chunks emitted")
    async with console_page(ensemble.gateway_url, viewer) as page:
        await page.goto(f"{ensemble.gateway_url}/console/runs/{run_id}")
        output = page.locator("#live-output")
        await expect(output).to_contain_text("say: part 3")
        await expect(output).to_contain_text('say progress: {"said":3}')
        # When the call emits one chunk more, the page still open
        gate.touch()
        # Then it shows up without a reload
        await expect(output).to_contain_text("say: last part")
        await page.screenshot(path=SHOTS / "5-live-output.png", full_page=True)
        # and once the call answered, the page follows the run to its end
        Path(f"{gate}.done").touch()
        await expect(page.locator("#status")).to_have_text("COMPLETED", timeout=30_000)
    # and the run's history holds none of its chunks
    assert not [data for _, data in await _history(engine, run_id) if "part" in data]


async def test_a_run_that_ends_between_the_streams_two_reads_loses_none_of_its_events(
        clean, engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Given a run just created, and its end (an operator's terminate, with its summary) committed by
    # another connection right after the stream's first read of a round, whichever read that is
    run_id = f"run-{uuid.uuid4()}"
    async with engine.begin() as conn:
        await runs.create(conn, ev.RunCreated(
            seq=1, at=time.time(), run_id=run_id, tenant_id="acme", kind="probe", goal=freeze({}),
            versions=PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="v1"),
            budget=Usage(model_calls=1, tool_calls=1, cost=1.0)), idempotency_key=run_id, input_hash="h" * 64,
            partition=0)
    ended = []

    async def end_after(read: Any, *args: Any, **kwargs: Any) -> Any:
        result = await read(*args, **kwargs)
        if not ended:
            ended.append(True)
            async with engine.begin() as conn:
                stored = await runs.load(conn, run_id)
                assert stored is not None
                await runs.write(conn, plan(stored, [ev.RunTerminated(
                    seq=stored.stored_seq + 1, at=time.time(), by="operator:ops", reason="no longer wanted")]))
        return result
    for module, name in ((runs, "history"), (operator_reads, "tenant_and_status")):
        monkeypatch.setattr(module, name, functools.partial(end_after, getattr(module, name)))
    # When a follower reads the stream from the start
    frames = [frame async for frame in live._events(engine, live.Hub(16), run_id, "acme", Cursor.parse(None))]
    # Then it gets every event of the run before the end
    sent = [(lines[0].removeprefix("event: "), json.loads(lines[2].removeprefix("data: ")))
            for lines in (frame.strip().split("\n") for frame in frames[1:])]
    assert [(kind, data.get("type")) for kind, data in sent] == [
        ("status", "run.created"), ("status", "run.terminated"), ("status", "run.summary"), ("end", None)]
    assert sent[-1][1] == {"status": "TERMINATED"}
