"""Concurrency keys with the real services (scheduler, worker, relay, timer) and two tenant slots: the
run kinds of ``tests/integration/keyed_kinds.py`` hold ``repo:<repo>`` (limit one) while they wait
``hold`` seconds, each with its own policy (queue, cancel in progress, refuse)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from longrun.db import outbox
from longrun.services.gateway import api, reads
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, new_key, publish_create, run_id_for, status_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KINDS = "tests.integration.keyed_kinds:kinds"
MODULES = {"scheduler": "longrun.services.scheduler", "worker": "longrun.services.worker",
           "relay": "longrun.services.outbox_relay", "timer": "longrun.services.timer"}
TENANT = "acme"


def _start(services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    for name, module in MODULES.items():
        ensemble.start(name, module, LONGRUN_RUN_KINDS=KINDS, LONGRUN_TENANT_SLOTS="2")


async def _create(bus, engine, kind: str, **goal: Any) -> str:  # type: ignore[no-untyped-def]
    key = new_key()
    await publish_create(bus, tenant=TENANT, key=key, input_=goal, workflow=kind)
    return str(await eventually(lambda: run_id_for(engine, TENANT, key), what=f"the {kind} run"))


async def _reaches(engine, run_id: str, *statuses: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    async def there() -> bool:
        return await status_of(engine, run_id) in statuses

    await eventually(there, timeout=timeout, what=f"{run_id} {'/'.join(statuses)}")


async def _row(engine, run_id: str) -> Any:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text(
            "SELECT status, admitted_at, concurrency_key, concurrency_held_at, cancel_requested FROM runs "
            "WHERE run_id = :r"), {"r": run_id})).one()


async def _timeline(engine, run_id: str) -> list[tuple[str, dict[str, Any], datetime]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT type, data, recorded_at FROM run_events WHERE run_id = :r ORDER BY seq"),
                                  {"r": run_id})
        return [(r.type, r.data, r.recorded_at) for r in rows]


def _started(timeline: list[tuple[str, dict[str, Any], datetime]]) -> datetime:
    return next(at for kind, data, at in timeline if kind == "run.status_changed" and data["to"] == "RUNNING")


async def _waiting_for(engine, run_id: str) -> tuple[str | None, str | None]:  # type: ignore[no-untyped-def]
    """What the run waits for as ``GET /runs/{id}`` shows it, and as ``GET /runs`` lists it."""
    async with engine.connect() as conn:
        view = await reads.run_view(conn, run_id)
        listed = await reads.search_runs(conn, api.RunSearch(tenant_id=TENANT))
    assert view is not None
    [row] = [r for r in listed["runs"] if r["run_id"] == run_id]
    return view["waiting_for"], row["waiting_for"]


@pytest.mark.long
async def test_a_second_run_with_the_key_waits_holding_no_slot_and_runs_once_the_first_ends(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the services with two slots per tenant, and a run holding repo:acme/api for three seconds
    _start(services, tmp_path)
    first = await _create(bus, engine, "keyed_queue", repo="acme/api", hold=3)
    await _reaches(engine, first, "WAITING_EVENT")
    # When a second run of that repository is created, and then a run without a key
    second = await _create(bus, engine, "keyed_queue", repo="acme/api", hold=0.2)
    other = await _create(bus, engine, "keyed_queue", hold=0.2)
    # Then the run without a key runs at once: the waiting one holds back no run behind it, nor a slot
    # (two slots: the first run holds one, the keyless run the other)
    await _reaches(engine, other, "COMPLETED")
    waiting = await _row(engine, second)
    assert (waiting.status, waiting.admitted_at, waiting.concurrency_held_at) == ("READY", None, None)
    assert waiting.concurrency_key == "repo:acme/api"
    assert await _waiting_for(engine, second) == ("concurrency_key:repo:acme/api",) * 2
    assert await _waiting_for(engine, first) == (None, None)
    # And the second starts only once the first has ended, the key handed on with its slot
    await _reaches(engine, second, "COMPLETED")
    ended = next(at for kind, _, at in await _timeline(engine, first) if kind == "run.completed")
    assert _started(await _timeline(engine, second)) >= ended
    assert (await _row(engine, second)).concurrency_held_at >= ended


async def test_cancel_in_progress_cancels_the_first_through_the_cancel_protocol(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a run of a cancel-in-progress kind holding repo:acme/web for a minute
    _start(services, tmp_path)
    first = await _create(bus, engine, "keyed_cancel", repo="acme/web", hold=60)
    await _reaches(engine, first, "WAITING_EVENT")
    # When a second run of that repository is created
    second = await _create(bus, engine, "keyed_cancel", repo="acme/web", hold=0.2)
    # Then the first is asked to cancel (recorded, audited) and ends CANCELLED; the second then runs
    await _reaches(engine, first, "CANCELLED")
    assert (await _row(engine, first)).cancel_requested
    timeline = await _timeline(engine, first)
    [asked] = [data for kind, data, _ in timeline if kind == "run.cancel_requested"]
    assert asked["by"] == "concurrency_key:repo:acme/web" and second in asked["reason"]
    async with engine.connect() as conn:
        audited = (await conn.execute(text("SELECT actor FROM audit_log WHERE action = 'cancel' AND target = :r"),
                                      {"r": first})).scalars().all()
    assert audited == ["concurrency_key:repo:acme/web"]
    await _reaches(engine, second, "COMPLETED")
    cancelled = next(at for kind, data, at in await _timeline(engine, first)
                     if kind == "run.status_changed" and data["to"] == "CANCELLED")
    assert _started(await _timeline(engine, second)) >= cancelled


async def test_refuse_answers_run_rejected_and_creates_nothing_while_the_key_is_held(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a run of a refusing kind holding repo:acme/docs
    _start(services, tmp_path)
    first = await _create(bus, engine, "keyed_refuse", repo="acme/docs", hold=60)
    await _reaches(engine, first, "WAITING_EVENT")
    # When a second run of that repository is created
    key = new_key()
    await publish_create(bus, tenant=TENANT, key=key, input_={"repo": "acme/docs", "hold": 1}, workflow="keyed_refuse")

    async def answered() -> dict[str, Any] | None:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT type, payload FROM outbox WHERE type = 'run.rejected'"))).all()
        found = [outbox.envelope_of(r.type, r.payload)["payload"] for r in rows]
        return next((p for p in found if p["idempotency_key"] == key), None)

    # Then it is refused with concurrency_key_held naming the holder, and no run exists for it
    rejected = await eventually(answered, what="the run.rejected")
    assert rejected["code"] == "concurrency_key_held"
    assert first in rejected["reason"] and "repo:acme/docs" in rejected["reason"]
    assert await run_id_for(engine, TENANT, key) is None
    assert await status_of(engine, first) == "WAITING_EVENT"
