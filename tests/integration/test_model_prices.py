"""A priced model through its provider's SDK, with the real services: each answer is charged what its
tokens cost at ``LONGRUN_MODEL_PRICES``, so a run's cost budget ends it BUDGET_EXHAUSTED, and the SDK
asks no more than the runtime does (the model's endpoint, in the provider's wire format, counts the
requests it gets); a model that refuses the request leaves the run for a person."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import text

from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.envelope import make
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, new_key
from tests.model_servers import CALL_COST, RecordedModel, error, model_env, proposal
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]



@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_run_asking_a_priced_model_ends_budget_exhausted_at_its_cost_budget(
        clean, engine, bus, services, tmp_path, provider) -> None:  # type: ignore[no-untyped-def]
    # Given a model priced at $2.50 / $10 per million input / output tokens, whose every answer reports
    # 1,200 tokens in and 80 out ($0.0038), and a run that asks it until its $0.02 cost budget is spent
    endpoint = RecordedModel(provider, proposal(provider, "plan", rationale="think again"))
    budget = 0.02
    async with _serving(endpoint) as base_url:
        status, reason, charged = await _run(services, tmp_path, bus, engine, model_env(base_url, provider), budget)
        # Then it ends BUDGET_EXHAUSTED for its cost, charged at the price for the tokens reported
        assert status == "BUDGET_EXHAUSTED" and reason.startswith("budget cost exhausted"), reason
        costs = [c["cost"] for c in charged]
        assert costs == pytest.approx([CALL_COST] * len(costs))
        assert budget <= sum(costs) < budget + CALL_COST
        # ...and the endpoint got one request per model call charged: the SDK retried none
        assert len(endpoint.requests) == sum(c["model_calls"] for c in charged) == len(costs)
        assert {r["headers"]["x-stainless-retry-count"] for r in endpoint.requests} == {"0"}


async def test_a_model_that_refuses_the_request_leaves_the_run_for_a_person_asked_once(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a model whose key is refused (401)
    endpoint = RecordedModel("openai", error("openai", 401))
    async with _serving(endpoint) as base_url:
        # When a run asks it
        status, reason, charged = await _run(services, tmp_path, bus, engine, model_env(base_url), 1.0)
    # Then the run needs attention, saying why, after one request: asking again would change nothing
    assert status == "NEEDS_ATTENTION" and "rejected the request (401)" in reason
    assert len(endpoint.requests) == 1 and [c["model_calls"] for c in charged] == [1]


@pytest.mark.long
async def test_a_429_s_retry_after_is_waited_for_before_the_model_is_asked_again(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a model that answers its first request 429 "retry after 2 s", then proposals, no rate limit
    # configured, and a retry policy that would ask again after 0.2 s
    endpoint = RecordedModel("anthropic", error("anthropic", 429, {"retry-after": "2"}),
                             proposal("anthropic", "plan"))
    async with _serving(endpoint) as base_url:
        # When a run that may make two model calls asks it
        status, reason, _ = await _run(services, tmp_path, bus, engine, model_env(base_url, "anthropic"), 1.0,
                                       model_calls=2, LONGRUN_RETRY_INITIAL_INTERVAL="0.2")
    # Then the second request came no sooner than the server asked, and the run used its two calls
    first, second = (r["at"] for r in endpoint.requests)
    assert second - first >= 2.0
    assert status == "BUDGET_EXHAUSTED" and reason.startswith("budget model_calls exhausted"), reason


@contextlib.asynccontextmanager
async def _serving(endpoint: RecordedModel) -> AsyncIterator[str]:
    """``endpoint`` on a free port, its base URL as its provider's SDK takes it."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(endpoint.app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        yield f"http://127.0.0.1:{port}" + ("/v1" if endpoint.provider == "openai" else "")
    finally:
        server.should_exit = True
        await serving


async def _run(services: Any, tmp_path: Path, bus: Any, engine: Any, model: dict[str, str], budget: float,
               model_calls: int = 50, **env: str) -> tuple[str, str, list[dict[str, Any]]]:
    """A run of ``asking`` with a cost budget of ``budget``, on a worker asking ``model``, to its end: its
    status, the reason it was given, and its charges."""
    Ensemble(services, tmp_path).start_services(
        "scheduler", "relay", "timer", "worker", LONGRUN_RUN_KINDS="tests.integration.model_kinds:kinds", **model,
        **env)
    key = new_key()
    envelope = make("run.create", {"workflow": "asking", "idempotency_key": key,
                                   "budget": {"cost_usd": budget, "model_calls": model_calls}},
                    producer="tests", tenant_id="acme")
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))

    async def ended() -> bool:
        async with engine.connect() as conn:
            return (await conn.execute(text("SELECT status FROM runs WHERE idempotency_key = :k"),
                                       {"k": key})).scalar() in ("BUDGET_EXHAUSTED", "NEEDS_ATTENTION", "FAILED")

    await eventually(ended, timeout=60, what="the run ended")
    async with engine.connect() as conn:
        run_id = (await conn.execute(text("SELECT run_id FROM runs WHERE idempotency_key = :k"), {"k": key})).scalar()
        events = [(row.type, row.data) for row in await conn.execute(text(
            "SELECT type, data FROM run_events WHERE run_id = :r ORDER BY seq"), {"r": run_id})]
    # A transition that finishes the run is told by its summary.
    status, reason = next((d["to"], d["reason"]) if t == "run.status_changed" else
                          (d["summary"]["status"], d["summary"]["terminal_reason"])
                          for t, d in reversed(events) if t in ("run.status_changed", "run.summary"))
    return status, reason, [d for t, d in events if t == "budget.charged"]
