"""Rows: readiness follows the broker and the database; liveness does not.

Every service answers /healthz (alive: its event loop answers) and /readyz (ready: it reaches what it
needs and consumes) on its health port. The broker stopped, the services that use it say not ready
while the timer, which never uses it, stays ready; the database stopped, every service says not
ready; each back, every service is ready again without a restart. Alive throughout. The outages are
kept to seconds and always undone (``tests.infra``).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.fault.scenario import EVERYTHING, Scenario
from tests.fixtures import eventually
from tests.infra import broker_stopped, database_stopped
from tests.ports import free_port

pytestmark = [pytest.mark.fault, pytest.mark.integration]

USES_THE_BROKER = ("gateway", "scheduler", "relay", "reconciler", "worker")


async def _probe(port: int, path: str) -> int:
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(f"http://127.0.0.1:{port}{path}")).status_code
    except httpx.HTTPError:
        return 0


async def _answers(ports: dict[str, int], path: str) -> dict[str, int]:
    codes = await asyncio.gather(*(_probe(port, path) for port in ports.values()))
    return dict(zip(ports, codes, strict=True))


async def _until(ports: dict[str, int], expected: dict[str, int], what: str) -> None:
    async def reached() -> bool:
        return await _answers(ports, "/readyz") == expected

    await eventually(reached, timeout=60, what=what)


async def test_readiness_goes_false_without_the_broker_or_the_database_and_true_when_they_are_back(
        scenario: Scenario, local_broker: None, local_database: None) -> None:
    # Given every service up, each with its own health port
    ports = {name: free_port() for name in EVERYTHING}
    for name in EVERYTHING:
        scenario.start(name, LONGRUN_HEALTH_PORT=str(ports[name]))
    everyone_ready = dict.fromkeys(EVERYTHING, 200)
    await _until(ports, everyone_ready, "every service ready")
    # When the broker stops
    async with broker_stopped():
        # Then the services that use it are not ready, the timer still is, and all are alive
        await _until(ports, {name: 503 if name in USES_THE_BROKER else 200 for name in EVERYTHING},
                     "the broker's users not ready")
        assert await _answers(ports, "/healthz") == everyone_ready
    # And when it is back, every service is ready again by itself
    await _until(ports, everyone_ready, "every service ready after the broker came back")
    # When the database stops, no service is ready; all stay alive
    async with database_stopped():
        await _until(ports, dict.fromkeys(EVERYTHING, 503), "no service ready without the database")
        assert await _answers(ports, "/healthz") == everyone_ready
    # And when it is back, every service is ready again by itself, none restarted
    await _until(ports, everyone_ready, "every service ready after the database came back")
    assert all(p.alive() for p in scenario.services.started)
