"""Schedules with the real services: the timer service fires a schedule every second whose runs last
longer than that, under the overlap policy "skip"; each due time makes one run when the schedule's run
before it had ended and is recorded as skipped otherwise, never two runs for one time; pause stops the
firing and resume goes on from the next due time; a schedule the timer cannot fire holds back no other.
A backfill over a past range makes exactly its runs, once however often it is asked; a schedule that
could never fire is refused (longrunctl's commands: ``tests/integration/test_longrunctl.py``). Runs are
``keyed_queue`` runs of ``tests/integration/keyed_kinds.py`` without a repository (no key of their
own): each waits ``hold`` seconds, then completes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from longrun.cadence import Cadence, Schedule
from longrun.db import schedules
from longrun.domain.schedules import Overlap
from tests.fixtures import eventually
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import bearer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EVERY_TENANT = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
KINDS = {"LONGRUN_RUN_KINDS": "tests.integration.keyed_kinds:kinds"}
TENANT = "acme"


@pytest.fixture
async def ensemble(clean, services, tmp_path):  # type: ignore[no-untyped-def]
    return Ensemble(services, tmp_path)


async def _fires(engine, schedule_id: str) -> list[Any]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return list((await conn.execute(text(
            "SELECT due_at, outcome, run_id, reason, backfill FROM schedule_fires WHERE schedule_id = :s "
            "ORDER BY due_at"), {"s": schedule_id})).all())


async def _runs(engine, schedule_id: str) -> list[Any]:  # type: ignore[no-untyped-def]
    """The schedule's runs: each with its key, status, when it started running and when it ended."""
    async with engine.connect() as conn:
        return list((await conn.execute(text(
            "SELECT r.run_id, r.idempotency_key, r.status, "
            "(SELECT min(recorded_at) FROM run_events e WHERE e.run_id = r.run_id AND e.type = 'run.status_changed' "
            " AND e.data->>'to' = 'RUNNING') AS started, "
            "(SELECT max(recorded_at) FROM run_events e WHERE e.run_id = r.run_id AND e.type = 'run.completed') "
            " AS ended FROM runs r WHERE r.tenant_id = :t AND r.idempotency_key LIKE :k ORDER BY r.idempotency_key"),
            {"t": TENANT, "k": f"schedule:{schedule_id}:%"})).all())


def _schedule(**cadence: Any) -> dict[str, Any]:
    return {"tenant_id": TENANT, "run": {"workflow": "keyed_queue", "input": {"hold": 1.6}}, "overlap": "skip",
            "reason": "nightly scan", **cadence}


async def _steer(http: httpx.AsyncClient, schedule_id: str, act: str, **body: Any) -> httpx.Response:
    return await http.post(f"/schedules/{schedule_id}/{act}", headers=EVERY_TENANT,
                           json={"reason": "maintenance", **body})


@pytest.mark.long
async def test_skip_makes_one_run_per_due_time_whose_previous_run_ended_and_records_the_others(
        engine, ensemble) -> None:  # type: ignore[no-untyped-def]
    # Given the services, and a schedule every second whose runs last 1.6 s, overlap "skip"
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer", **KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    # (and, due before it, a schedule whose stored run this build cannot read: it must hold back no other)
    await _unreadable(engine, BROKEN)
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        made = await http.post("/schedules", headers=EVERY_TENANT, json=_schedule(every=1.0))
        assert made.status_code == 200, made.text
        schedule_id = made.json()["schedule_id"]

        # When it has fired for a while
        async def fired(n: int) -> bool:
            return len(await _fires(engine, schedule_id)) >= n

        await eventually(lambda: fired(7), timeout=30, what="seven due times fired")
        paused = await _steer(http, schedule_id, "pause")
        assert paused.status_code == 200 and paused.json()["paused"], paused.text
        assert (await _steer(http, schedule_id, "pause")).status_code == 409
        fires = await _fires(engine, schedule_id)

        # Then each due time is recorded once, one interval apart, none left out
        due = [f.due_at for f in fires]
        assert [b - a for a, b in zip(due, due[1:], strict=False)] == [timedelta(seconds=1)] * (len(due) - 1)
        created = [f for f in fires if f.outcome == "created"]
        skipped = [f for f in fires if f.outcome == "skipped"]
        assert len(created) + len(skipped) == len(fires) and created and skipped
        # and each run made is the one run of its time: runs never overlap, each starting after the one before ended
        async def all_ended() -> bool:
            return all(r.status == "COMPLETED" for r in await _runs(engine, schedule_id))

        await eventually(all_ended, timeout=20, what="the schedule's runs completed")
        runs = await _runs(engine, schedule_id)
        assert sorted(r.run_id for r in runs) == sorted(f.run_id for f in created)
        assert len({r.idempotency_key for r in runs}) == len(runs)
        assert all(r.idempotency_key.endswith(f.due_at.astimezone(UTC).isoformat(timespec="milliseconds"))
                   for r, f in zip(runs, created, strict=True))
        for before, after in zip(runs, runs[1:], strict=False):
            assert after.started >= before.ended
        # and each skipped time names the run that still held the schedule's key
        by_time = sorted(fires, key=lambda f: f.due_at)
        for i, fire in enumerate(by_time):
            if fire.outcome == "skipped":
                holder = next(f.run_id for f in reversed(by_time[:i]) if f.outcome == "created")
                assert fire.reason.startswith("concurrency_key_held") and holder in fire.reason
                assert f"schedule:{schedule_id}" in fire.reason

        # When it stays paused, nothing fires; resumed, it goes on from the next due time after now
        await asyncio.sleep(2.0)
        assert len(await _fires(engine, schedule_id)) == len(fires)
        resumed_at = datetime.now(UTC)
        resumed = await _steer(http, schedule_id, "resume")
        assert resumed.status_code == 200 and not resumed.json()["paused"], resumed.text
        await eventually(lambda: fired(len(fires) + 1), timeout=10, what="a due time fired after resuming")
        later = [f for f in await _fires(engine, schedule_id) if f.due_at > fires[-1].due_at]
        assert later[0].due_at >= resumed_at - timedelta(seconds=1) and later[0].outcome == "created"

        assert await _fires(engine, BROKEN) == []

        # And deleting it stops it, its runs staying
        assert (await _steer(http, schedule_id, "delete")).status_code == 200
        assert (await http.get(f"/schedules/{schedule_id}", headers=EVERY_TENANT)).status_code == 404
        assert await _runs(engine, schedule_id)


