"""``POST /runs`` before admission: who may create where, the Idempotency-Key header against the payload,
the payload read as the bus reads it, and the status each run.rejected code answers with."""

from __future__ import annotations

from typing import Any

import pytest
from longrun_client.operator_api import CREATE_RUNS

from longrun.envelope.payloads import RejectionCode
from longrun.principals import Principal
from longrun.services.gateway import api
from longrun.services.gateway.run_create import STATUS, Refusal, envelope_of

PRODUCER = Principal("bot", frozenset(), frozenset({"acme"}), permissions=frozenset({CREATE_RUNS}))


def body(key: str = "k-1", *, tenant: str = "acme", schema_version: int = 4, **payload: Any) -> api.CreateRun:
    return api.CreateRun(tenant_id=tenant, schema_version=schema_version,
                         payload={"workflow": "steps", "idempotency_key": key, "input": {"steps": 2}, **payload})


def refusal(given: api.CreateRun, key: str | None) -> Refusal:
    with pytest.raises(Refusal) as refused:
        envelope_of(given, key, PRODUCER)
    return refused.value


def test_every_rejection_code_answers_a_client_error_the_operation_documents() -> None:
    documented = api.BY_ROUTE[("POST", "/runs")].errors
    assert set(STATUS) == set(RejectionCode)
    assert all(400 <= status < 500 and status in documented for status in STATUS.values())


def test_a_create_is_read_as_the_bus_reads_it_and_names_its_caller_as_producer() -> None:
    made = envelope_of(body(), "k-1", PRODUCER)
    assert (made.type, made.schema_version, made.tenant_id, made.producer) == ("run.create", 4, "acme", "gateway:bot")
    older = envelope_of(body(schema_version=1, budget_usd=2.5), "k-1", PRODUCER)
    assert older.schema_version == 4 and older.payload.budget.cost_usd == 2.5


def test_the_header_must_be_there_and_equal_the_payloads_key() -> None:
    assert refusal(body(), None).status == 400
    assert refusal(body(), "k-2").status == 400
    assert refusal(body(idempotency_key=None), "k-1").status == 400


def test_a_tenant_the_caller_does_not_see_is_forbidden_before_anything_is_read() -> None:
    refused = refusal(body(tenant="globex", schema_version=99), None)
    assert (refused.status, refused.code) == (403, RejectionCode.TENANT_NOT_ALLOWED)


def test_an_unknown_version_or_an_unreadable_payload_answers_its_bus_code() -> None:
    assert refusal(body(schema_version=99), "k-1").code is RejectionCode.UNKNOWN_SCHEMA_VERSION
    assert refusal(body(priority=99), "k-1").code is RejectionCode.INVALID_PAYLOAD
    assert refusal(body(input={"nan": float("nan")}), "k-1").code is RejectionCode.INVALID_PAYLOAD
