"""Upcasters are pure and pinned by golden files: v1 on the wire decodes as the newest version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longrun.envelope import LATEST, decode, encode, make
from longrun.envelope.payloads import RejectionCode, RejectionCodeV2
from longrun.errors import DecodeError
from longrun.envelope.upcast import (UPCASTERS, upcast_run_create_v1_v2, upcast_run_create_v2_v3,
                                    upcast_run_create_v3_v4, upcast_run_rejected_v1_v2)

GOLDEN = Path(__file__).parent.parent / "golden"


def test_run_create_v1_upcasts_to_v2_exactly_as_recorded() -> None:
    v1 = json.loads((GOLDEN / "run.create.v1.json").read_text())
    as_v2 = json.loads((GOLDEN / "run.create.v1-as-v2.json").read_text())
    upcast = upcast_run_create_v1_v2(v1["payload"])
    assert {k: as_v2["payload"][k] for k in upcast if k != "budget"} == {k: v for k, v in upcast.items() if k != "budget"}
    assert upcast["budget"].items() <= as_v2["payload"]["budget"].items()
    # and on through v3: a v1 on the wire decodes as what its v2 form decodes to
    assert as_v2 == json.loads((GOLDEN / "run.create.v2.json").read_text())
    assert decode(json.dumps(v1).encode()) == decode(json.dumps(as_v2).encode())


def test_run_create_v2_upcasts_to_v3_exactly_as_recorded() -> None:
    v2 = json.loads((GOLDEN / "run.create.v2.json").read_text())
    expected = json.loads((GOLDEN / "run.create.v2-as-v3.json").read_text())
    assert upcast_run_create_v2_v3(v2["payload"]) == expected["payload"]
    # v2 could not ask for a scope or a deadline: the run gets neither narrowing nor deadline
    assert (expected["payload"]["scope"], expected["payload"]["deadline"]) == (None, None)
    # and on through v4: a v2 on the wire decodes as what its v3 form decodes to
    assert expected == json.loads((GOLDEN / "run.create.v3.json").read_text())
    assert decode(json.dumps(v2).encode()) == decode(json.dumps(expected).encode())


def test_run_create_v3_upcasts_to_v4_exactly_as_recorded() -> None:
    v3 = json.loads((GOLDEN / "run.create.v3.json").read_text())
    expected = json.loads((GOLDEN / "run.create.v3-as-v4.json").read_text())
    decoded = decode(json.dumps(v3).encode())
    assert decoded.schema_version == LATEST["run.create"] == 4
    assert decoded.model_dump(mode="json") == expected
    # v3 could not set timeouts: the run takes its kind's defaults
    assert decoded.payload.timeouts is None


def test_a_v4_create_carries_its_timeouts_and_refuses_what_is_not_positive_seconds() -> None:
    v4 = json.loads((GOLDEN / "run.create.v3-as-v4.json").read_text())
    v4["payload"] |= {"timeouts": {"schedule_to_start": 30, "start_to_close": 2.5}}
    decoded = decode(json.dumps(v4).encode())
    assert (decoded.payload.timeouts.schedule_to_start, decoded.payload.timeouts.start_to_close) == (30.0, 2.5)
    assert decode(json.dumps({**v4, "payload": {**v4["payload"], "timeouts": {"start_to_close": 9}}}).encode()
                  ).payload.timeouts.schedule_to_start is None
    for bad in ({"schedule_to_start": 0}, {"start_to_close": -1}, {"start_to_close": "soon"}, {"queue": 5}):
        with pytest.raises(DecodeError, match="timeouts"):
            decode(json.dumps({**v4, "payload": {**v4["payload"], "timeouts": bad}}).encode())


def test_a_v3_create_carries_its_scope_and_an_aware_deadline() -> None:
    v3 = json.loads((GOLDEN / "run.create.v3.json").read_text())
    v3["payload"] |= {"scope": {"tools": ["forge.read_*"], "resources": ["repo:acme/payments"]},
                      "deadline": "2026-10-04T08:00:00+02:00"}
    decoded = decode(json.dumps(v3).encode())
    assert decoded.payload.scope.tools == ["forge.read_*"]
    assert decoded.payload.deadline.timestamp() == 1791093600.0
    for bad in ({"scope": {"tools": ["forge.*.write"]}}, {"deadline": "2026-10-04T08:00:00"}):
        with pytest.raises(DecodeError):
            decode(json.dumps({**v3, "payload": {**v3["payload"], **bad}}).encode())


def test_upcasters_do_not_mutate_their_input() -> None:
    payload = {"workflow": "w", "idempotency_key": "k", "budget_usd": 3.5}
    before = dict(payload)
    assert upcast_run_create_v1_v2(payload)["budget"] == {"cost_usd": 3.5}
    assert payload == before
    v2 = {"workflow": "w", "idempotency_key": "k"}
    assert upcast_run_create_v2_v3(v2) == {**v2, "scope": None, "deadline": None} and v2 == {"workflow": "w",
                                                                                           "idempotency_key": "k"}
    v3 = {"workflow": "w", "idempotency_key": "k", "deadline": None}
    assert upcast_run_create_v3_v4(v3) == {**v3, "timeouts": None} and "timeouts" not in v3


@pytest.mark.parametrize("key", sorted(UPCASTERS))
def test_every_upcaster_has_a_golden_file(key: tuple[str, int]) -> None:
    type_, version = key
    assert (GOLDEN / f"{type_}.v{version}.json").exists()


@pytest.mark.parametrize(("type_", "old", "latest"),
                         [("run.event", 1, 3), ("run.event", 2, 3), ("run.rejected", 1, 3),
                          ("run.rejected", 2, 3)])
def test_older_broadcasts_upcast_to_the_newest_exactly_as_recorded(type_: str, old: int, latest: int) -> None:
    recorded = json.loads((GOLDEN / f"{type_}.v{old}.json").read_text())
    expected = json.loads((GOLDEN / f"{type_}.v{old}-as-v{latest}.json").read_text())
    decoded = decode(json.dumps(recorded).encode())
    assert decoded.schema_version == LATEST[type_] == latest
    assert decoded.model_dump(mode="json") == expected


def test_a_v1_refusal_gets_the_code_its_hashes_tell() -> None:
    reused = upcast_run_rejected_v1_v2({"idempotency_key": "k", "reason": "r", "recorded_input_hash": "a",
                                        "offered_input_hash": "b", "existing_run_id": "run-1"})
    unknown = upcast_run_rejected_v1_v2({"idempotency_key": "k", "reason": "unknown run kind 'x'"})
    assert (reused["code"], unknown["code"]) == ("idempotency_key_reused", "unknown_workflow")


V2_CODES = ("invalid_payload", "unknown_schema_version", "unknown_workflow", "unknown_workflow_version",
            "input_too_large", "idempotency_key_reused")


@pytest.mark.parametrize("code", V2_CODES)
def test_every_v2_refusal_decodes_as_v3_with_its_code(code: str) -> None:
    v2 = json.loads((GOLDEN / "run.rejected.v2.json").read_text())
    v2["payload"]["code"] = code
    decoded = decode(json.dumps(v2).encode())
    assert (decoded.schema_version, decoded.payload.code) == (3, code)
    assert decoded.payload.code == RejectionCode(code)


def test_v2_keeps_its_closed_list_and_v3_takes_every_code_known_and_to_come() -> None:
    v2 = json.loads((GOLDEN / "run.rejected.v2.json").read_text())
    v3 = json.loads((GOLDEN / "run.rejected.v2-as-v3.json").read_text())
    assert {code.value for code in RejectionCodeV2} == set(V2_CODES)
    for code in [*RejectionCode, "quota_exceeded"]:
        code = getattr(code, "value", code)
        decoded = decode(json.dumps({**v3, "payload": {**v3["payload"], "code": code}}).encode())
        assert decoded.payload.code == code
    for new in ("input_invalid", "tenant_not_allowed"):
        with pytest.raises(DecodeError, match="payload.code"):
            decode(json.dumps({**v2, "payload": {**v2["payload"], "code": new}}).encode())
    for malformed in ("", "Input Invalid", "tenant.not_allowed", "x" * 65):
        with pytest.raises(DecodeError, match="payload.code"):
            decode(json.dumps({**v3, "payload": {**v3["payload"], "code": malformed}}).encode())


def test_the_runtime_sends_v3_refusals() -> None:
    made = make("run.rejected", {"code": RejectionCode.TENANT_NOT_ALLOWED, "reason": "r"}, producer="scheduler",
                tenant_id="acme")
    assert (made.schema_version, LATEST["run.rejected"]) == (3, 3)
    assert decode(encode(made)).payload.code == "tenant_not_allowed"


def test_run_accepted_v1_upcasts_to_v2_without_an_outcome_exactly_as_recorded() -> None:
    v1 = json.loads((GOLDEN / "run.accepted.v1.json").read_text())
    expected = json.loads((GOLDEN / "run.accepted.v1-as-v2.json").read_text())
    decoded = decode(json.dumps(v1).encode())
    assert decoded.schema_version == LATEST["run.accepted"] == 2
    assert decoded.model_dump(mode="json") == expected
    # v1 never said whether the run had ended: a v1 repeat carries no outcome
    assert decoded.payload.repeated is True and decoded.payload.outcome is None
