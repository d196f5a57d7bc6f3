"""Taking over the runs of a worker whose membership lapsed (``db.leases.take_over_lapsed``), judged in
the database's time: the runs of a lapsed holder are taken, with a newer fencing token; a live holder,
however slow, keeps its runs; a holder without a membership row keeps its lease until it expires; a
taker whose own membership lapsed, or that does not run the run's pins, takes nothing; a worker takes
back what an earlier process under its own name held, and nothing it took itself."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.authoring import pins_key
from longrun.bus import topology
from longrun.db import leases, runs
from longrun.domain import PinnedVersions, RunStatus, Usage, freeze
from longrun.domain import events as ev
from tests.fixtures import PARTITIONS

pytestmark = pytest.mark.integration

VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")
SERVED = [pins_key("probe", VERSIONS)]
TTL = 30.0


async def _held(conn: AsyncConnection, run_id: str, owner: str) -> int:
    """A RUNNING run whose lease ``owner`` holds for the default run lease TTL; its fencing token."""
    at = time.time()
    stored = await runs.create(conn, ev.RunCreated(
        seq=1, at=at, run_id=run_id, tenant_id="tenant-lapsed", kind="probe", goal=freeze({}), versions=VERSIONS,
        budget=Usage(model_calls=9, tool_calls=9, cost=1.0)), idempotency_key=run_id, input_hash="h",
        partition=topology.partition_of(run_id, PARTITIONS))
    assert stored is not None
    fence = await leases.take_lease(conn, run_id, owner, ttl=TTL)
    assert fence is not None
    await runs.append(conn, stored, [ev.RunStatusChanged(seq=stored.seq(1), at=at, to=RunStatus.RUNNING,
                                                         reason="taken")])
    return fence.token


async def _now(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(text("SELECT now()"))).scalar_one()
    return now


async def _member(conn: AsyncConnection, instance_id: str, *, alive_for: float) -> None:
    await conn.execute(text(
        "INSERT INTO service_members (service, instance_id, alive_until, advertised) "
        "VALUES ('worker', :i, now() + make_interval(secs => :s), '[]')"), {"i": instance_id, "s": alive_for})


async def test_only_the_runs_of_a_lapsed_holder_are_taken_over_and_only_by_a_live_member(
        clean: None, engine: AsyncEngine) -> None:
    # Given a run held by a worker whose membership lapsed a second ago, one held by a live worker in a
    # long call (its membership renewed), and one held by a worker that left the member list
    started = await _now(engine)
    async with engine.begin() as conn:
        dead_token = await _held(conn, "run-dead", "worker-dead")
        await _held(conn, "run-slow", "worker-slow")
        await _held(conn, "run-gone", "worker-gone")
        await _member(conn, "worker-dead", alive_for=-1)
        await _member(conn, "worker-slow", alive_for=6)
        await _member(conn, "worker-late", alive_for=-1)
        await _member(conn, "worker-live", alive_for=6)
    async with engine.begin() as conn:
        # When a worker whose own membership lapsed looks, or one that does not run the pins
        assert await leases.take_over_lapsed(conn, "worker-late", TTL, SERVED, 10, started) == []
        assert await leases.take_over_lapsed(conn, "worker-live", TTL, ["other"], 10, started) == []
        # Then it takes nothing; a live member that runs them takes over the lapsed holder's run alone
        taken = await leases.take_over_lapsed(conn, "worker-live", TTL, SERVED, 10, started)
    assert [(stored.snapshot.run_id, lapsed) for stored, lapsed in taken] == [("run-dead", "worker-dead")]
    stored = taken[0][0]
    assert (stored.lease_owner, stored.fencing_token) == ("worker-live", dead_token + 1)
    async with engine.connect() as conn:
        owners = dict((await conn.execute(text("SELECT run_id, lease_owner FROM runs"))).all())
        # with a whole run lease from now, in the database's time
        left = (await conn.execute(text(
            "SELECT extract(epoch FROM lease_until - now()) FROM runs WHERE run_id = 'run-dead'"))).scalar_one()
    assert owners == {"run-dead": "worker-live", "run-slow": "worker-slow", "run-gone": "worker-gone"}
    assert TTL - 5 < float(left) <= TTL
    # and a second look finds nothing more
    async with engine.begin() as conn:
        assert await leases.take_over_lapsed(conn, "worker-live", TTL, SERVED, 10, started) == []


async def test_a_worker_restarted_under_its_name_takes_back_what_its_earlier_process_held(
        clean: None, engine: AsyncEngine) -> None:
    # Given a run an earlier process named worker-again held (its lease renewed moments ago), then a
    # process of the same name that starts, renews the same membership row and takes a run of its own
    async with engine.begin() as conn:
        earlier_token = await _held(conn, "run-earlier", "worker-again")
        await _member(conn, "worker-again", alive_for=6)
    started = await _now(engine)
    async with engine.begin() as conn:
        await _held(conn, "run-own", "worker-again")
    # When it looks for runs to take over
    async with engine.begin() as conn:
        taken = await leases.take_over_lapsed(conn, "worker-again", TTL, SERVED, 10, started)
    # Then it takes back the earlier process's run, with a newer token, and leaves its own alone
    assert [(stored.snapshot.run_id, lapsed) for stored, lapsed in taken] == [("run-earlier", "worker-again")]
    assert taken[0][0].fencing_token == earlier_token + 1
    async with engine.begin() as conn:
        assert await leases.take_over_lapsed(conn, "worker-again", TTL, SERVED, 10, started) == []
