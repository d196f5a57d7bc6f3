"""Fixtures of the fault matrix: a scenario over the real ensemble, on a clean database and vhost.

Each row of the matrix (``docs/fault-matrix.md``) is one test. It starts the services it
needs as processes, breaks one boundary, and ends with ``scenario.finish()``: the one
invariant checker (``longrun.testing.invariants.check``) over every run, plus the row's
own assertions on what a user would look at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.infra import ctl, start_broker, start_database


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fault/" in str(item.fspath).replace("\\", "/") and item.get_closest_marker("fault") is None:
            raise pytest.UsageError(f"{item.nodeid}: every fault-matrix test is marked pytest.mark.fault")


@pytest.fixture
def local_broker(infra) -> None:  # type: ignore[no-untyped-def]
    if not infra.rabbitmqctl:
        pytest.skip("needs a local broker that rabbitmqctl can stop, start and drop connections of")


@pytest.fixture
def local_database(infra) -> None:  # type: ignore[no-untyped-def]
    if not infra.pg_ctlcluster:
        pytest.skip("needs the local PostgreSQL cluster that pg_ctlcluster can restart")


@pytest.fixture(autouse=True)
async def infrastructure_put_back(infra) -> AsyncIterator[None]:  # type: ignore[no-untyped-def]
    """Whatever a row did, the broker and the database are running again when it ends (the row's own
    ``finally`` does it; this is the net under it, e.g. after a timeout)."""
    yield
    running = ctl("eval", "application:which_applications().", check=False).stdout if infra.rabbitmqctl else ""
    if infra.rabbitmqctl and '{rabbit,"RabbitMQ"' not in running:
        await asyncio.to_thread(start_broker)
    if infra.pg_ctlcluster:
        await asyncio.to_thread(start_database)
