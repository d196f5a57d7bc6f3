"""Real PostgreSQL and RabbitMQ for the test session.

Found from LONGRUN_DATABASE_URL / LONGRUN_AMQP_URL, else the local defaults, else
testcontainers where a Docker engine answers; when none is reachable the session
stops with what to start and how. Each session gets its own database (migrated with
the real migrations) and, on a local broker, its own vhost; both are removed after.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.infra import Infra, find_infra

pytest_plugins = ["tests.fixtures"]


@pytest.fixture(scope="session")
def infra() -> Iterator[Infra]:
    found = find_infra()
    if isinstance(found, str):
        pytest.exit(found, returncode=3)
    session = f"lrt_{uuid.uuid4().hex[:10]}"
    with found.session(session) as ready:
        yield ready


def pytest_report_header() -> list[str]:
    return [f"longrun test session pid {os.getpid()}; rabbitmqctl: "
            f"{'yes' if subprocess.run(['which', 'rabbitmqctl'], capture_output=True).returncode == 0 else 'no'}"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Remember each phase's outcome so fixtures can print service logs after a failure."""
    outcome = yield
    setattr(item, f"rep_{call.when}", outcome.get_result())
