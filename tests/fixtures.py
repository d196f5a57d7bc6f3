"""Fixtures over the real infrastructure: engine, bus, clean state, service processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.connection import Bus
from longrun.db.driver import Pool
from longrun.db.engine import make_engine
from longrun.db.schema import metadata
from tests.harness import Services
from tests.infra import Infra

PARTITIONS = 8
DELIVERY_LIMIT = 5


def test_topology() -> topology.Topology:
    return topology.build(partitions=PARTITIONS, delivery_limit=DELIVERY_LIMIT)


test_topology.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture
async def engine(infra: Infra) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(infra.database_url, pool_size=5)
    yield engine
    await engine.dispose()


@pytest.fixture
async def statements(infra: Infra) -> AsyncIterator[Pool]:
    pool = Pool(infra.database_url, size=4)
    await pool.open()
    yield pool
    await pool.close()


@pytest.fixture
async def bus(infra: Infra) -> AsyncIterator[Bus]:
    bus = Bus(infra.amqp_url, topology=test_topology(), name="tests")
    await bus.connect()
    yield bus
    await bus.close()


@pytest.fixture
async def clean(infra: Infra, engine: AsyncEngine, bus: Bus) -> None:
    """Empty tables and queues so one test's leftovers never reach another."""
    names = ", ".join(f'"{t.name}"' for t in reversed(metadata.sorted_tables))
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    assert bus.connection is not None
    channel = await bus.connection.channel()
    for queue in test_topology().queues:
        if queue.arguments.get("x-queue-type") != "stream":
            await (await channel.get_queue(queue.name, ensure=False)).purge()
    await channel.close()


@pytest.fixture
def services(infra: Infra, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Services]:
    started = Services(infra, tmp_path_factory.mktemp("logs"), partitions=PARTITIONS,
                       delivery_limit=DELIVERY_LIMIT)
    yield started
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(started.dump())
    started.stop_all()


@pytest.fixture
async def scenario(clean, infra, engine, bus, services, tmp_path) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]
    """A fault scenario over the real ensemble (the fault matrix's rows, and the replicated ones)."""
    from tests.fault.scenario import Scenario  # it uses this module's helpers

    yield Scenario(services, infra, engine, bus, tmp_path)


async def eventually(check, *, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll an async check until it returns a truthy value; fail naming what was awaited."""
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
