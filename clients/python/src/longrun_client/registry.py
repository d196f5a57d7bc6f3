"""Parse bytes into envelopes by (type, schema_version) — or refuse, never guess.

``decode`` is the only way a message body becomes an envelope. Malformed bytes raise
``DecodeError``, as do NaN and Infinity (not JSON, though Python's parser takes them) and strings
PostgreSQL cannot store (``longrun_client.storable``); a known type with an unknown version raises
``UnknownSchemaVersion``; both are ``PoisonMessage`` and go to quarantine with their reason. An older version is
upcast to the newest before validation, so handlers only see current payloads.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from opentelemetry import propagate
from pydantic import BaseModel, ValidationError, create_model

from longrun_client import payloads
from longrun_client.errors import DecodeError, UnknownSchemaVersion
from longrun_client.model import Envelope, envelope_fields
from longrun_client.storable import unstorable
from longrun_client.upcast import upcast

# (type, version) -> payload model; every version a producer may still send.
PAYLOADS: dict[tuple[str, int], type[BaseModel]] = {
    ("run.create", 1): payloads.RunCreateV1,
    ("run.create", 2): payloads.RunCreateV2,
    ("run.create", 3): payloads.RunCreateV3,
    ("run.create", 4): payloads.RunCreateV4,
    ("run.signal", 1): payloads.RunSignalV1,
    ("run.wakeup", 1): payloads.RunWakeupV1,
    ("run.accepted", 1): payloads.RunAcceptedV1,
    ("run.accepted", 2): payloads.RunAcceptedV2,
    ("run.event", 1): payloads.RunEventV1,
    ("run.event", 2): payloads.RunEventV2,
    ("run.event", 3): payloads.RunEventV3,
    ("run.rejected", 1): payloads.RunRejectedV1,
    ("run.rejected", 2): payloads.RunRejectedV2,
    ("run.rejected", 3): payloads.RunRejectedV3,
    ("run.notice", 1): payloads.RunNoticeV1,
}


def _envelope_model(type_: str, version: int, payload: type[BaseModel]) -> type[Envelope]:
    name = "".join(part.title() for part in type_.split(".")) + f"V{version}Envelope"
    model: type[Envelope] = create_model(  # type: ignore[call-overload]
        name,
        __base__=Envelope,
        type=(Literal[type_], ...),
        schema_version=(Literal[version], ...),
        payload=(payload, ...),
    )
    return model


ENVELOPES: dict[tuple[str, int], type[Envelope]] = {
    key: _envelope_model(*key, model) for key, model in PAYLOADS.items()
}
LATEST: dict[str, int] = {}
for _type, _version in PAYLOADS:
    LATEST[_type] = max(_version, LATEST.get(_type, 0))


def known_versions(type_: str) -> list[int]:
    return sorted(v for t, v in PAYLOADS if t == type_)


def decode(raw: bytes) -> Envelope:
    """Bytes -> the newest envelope model for its type; PoisonMessage on anything else."""
    try:
        # Decoded strictly first: json.loads would take UTF-16 and UTF-8-encoded lone surrogates.
        text = raw.decode("utf-8")
        data = _STRICT_JSON.decode(text)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DecodeError(f"body is not JSON: {e}", raw) from e
    except RecursionError as e:
        raise DecodeError("body is JSON nested deeper than the parser's recursion limit", raw) from e
    if not isinstance(data, dict):
        raise DecodeError("body is not a JSON object", raw)
    # In valid UTF-8 both can only be written as a \u escape: a body without one has neither.
    if "\\u" in text and (where := unstorable(data)) is not None:
        raise DecodeError(f"the text at {where} holds U+0000 or a lone surrogate, which cannot be stored", raw)
    type_, version = data.get("type"), data.get("schema_version")
    if not isinstance(type_, str) or type_ not in LATEST:
        raise DecodeError(f"unknown message type {type_!r}", raw)
    if not isinstance(version, int) or isinstance(version, bool):
        raise DecodeError(f"schema_version must be an integer, got {version!r}", raw)
    if (type_, version) not in PAYLOADS:
        raise UnknownSchemaVersion(type_, version, known_versions(type_))
    try:
        ENVELOPES[(type_, version)].model_validate(data)
        latest = LATEST[type_]
        if version < latest:
            payload = data.get("payload")
            data = {**data, "schema_version": latest,
                    "payload": upcast(type_, version, dict(payload), latest)}
        return ENVELOPES[(type_, latest)].model_validate(data)
    except ValidationError as e:
        raise DecodeError(f"{type_} v{version} failed validation: {_summary(e)}", raw) from e


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


_STRICT_JSON = json.JSONDecoder(parse_constant=_not_json)
"""Built once: ``json.loads`` with a keyword builds a decoder on every call."""


def _summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        loc = ".".join(str(p) for p in item["loc"]) or "<root>"
        parts.append(f"{loc}: {item['msg']}")
    return "; ".join(parts)


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json().encode()


def make(type_: str, payload: BaseModel | dict[str, Any], **meta: Any) -> Envelope:
    """Build a current-version envelope; ``meta`` sets producer, tenant_id, run_id, ...

    Made inside a span, it carries that span's traceparent unless ``trace`` is given.
    """
    meta.setdefault("trace", traceparent())
    version = LATEST[type_]
    model = ENVELOPES[(type_, version)]
    fields = envelope_fields(type=type_, schema_version=version, **meta)
    body = payload.model_dump() if isinstance(payload, BaseModel) else payload
    return model.model_validate({**fields, "payload": body})


def traceparent() -> str | None:
    """The current span's W3C traceparent, through the global propagator (None outside a span).

    Only opentelemetry-api is needed: a process with an SDK gets its spans' traceparents, one
    without it the traceparent of a context it continued (or None)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")