async def test_backfill_makes_exactly_the_runs_of_a_past_range_once(engine, ensemble) -> None:  # type: ignore[no-untyped-def]
    # Given a gateway (no timer service: the schedule does not fire by itself) and a schedule every
    # two seconds whose anchor is three minutes ago
    ensemble.start_services("gateway", **KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    anchor = (datetime.now(UTC) - timedelta(minutes=3)).replace(microsecond=0)
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=30) as http:
        made = await http.post("/schedules", headers=EVERY_TENANT,
                               json=_schedule(every=2.0, anchor=anchor.isoformat()))
        assert made.status_code == 200, made.text
        schedule_id = made.json()["schedule_id"]
        start, end = anchor + timedelta(seconds=10), anchor + timedelta(seconds=70)
        span = {"start": start.isoformat(), "end": end.isoformat()}
        # When a backfill over a minute of it is asked for, and asked for again
        first = await _steer(http, schedule_id, "backfill", **span)
        again = await _steer(http, schedule_id, "backfill", **span)
        # Then the minute's 30 due times each have one run, made by the first backfill only
        assert first.status_code == 200 and first.json() == {"schedule_id": schedule_id, "times": 30, "created": 30}
        assert again.json() == {"schedule_id": schedule_id, "times": 30, "created": 0}
        runs = await _runs(engine, schedule_id)
        assert len(runs) == 30
        fires = await _fires(engine, schedule_id)
        assert [f.due_at for f in fires] == [start + timedelta(seconds=2 * i) for i in range(30)]
        assert all(f.backfill and f.outcome == "created" for f in fires)
        assert sorted(f.run_id for f in fires) == sorted(r.run_id for r in runs)
        # and a range reaching into the future, or an empty one, is refused naming why
        future = await _steer(http, schedule_id, "backfill", start=start.isoformat(),
                              end=(datetime.now(UTC) + timedelta(minutes=1)).isoformat())
        assert future.status_code == 422 and "covers the past" in future.json()["error"]
        empty = await _steer(http, schedule_id, "backfill", start=end.isoformat(), end=start.isoformat())
        assert empty.status_code == 422 and "must be after its start" in empty.json()["error"]
        # and the schedule is its tenant's: another tenant's operator does not see it, a viewer may not act
        other = await bearer(engine, "globex-ops", "operator", tenants=("globex",))
        assert (await http.get(f"/schedules/{schedule_id}", headers=other)).status_code == 404
        assert (await http.get("/schedules", headers=other)).json() == {"schedules": []}
        viewer = await bearer(engine, "acme-viewer", "viewer", tenants=(TENANT,))
        assert (await http.get(f"/schedules/{schedule_id}", headers=viewer)).json()["fires"][0]["backfill"]
        refused = await http.post(f"/schedules/{schedule_id}/pause", headers=viewer, json={"reason": "x"})
        assert refused.status_code == 403
        audited = await _audited(engine, schedule_id)
        assert audited == ["schedule.create", "schedule.backfill", "schedule.backfill"]
        # and a schedule that could never fire is refused, naming why
        cases = [(_schedule(), "either a cron expression or an interval"),
                 (_schedule(cron="61 * * * *"), "is not valid"),
                 (_schedule(cron="* * *"), "five fields"),
                 ({**_schedule(every=5), "run": {"workflow": "nope"}}, "unknown workflow 'nope'"),
                 ({**_schedule(every=5), "run": {"workflow": "keyed_queue", "idempotency_key": "k"}},
                  "leave it out")]
        for body, error in cases:
            answer = await http.post("/schedules", headers=EVERY_TENANT, json=body)
            assert answer.status_code == 422 and error in answer.json()["error"], (body, answer.text)
        assert (await http.post("/schedules", headers=EVERY_TENANT, json=_schedule(every=0.1))).status_code == 422


BROKEN = "sched-00000000-0000-4000-8000-0000000000bb"


async def _unreadable(engine, schedule_id: str) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC) - timedelta(seconds=5)
    async with engine.begin() as conn:
        await schedules.insert(conn, Schedule(schedule_id, TENANT, {"workflow": "keyed_queue", "budget": "lots"},
                                              Cadence(now, every=1.0), Overlap.ALLOW, 300.0, False, now, "tests", now))


async def _audited(engine, schedule_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return list((await conn.execute(text("SELECT action FROM audit_log WHERE target = :s ORDER BY id"),
                                        {"s": schedule_id})).scalars())
