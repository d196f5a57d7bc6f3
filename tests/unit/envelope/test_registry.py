"""The registry parses by (type, schema_version) or refuses; it never guesses."""

from __future__ import annotations

import json

import pytest

from longrun.envelope import decode, encode, make
from longrun.errors import DecodeError, UnknownSchemaVersion


def _wire(**overrides: object) -> bytes:
    body = json.loads(encode(make("run.wakeup", {"wakeup_id": "w", "reason": "r"}, producer="p",
                                  tenant_id="t", run_id="run-1")))
    body.update(overrides)
    return json.dumps(body).encode()


def test_a_message_round_trips() -> None:
    envelope = make("run.create", {"workflow": "w", "idempotency_key": "k"}, producer="p", tenant_id="t")
    assert decode(encode(envelope)) == envelope


@pytest.mark.parametrize(("raw", "reason"), [
    (b"\xff\xfe", "body is not JSON"),
    (b"[1, 2]", "body is not a JSON object"),
    (_wire(type="run.explode"), "unknown message type 'run.explode'"),
    (_wire(schema_version="1"), "schema_version must be an integer"),
    (_wire(extra_field=1), "extra_field: Extra inputs are not permitted"),
    (_wire(payload={"wakeup_id": "w"}), "payload.reason: Field required"),
    (_wire(tenant_id=""), "tenant_id: String should match pattern"),
    (_wire(tenant_id="acme.eu"), "tenant_id: String should match pattern"),
    # Found by the fuzzer (tests/fuzz): each of these got past decode and failed every write after it,
    # or escaped it as another exception and ended the consumer's loop.
    (b"[" * 5000 + b"]" * 5000, "nested deeper than the parser's recursion limit"),
    (_wire(expected_state_version=float("nan")), "NaN is not a JSON value"),
    (_wire(run_id="run-\x00"), "the text at ['run_id'] holds U+0000"),
    (_wire(payload={"wakeup_id": "w", "reason": "\ud800"}), "the text at ['payload']['reason'] holds"),
    (_wire(payload={"wakeup_id": "w", "reason": "r", "\x00": 1}), "the key ['payload']['\\x00'] holds"),
    (_wire(run_id="\ud83d").replace(b"\\ud83d", b"\xed\xa0\xbd"), "body is not JSON: 'utf-8' codec"),
    ('{"type": "run.wakeup"}'.encode("utf-16"), "body is not JSON: 'utf-8' codec"),
])
def test_malformed_messages_are_poison_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(raw)
    assert reason in str(caught.value)
    assert caught.value.raw == raw


def test_text_with_escapes_postgresql_can_store_is_read() -> None:
    envelope = make("run.create", {"workflow": "w", "idempotency_key": "k\u00e9\U0001f4a9",
                                   "input": {"path": "C:\\u0000"}}, producer="p", tenant_id="t")
    assert decode(encode(envelope)) == envelope
    assert decode(json.dumps(envelope.model_dump(mode="json")).encode()) == envelope


def test_an_unknown_version_of_a_known_type_is_refused_not_guessed() -> None:
    with pytest.raises(UnknownSchemaVersion) as caught:
        decode(_wire(schema_version=2))
    assert str(caught.value) == "unknown schema_version 2 for type 'run.wakeup' (known: 1)"
