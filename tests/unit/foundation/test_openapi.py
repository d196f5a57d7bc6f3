"""schemas/openapi.json: the operator API's contract, rendered from the gateway's route table."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.datastructures import QueryParams

from longrun.domain import RunStatus
from longrun.services.gateway import api, api_responses, openapi

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = ROOT / "schemas" / "openapi.json"


def test_the_committed_document_matches_the_route_table() -> None:
    assert DOCUMENT.exists(), "schemas/openapi.json is missing; run `make schemas`"
    assert DOCUMENT.read_text() == openapi.render(), (
        "schemas/openapi.json drifted from services/gateway/api.py; run `make schemas`")


def test_every_operation_is_described_with_its_errors_in_json() -> None:
    doc = openapi.document()
    assert doc["openapi"] == "3.1.0"
    described = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert described == {(op.method, op.path) for op in api.OPERATIONS}
    approve = doc["paths"]["/runs/{run_id}/approve"]["post"]
    assert sorted(approve["responses"]) == ["200", "400", "401", "403", "404", "409", "422", "503"]
    assert approve["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Decide"}
    assert doc["components"]["schemas"]["Decide"]["required"] == ["approval_id", "approved_hash", "reason"]


def test_every_action_a_run_may_allow_has_an_operation() -> None:
    allowed = api_responses.RunView.model_fields["allowed_operations"].annotation.__args__[0].__args__  # type: ignore[union-attr]
    assert set(allowed) < set(api.RUN_ACTIONS)


@pytest.mark.parametrize(("raw", "status", "error"), [
    (b"{", 400, "the body is not JSON"),
    (b"[1]", 400, "the body must be a JSON object, not list"),
    (b'{"reason": NaN}', 400, "the body is not JSON: NaN is not a JSON number"),
    (b'{"to_version": "2"}', 400, "a reason is required for every operator action"),
    (b'{"to_version": "2", "reason": ""}', 400, "a reason is required for every operator action"),
    (b'{"reason": "r"}', 400, "missing field 'to_version'"),
    (b'{"to_version": 2, "reason": "r"}', 422, "to_version: Input should be a valid string"),
    (b'{"to_version": "2", "reason": "r", "force": true}', 422, "unknown parameter 'force'"),
    (b'{"to_version": "2\\u0000", "reason": "r"}', 422, "to_version holds a NUL character"),
])
def test_a_body_outside_the_contract_is_refused_naming_why(raw: bytes, status: int, error: str) -> None:
    with pytest.raises(api.Invalid) as refused:
        api.body(api.Migrate, raw)
    assert refused.value.status == status and str(refused.value).startswith(error)


def test_an_outcome_not_allowed_is_named_with_the_ones_that_are() -> None:
    with pytest.raises(api.Invalid) as refused:
        api.body(api.Resolve, b'{"logical_action": "mr", "outcome": "maybe", "reason": "r"}')
    assert (refused.value.status, str(refused.value)) == (
        422, "outcome must be one of confirmed, not_done, not 'maybe'")


def test_query_and_path_parameters_are_checked_against_the_contract() -> None:
    search = api.query(api.RunSearch, QueryParams("status=PAUSED&label=a=1&label=b=2&limit=7"))
    assert (search.status, search.label, search.limit) == (RunStatus.PAUSED.value, ["a=1", "b=2"], 7)
    for raw, error in (("limit=0", "limit must be an integer from 1 to 500, got '0'"),
                       ("status=DONE", "status must be one of READY, "), ("label=team", "label.0: "),
                       ("tenant=acme", "unknown parameter 'tenant'")):
        with pytest.raises(api.Invalid) as refused:
            api.query(api.RunSearch, QueryParams(raw))
        assert refused.value.status == 400 and str(refused.value).startswith(error)
    assert api.path_parameter("entry_id", "12") == 12
    for name, raw in (("entry_id", "x"), ("entry_id", str(2**63)), ("run_id", "a\x00"), ("tenant_id", "a b")):
        with pytest.raises(api.Invalid):
            api.path_parameter(name, raw)
