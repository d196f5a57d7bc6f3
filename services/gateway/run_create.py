"""``POST /runs``: producers without AMQP. The body is a run.create as the bus carries it, less what the
gateway fills in; it is read by the bus's own contract (``longrun_client.registry.decode``: the same
versions, upcasters and refusals) and created by the scheduler's one admission
(``app.scheduler.admit.create_run``: the same tables, idempotency and ``run.accepted`` through the outbox).

The caller needs the ``create_runs`` permission, which no role carries, and must see the create's tenant
(403 otherwise, audited). The ``Idempotency-Key`` header must be there and equal the payload's
``idempotency_key`` (400): a proxy or client retrying the request retries that create, never another.
A refusal the create's reading or admission makes answers its ``run.rejected`` code with the status
``STATUS`` gives it; admission's refusals are published on the bus too, as for a bus create.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from longrun_client.model import new_event_id, utcnow
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from longrun.app.scheduler.admit import create_run
from longrun.authoring import Registry
from longrun.config import Settings
from longrun.db import audit as audit_log
from longrun.db.transaction import PgTransaction
from longrun.envelope import Envelope, decode
from longrun.envelope.payloads import RejectionCode
from longrun.envelope.registry import traceparent
from longrun.errors import PoisonMessage, UnknownSchemaVersion
from longrun.principals import Principal
from longrun.services.gateway import api

HEADER = "idempotency-key"
STATUS: dict[RejectionCode, int] = {
    RejectionCode.INVALID_PAYLOAD: 422,
    RejectionCode.UNKNOWN_SCHEMA_VERSION: 422,
    RejectionCode.UNKNOWN_WORKFLOW: 422,
    RejectionCode.UNKNOWN_WORKFLOW_VERSION: 422,
    RejectionCode.INPUT_TOO_LARGE: 413,
    RejectionCode.IDEMPOTENCY_KEY_REUSED: 409,
    RejectionCode.INPUT_INVALID: 422,
    RejectionCode.TENANT_NOT_ALLOWED: 403,
    RejectionCode.CONCURRENCY_KEY_HELD: 409,
}
"""Each ``run.rejected`` code's HTTP status: a create that cannot be read or names what this runtime does
not run is unprocessable (422), a key already taken by another input or a concurrency key its kind
refuses to share conflicts (409), an input past
``LONGRUN_MAX_INPUT_BYTES`` is too large (413), a tenant the caller may not create in is forbidden (403)."""
PRODUCER_PREFIX = "gateway:"
"""A create made over HTTP names its caller as its producer: ``gateway:<subject>``."""


class Refusal(Exception):
    """The create is refused before admission reads it: the status, why, and its code if it has one."""

    def __init__(self, status: int, error: str, code: RejectionCode | None = None) -> None:
        self.status = status
        self.code = code
        super().__init__(error)

    def response(self) -> Response:
        return JSONResponse({"error": str(self), "code": None if self.code is None else self.code.value},
                            status_code=self.status)


def envelope_of(body: api.CreateRun, key: str | None, principal: Principal) -> Envelope:
    """The run.create envelope ``body`` asks for, read as the bus reads one; ``Refusal`` otherwise."""
    if not principal.sees(body.tenant_id):
        raise Refusal(403, f"{principal.subject} may not create runs in tenant {body.tenant_id!r}",
                      RejectionCode.TENANT_NOT_ALLOWED)
    if key is None:
        raise Refusal(400, "the Idempotency-Key header is required: the payload's idempotency_key, again")
    if body.payload.get("idempotency_key") != key:
        raise Refusal(400, "the Idempotency-Key header must equal payload.idempotency_key")
    raw = json.dumps({"event_id": new_event_id(), "type": "run.create", "schema_version": body.schema_version,
                      "producer": PRODUCER_PREFIX + principal.subject, "tenant_id": body.tenant_id,
                      "trace": traceparent(), "correlation_id": body.correlation_id,
                      "occurred_at": utcnow().isoformat(), "payload": body.payload}).encode()
    try:
        return decode(raw)
    except UnknownSchemaVersion as e:
        raise Refusal(422, str(e), RejectionCode.UNKNOWN_SCHEMA_VERSION) from None
    except PoisonMessage as e:
        raise Refusal(422, str(e), RejectionCode.INVALID_PAYLOAD) from None


def create_route(engine: AsyncEngine, settings: Settings,
                 kinds: Registry) -> Callable[[Request, Principal], Awaitable[Response]]:
    """The handler of ``POST /runs``, for a caller who holds ``create_runs``."""
    async def create(request: Request, principal: Principal) -> Response:
        body = api.body(api.CreateRun, await request.body())
        try:
            envelope = envelope_of(body, request.headers.get(HEADER), principal)
        except Refusal as refused:
            if refused.code is RejectionCode.TENANT_NOT_ALLOWED:
                async with engine.begin() as conn:
                    await audit_log.audit(conn, actor=principal.subject, action="run.create.refused",
                                          target=body.tenant_id, reason=str(refused),
                                          details={"idempotency_key": request.headers.get(HEADER)})
            return refused.response()
        async with engine.begin() as conn:
            answered = await create_run(PgTransaction(conn), envelope, kinds=kinds, partitions=settings.partitions,
                                        slots=settings.tenant_slots, max_input_bytes=settings.max_input_bytes)
        return _answer(answered.answer)
    return create


def _answer(answer: Envelope) -> Response:
    """The run.accepted (201 made, 200 made before) or run.rejected (its code's status) admission sent."""
    payload: dict[str, Any] = answer.payload.model_dump(mode="json")
    if answer.type == "run.accepted":
        return JSONResponse(payload, status_code=200 if payload["repeated"] else 201)
    code = RejectionCode(payload["code"])
    return JSONResponse({"error": payload["reason"], "code": code.value, "rejected": payload},
                        status_code=STATUS[code])
