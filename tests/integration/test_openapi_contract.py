"""The operator API keeps its OpenAPI contract: schemathesis drives a live gateway, over PostgreSQL
seeded with runs in several states, with requests generated from the document the gateway serves
(valid ones and ones outside the contract), and every answer must be a documented status, never a
5xx, with a body its schema allows; what breaks the contract is refused with a 4xx."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from longrun_client.operator_api import CREATE_RUNS

from longrun.app.gateway import operate
from longrun.db import audit as audit_log
from longrun.cadence import Cadence, Schedule
from longrun.db import policies, quarantine, schedules, tokens
from longrun.db.transaction import PgTransaction
from longrun.domain import Scope
from longrun.domain.schedules import Overlap
from longrun.services.gateway import openapi
from tests.integration.bus_helpers import wakeup
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import token
from tests.integration.runs_factory import (
    action_unknown,
    asking,
    completed,
    waiting_for_event,
    waiting_for_user,
)

pytestmark = pytest.mark.integration

EXAMPLES = 25
"""Generated requests per operation and mode (the same ones every run: derandomized, so a failure in CI
reproduces locally); the whole test stays well under two minutes."""
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
AUTH = schemathesis.Config.from_dict({"auth": {"openapi": {"operatorToken": {"bearer": OPERATOR_TOKEN}}}})


async def seeded(engine) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Runs in the states an operator meets (by name), a quarantined message that replays and one still
    malformed, a tenant policy and an audit line."""
    runs = {"waiting": await waiting_for_event(engine, "ci/acme/payments/40"),
            "paused": await waiting_for_event(engine, "ci/acme/payments/41"),
            "approval": await waiting_for_user(engine, approval_id="merge:1", approved_hash="a" * 64),
            "question": await asking(engine, question_id="module"), "completed": await completed(engine),
            "unknown": await action_unknown(engine, logical_action="open_mr")}
    ids = {name: stored.snapshot.run_id for name, stored in runs.items()}
    async with engine.begin() as conn:
        await operate.pause(PgTransaction(conn), ids["paused"], actor="ana", reason="look")
        await policies.put(conn, "acme", Scope(("forge.*",), ("repo:acme/*",)), by="ana")
        await audit_log.audit(conn, actor="reconciler", action="alert.silent_run", target=ids["paused"],
                             reason="silent")
        entries = [await quarantine.put(conn, owner="worker", queue="longrun.worker.p3", body=body, headers={},
                                        message_id=None, error_code="E", reason="test", attempts=5)
                   for body in (wakeup(ids["paused"], "after-fix").model_dump_json().encode(), b"{broken")]
        made, _ = await tokens.create(conn, name="ci-bot", roles=("viewer",), tenants=("acme",), created_by="tests")
        now = await schedules.now(conn)
        nightly = Cadence(now, cron="0 3 * * *")
        await schedules.insert(conn, Schedule(SCHEDULE, "acme", {"workflow": "steps", "input": {"steps": 1}}, nightly,
                                              Overlap.SKIP, 300.0, False, nightly.first(), "ana", now))
    return {**ids, "entries": entries, "tokens": [made.id], "approver": await token(engine, "user_42"),
            "producer": await token(engine, "acme-producer", tenants=("acme",), permissions=(CREATE_RUNS,))}


def caller(known: dict[str, Any], method: str, path: str) -> dict[str, str]:
    """Who calls: the approval's owner approves and answers, acme's producer creates runs, the bootstrap
    admin does the rest."""
    if path.endswith(("/approve", "/answer")):
        return {"Authorization": f"Bearer {known['approver']}"}
    if (method, path) == ("POST", "/runs"):
        return {"Authorization": f"Bearer {known['producer']}"}
    return BEARER


