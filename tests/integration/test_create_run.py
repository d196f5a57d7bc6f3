"""Creating runs (app/admit.py create_run) against the real database, one request at a time."""

from __future__ import annotations

import json

import psycopg
import pytest
from sqlalchemy import text

from longrun.app import admit, effects
from longrun.authoring import Registry
from longrun.db.engine import psycopg_dsn
from longrun.envelope import Envelope, decode, make
from longrun.workflows import registry

pytestmark = pytest.mark.integration


def _request(key: str) -> Envelope:
    return make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}},
                producer="tests", tenant_id="acme")


async def test_a_repeated_request_returns_its_run_even_once_its_workflow_is_no_longer_registered(
        clean, engine) -> None:
    # Given a run created under a key while its workflow was registered
    async with engine.begin() as conn:
        first = await admit.create_run(conn, _request("k-1"), kinds=registry(), partitions=8, slots=4)
    assert first["created"] is True
    # When the same request comes again to a scheduler that no longer knows that workflow
    async with engine.begin() as conn:
        again = await admit.create_run(conn, _request("k-1"), kinds=Registry(), partitions=8, slots=4)
    # Then it answers with the run that exists, not with a rejection
    assert again == {"run_id": first["run_id"], "created": False}
    # and a new key for that workflow is rejected with the reason
    async with engine.begin() as conn:
        unknown = await admit.create_run(conn, _request("k-2"), kinds=Registry(), partitions=8, slots=4)
    assert unknown["rejected"] is True and "steps" in unknown["reason"]


async def _create(engine, key: str, *, slots: int) -> dict:  # type: ignore[no-untyped-def,type-arg]
    async with engine.begin() as conn:
        return await admit.create_run(conn, _request(key), kinds=registry(), partitions=8, slots=slots)


async def _wakeups(engine) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def,type-arg]
    async with engine.connect() as conn:
        return [(r.aggregate_id, r.payload) for r in await conn.execute(text(
            "SELECT aggregate_id, payload FROM outbox WHERE type = 'run.wakeup' ORDER BY id"))]


async def test_the_creating_statement_admits_with_a_free_slot_queues_without_one_and_defers_to_those_queued(
        clean, engine) -> None:
    listener = await psycopg.AsyncConnection.connect(psycopg_dsn(engine.url.render_as_string(False)),
                                                     autocommit=True)
    await listener.execute(f"LISTEN {effects.ADMISSION_CHANNEL}")

    async def heard(seconds: float) -> list[str]:
        return [n.payload async for n in listener.notifies(timeout=seconds, stop_after=1)]

    try:
        # Given a tenant with one slot: a run created while it is free is admitted and woken at once
        first = await _create(engine, "k-1", slots=1)
        assert first["admitted"] is True
        [(run_id, wakeup)] = await _wakeups(engine)
        envelope = decode(json.dumps(wakeup).encode())
        assert (run_id, envelope.run_id, envelope.expected_state_version, envelope.payload.reason) == (
            first["run_id"], first["run_id"], 1, "admitted")
        # When the slot is taken, the next run is queued: no wakeup, and admission is not woken for nothing
        second = await _create(engine, "k-2", slots=1)
        assert "admitted" not in second
        assert len(await _wakeups(engine)) == 1
        assert await heard(0.5) == []
        # When slots are raised while a run is queued, a new run does not jump the queue: admission is
        # told, so it picks by priority and age
        third = await _create(engine, "k-3", slots=3)
        assert "admitted" not in third
        assert await heard(5) == ["acme"]
        assert len(await _wakeups(engine)) == 1
    finally:
        await listener.close()
    async with engine.connect() as conn:
        admitted = (await conn.execute(text("SELECT run_id FROM runs WHERE admitted_at IS NOT NULL"))).scalars().all()
    assert admitted == [first["run_id"]]
