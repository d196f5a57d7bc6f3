"""An operator's act on a run (``POST /runs/{run_id}/<action>`` of the operator API, and the console's
forms of the same name): the use case of ``longrun.app.gateway.operate`` each body calls, and the status
each refusal answers. One place, so the API and the console cannot act or refuse differently."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from longrun.app import signals
from longrun.app.gateway import operate
from longrun.authoring import Registry
from longrun.errors import DomainError, LongrunError
from longrun.ports.stores import RunTransaction
from longrun.principals import Principal
from longrun.services.gateway import api

_STEERS = {"cancel": operate.cancel, "pause": operate.pause, "resume": operate.resume, "retry": operate.retry}

REFUSALS = (operate.RunNotFound, DomainError, LongrunError)
"""What an act raises when it is refused; ``refusal_status`` says the answer's status."""


async def perform(tx: RunTransaction, run_id: str, name: str, body: BaseModel, *, by: Principal,
                  kinds: Registry) -> dict[str, Any]:
    """The operation ``name`` on a run, with its body as the contract took it, by ``by``."""
    actor = by.subject
    if isinstance(body, api.Decide):
        return await operate.decide_approval(tx, run_id, approval_id=body.approval_id,
                                             approved_hash=body.approved_hash, approved=name == "approve",
                                             by=by, reason=body.reason)
    if isinstance(body, api.Answer):
        return await operate.answer(tx, run_id, question_id=body.question_id, answer=body.answer, by=by,
                                    reason=body.reason)
    if isinstance(body, api.Signal):
        return await signals.send(tx, run_id, signal_id=body.signal_id, name=body.name, payload=body.payload,
                                  sent_by=f"operator:{actor}", actor=actor, kinds=kinds, reason=body.reason)
    if isinstance(body, api.Resolve):
        return await operate.resolve_action(tx, run_id, logical_action=body.logical_action,
                                            done=body.outcome == "confirmed", external_id=body.external_id,
                                            receipt=body.receipt, actor=actor, reason=body.reason)
    if isinstance(body, api.RetryAction):
        return await operate.retry_action(tx, run_id, logical_action=body.logical_action, actor=actor,
                                          reason=body.reason)
    if isinstance(body, api.Migrate):
        return await operate.migrate(tx, run_id, to_version=body.to_version, actor=actor, reason=body.reason,
                                     kinds=kinds)
    assert isinstance(body, api.Steer)
    if name == "terminate":
        return await operate.terminate(tx, run_id, actor=actor, reason=body.reason, kinds=kinds)
    return await _STEERS[name](tx, run_id, actor=actor, reason=body.reason)


def refusal_status(e: Exception) -> int:
    """404 no such run; 403 not the principal the request names; 422 an answer, signal or resolution that
    does not fit; 409 anything else the run does not allow now."""
    if isinstance(e, operate.RunNotFound):
        return 404
    if isinstance(e, operate.NotPermitted):
        return 403
    if isinstance(e, operate.AnswerRefused | signals.SignalRefused | operate.ResolutionRefused):
        return 422
    return 409