def answered_as_promised(schema: Any, url: str, known: dict[str, Any]) -> None:
    """The answers generated requests rarely reach (an approval of the right hash by its owner, a valid
    answer, a resolution, a replay, pages of search), asked for on purpose, validated the same way."""
    def call(method: str, path: str, status: int, **given: Any) -> None:
        case = schema[path][method].Case(**given)
        response = case.call_and_validate(base_url=url, headers=caller(known, method, path), checks=CHECKS, timeout=10)
        assert response.status_code == status, (method, path, response.status_code, response.text)

    for name in RUN_STATES:
        call("GET", "/runs/{run_id}", 200, path_parameters={"run_id": known[name]})
    call("GET", "/runs", 200, query={"tenant_id": "acme", "limit": 2})
    call("GET", "/alerts", 200, query={"limit": 1})
    call("GET", "/tenants/{tenant_id}/policy", 200, path_parameters={"tenant_id": "acme"})
    call("POST", "/runs/{run_id}/approve", 200, path_parameters={"run_id": known["approval"]},
         body={"approval_id": "merge:1", "approved_hash": "a" * 64, "reason": "reviewed"})
    call("POST", "/runs/{run_id}/answer", 200, path_parameters={"run_id": known["question"]},
         body={"question_id": "module", "answer": {"module": "billing"}, "reason": "billing owns it"})
    call("POST", "/runs/{run_id}/resolve", 200, path_parameters={"run_id": known["unknown"]},
         body={"logical_action": "open_mr", "outcome": "confirmed", "external_id": "!7", "receipt": {"iid": 7},
               "reason": "found it"})
    call("POST", "/runs/{run_id}/resume", 200, path_parameters={"run_id": known["paused"]}, body={"reason": "go"})
    call("POST", "/runs/{run_id}/migrate", 409, path_parameters={"run_id": known["waiting"]},
         body={"to_version": "2", "reason": "release 2"})
    call("POST", "/quarantine/{entry_id}/replay", 200, path_parameters={"entry_id": known["entries"][0]},
         body={"reason": "consumer fixed"})
    call("POST", "/runs/{run_id}/artifacts", 200, path_parameters={"run_id": known["waiting"]},
         query={"name": "ci.log", "reason": "the log CI lost"}, body=EVIDENCE, media_type="application/octet-stream")
    call("GET", "/runs/{run_id}/artifacts/{content_hash}", 200,
         path_parameters={"run_id": known["waiting"], "content_hash": hashlib.sha256(EVIDENCE).hexdigest()})
    create = {"tenant_id": "acme", "schema_version": 4,
              "payload": {"workflow": "steps", "idempotency_key": "order-1", "input": {"steps": 1}}}
    call("POST", "/runs", 201, body=create, headers={"Idempotency-Key": "order-1"})
    call("POST", "/runs", 200, body=create, headers={"Idempotency-Key": "order-1"})
    call("POST", "/runs", 409, body={**create, "payload": {**create["payload"], "input": {"steps": 2}}},
         headers={"Idempotency-Key": "order-1"})
    call("POST", "/schedules", 200, body={"tenant_id": "acme", "run": {"workflow": "steps", "input": {"steps": 1}},
                                          "every": 60, "overlap": "buffer_one", "reason": "every minute"})
    call("GET", "/schedules", 200, query={"tenant_id": "acme"})
    call("POST", "/schedules/{schedule_id}/backfill", 200, path_parameters={"schedule_id": SCHEDULE},
         body={"start": "2026-01-01T00:00:00Z", "end": "2026-01-03T00:00:00Z", "reason": "the outage"})
    call("GET", "/schedules/{schedule_id}", 200, path_parameters={"schedule_id": SCHEDULE})
    call("POST", "/schedules/{schedule_id}/pause", 200, path_parameters={"schedule_id": SCHEDULE},
         body={"reason": "quiet"})
    call("GET", "/me", 200)
    call("POST", "/tokens", 200, body={"name": "ana", "roles": ["operator"], "tenants": ["acme"], "reason": "on call"})
    call("GET", "/tokens", 200, query={"all": "1"})
    call("POST", "/tokens/{token_id}/revoke", 200, path_parameters={"token_id": known["tokens"][0]},
         body={"reason": "left"})


EVIDENCE = b"412 passed, 0 failed\n"
SCHEDULE = "sched-00000000-0000-4000-8000-00000000000a"


RUN_STATES = ("waiting", "paused", "approval", "question", "completed", "unknown")


def exercise(operation: Any, url: str, known: dict[str, list[Any]], headers: dict[str, str] | None) -> str | None:
    """Generated requests to one operation, in both modes (path parameters made up, or picked from
    ``known``), sent with ``headers`` (None: as the bootstrap admin); the first failure's report, or None."""
    names = [p["name"] for p in operation.definition.raw.get("parameters", []) if p["in"] == "path"]

    def strategy(mode: GenerationMode) -> st.SearchStrategy[Any]:
        made_up = operation.as_strategy(generation_mode=mode)
        if not names or mode is GenerationMode.NEGATIVE:
            return made_up
        existing = st.fixed_dictionaries({n: st.sampled_from(known[n]) for n in names}).flatmap(
            lambda given: operation.as_strategy(generation_mode=mode, path_parameters=given))
        return st.one_of(existing, made_up)

    raw = operation.definition.raw
    negatable = bool(raw.get("parameters")) or "requestBody" in raw
    for mode in (m for m in GenerationMode if negatable or m is GenerationMode.POSITIVE):
        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                             suppress_health_check=list(hypothesis.HealthCheck), phases=[
                                 hypothesis.Phase.explicit, hypothesis.Phase.generate, hypothesis.Phase.shrink])
        @hypothesis.given(case=strategy(mode))
        def run(case: schemathesis.Case) -> None:
            case.call_and_validate(base_url=url, headers=headers, checks=CHECKS, timeout=10)

        try:
            run()
        except (Exception, BaseExceptionGroup) as e:  # its report: the request (as curl), answer, check broken
            return f"{operation.label} ({mode.value}): {e}"
    return None


@pytest.mark.long
async def test_schemathesis_finds_the_live_gateway_keeps_its_contract(clean, engine, services, tmp_path) -> None:
    # Given a live gateway over runs in several states
    known = await seeded(engine)
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    # When schemathesis loads the document the gateway serves (the committed one) and drives every operation
    schema = await asyncio.to_thread(schemathesis.openapi.from_url, f"{ensemble.gateway_url}/openapi.json",
                                   config=AUTH)
    assert schema.raw_schema == openapi.document()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(openapi.api.OPERATIONS)
    await asyncio.to_thread(answered_as_promised, schema, ensemble.gateway_url, known)
    pick = {"run_id": [known[name] for name in RUN_STATES], "entry_id": known["entries"], "tenant_id": ["acme"],
            "content_hash": [hashlib.sha256(EVIDENCE).hexdigest()], "token_id": known["tokens"],
            "schedule_id": [SCHEDULE]}
    # POST /runs is driven as acme's producer: as the bootstrap admin, who may not create runs, every
    # request would stop at 403 and the create's reading would go unexercised.
    run: Callable[[Any], str | None] = lambda op: exercise(  # noqa: E731
        op, ensemble.gateway_url, pick, caller(known, op.method.upper(), op.path) if op.path == "/runs" else None)
    failures = [f for f in [await asyncio.to_thread(run, op) for op in operations] if f is not None]
    # Then no answer broke it
    assert failures == [], "\n\n".join(failures)
