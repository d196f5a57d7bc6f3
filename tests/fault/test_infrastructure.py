"""Rows: the broker and the database go away under a running run, and come back.

Stopping RabbitMQ or PostgreSQL stops it for every session on this machine, so those
bodies are kept to a few seconds and the helpers (``tests.infra``) always start them again
in a ``finally``. Dropping AMQP connections and terminating database backends stay inside
this session's vhost and database. No service is restarted by the tests: every process
must ride the outage out on its own.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import EVERYTHING, Scenario
from tests.infra import broker_stopped, close_all_connections, database_stopped, terminate_backends
from longrun_dependency_upgrade.forge import sign_payload
from tests.integration.ensemble import OPERATOR_TOKEN, WEBHOOK_SECRET
from tests.integration.runs_factory import waiting_for_event

pytestmark = [pytest.mark.fault, pytest.mark.integration]

NOMINAL = {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
AUTH = {"authorization": f"Bearer {OPERATOR_TOKEN}"}


def _pids(scenario: Scenario) -> dict[str, int]:
    return {p.name: p.pid for p in scenario.services.started if p.alive()}


async def _in_flight(scenario: Scenario, run_id: str, action: str) -> bool:
    row = (await scenario.ledger(run_id)).get(action)
    return row is not None and row.status == "SUBMITTED"


REDELIVERED = """A CI result arriving while the database is down is answered 503 by the gateway (after
its own retries, ``test_a_webhook_arriving_right_after_the_database_came_back_is_taken``); like
real providers, the scenario then sends it again a few seconds later (``Scenario.until(redeliver=True)``)."""


async def test_the_broker_restarted_while_a_run_waits_for_ci_loses_no_wakeup(
        scenario: Scenario, local_broker: None) -> None:
    # Given the dependency upgrade waiting for its first CI result (CI takes 4 s here)
    await scenario.up(*EVERYTHING, ci_delay=4)
    pids = _pids(scenario)
    run_id = await scenario.create()
    await scenario.until(run_id, RunStatus.WAITING_EVENT, timeout=30)
    # When RabbitMQ stops, the CI result arrives meanwhile (the gateway records it and the wakeup
    # waits in the outbox), and RabbitMQ comes back
    async with broker_stopped():
        woken = await scenario.until(run_id, RunStatus.READY, timeout=15)
        assert await scenario.scalar(
            "SELECT count(*) FROM outbox WHERE aggregate_id = :r AND type = 'run.wakeup' AND published_at IS NULL",
            r=run_id) == 1
    # Then, with no service restarted, the wakeup is published, the worker consumes again, and
    # the run goes on to its end with one effect per intent
    done = await scenario.to_the_end(run_id, timeout=60)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert woken.snapshot.last_wake is not None and woken.snapshot.last_wake.reason.value == "event"
    assert _pids(scenario) == pids
    assert await scenario.forge_counts() == NOMINAL
    await scenario.finish()


async def test_all_amqp_connections_dropped_mid_run_every_service_reconnects(
        scenario: Scenario, local_broker: None) -> None:
    # Given the dependency upgrade waiting for its first CI result
    await scenario.up(*EVERYTHING, ci_delay=1.5)
    pids = _pids(scenario)
    run_id = await scenario.create()
    await scenario.until(run_id, RunStatus.WAITING_EVENT, timeout=30)
    # When the broker closes every connection of this vhost (services, and the tests' own)
    dropped = await asyncio.to_thread(close_all_connections, scenario.infra.vhost)
    assert dropped >= len(EVERYTHING)
    # Then every service reconnects by itself and the run goes on to its end
    done = await scenario.to_the_end(run_id, timeout=60)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert _pids(scenario) == pids
    assert await scenario.forge_counts() == NOMINAL
    for proc in scenario.running("gateway") + scenario.running("worker") + scenario.running("relay"):
        assert "connection to RabbitMQ lost" in proc.output() or "reconnecting" in proc.output() \
            or "CONNECTION_FORCED" in proc.output(), f"{proc.name} never noticed the drop"
    await scenario.finish()


async def test_the_database_restarted_while_a_tool_call_is_in_flight(scenario: Scenario, local_database: None) -> None:
    # Given the dependency upgrade with commit:1 in flight: the forge made it and holds its answer 3 s
    await scenario.up(*EVERYTHING, forge_faults=(
        {"endpoint": "commits", "mode": "timeout_after_commit", "times": 1, "hold_seconds": 3},),
        LONGRUN_FORGE_TIMEOUT="10")
    pids = _pids(scenario)
    run_id = await scenario.create()
    await scenario.poll(lambda: _in_flight(scenario, run_id, "commit:1"), timeout=30, what="commit:1 in flight")
    # When PostgreSQL stops while the forge answers, and starts again
    async with database_stopped():
        await asyncio.sleep(3)
    await scenario.engine.dispose()  # the tests' own pooled connections died with the server
    # Then every service rides it out, the commit is asked for again under its key, and the run
    # goes on to its end with one effect per intent (REDELIVERED)
    done = await scenario.to_the_end(run_id, timeout=60, redeliver=True)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert _pids(scenario) == pids
    assert await scenario.forge_counts() == NOMINAL
    assert (await scenario.ledger(run_id))["commit:1"].status == "CONFIRMED"
    await scenario.finish()


async def test_database_backends_terminated_mid_run_every_service_reconnects(scenario: Scenario) -> None:
    # Given the dependency upgrade with commit:1 in flight (the forge holds its answer 2 s)
    await scenario.up(*EVERYTHING, forge_faults=(
        {"endpoint": "commits", "mode": "timeout_after_commit", "times": 1, "hold_seconds": 2},),
        LONGRUN_FORGE_TIMEOUT="10")
    pids = _pids(scenario)
    run_id = await scenario.create()
    await scenario.poll(lambda: _in_flight(scenario, run_id, "commit:1"), timeout=30, what="commit:1 in flight")
    # When every connection to this session's database is terminated, twice, a second apart
    killed = await asyncio.to_thread(terminate_backends, scenario.infra)
    await asyncio.sleep(1)
    killed += await asyncio.to_thread(terminate_backends, scenario.infra)
    assert killed >= len(EVERYTHING)
    await scenario.engine.dispose()
    # Then every service reconnects and the run goes on to its end with one effect per intent (REDELIVERED)
    done = await scenario.to_the_end(run_id, timeout=60, redeliver=True)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert _pids(scenario) == pids
    assert await scenario.forge_counts() == NOMINAL
    await scenario.finish()


async def test_a_webhook_arriving_right_after_the_database_came_back_is_taken(scenario: Scenario) -> None:
    # Given the gateway, and a run waiting for CI run 7
    await scenario.up("gateway", forge=False)
    stored = await waiting_for_event(scenario.engine, "ci/acme/payments/7")
    async with httpx.AsyncClient(base_url=scenario.ensemble.gateway_url, timeout=10) as gateway:
        assert (await gateway.get(f"/runs/{stored.snapshot.run_id}", headers=AUTH)).status_code == 200
        # When every connection to the database is terminated, and then CI run 7 reports
        await asyncio.to_thread(terminate_backends, scenario.infra)
        await scenario.engine.dispose()
        body = json.dumps({"id": "after-outage", "type": "ci.finished", "ci_run_id": 7, "repo": "acme/payments",
                           "sha": "abc123", "status": "passed", "log_excerpt": "ok"}).encode()
        response = await gateway.post("/webhooks/forge", content=body, headers={
            "x-forge-signature": sign_payload(WEBHOOK_SECRET, body), "content-type": "application/json"})
    # Then the event is taken (a provider that does not redeliver would otherwise lose it)
    assert response.status_code == 202, response.text
