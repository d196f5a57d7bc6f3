"""The console's acts on a run: each form of the run page is read into the operator API's body for the
action of the same name (``api.RUN_ACTIONS``: approve, deny, answer, signals, resolve, retry-action,
pause, resume, retry, cancel, terminate, migrate) and done by the API's use case (``run_acts.perform``), so a
console act is checked, recorded and audited exactly as the API's is. What the run page offers is
what the run allows now (``operate.allowed_operations``) and the principal's role allows
(``api.RUN_ACTIONS``' roles); a form posted all the same is refused as the API refuses it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel

from longrun.authoring import Registry
from longrun.domain import SIGNAL_FACT_PREFIX
from longrun.principals import Principal
from longrun.services.gateway import api

JSON_FIELDS = frozenset({"answer", "receipt", "payload"})
"""Form fields that hold a JSON value (an answer, a receipt, a signal's payload), read as JSON; every
other field is text."""

DONE = {"approve": "approved", "deny": "denied", "answer": "answered", "signals": "signalled", "resolve": "resolved",
        "retry-action": "action-retried", "retry": "retried", "pause": "paused", "resume": "resumed",
        "cancel": "cancelled", "terminate": "terminated", "migrate": "migrated"}
"""The notice a redirect after each act names (``console.NOTICES``)."""


def body(name: str, form: Mapping[str, str]) -> BaseModel:
    """The body of the action ``name`` from its form's fields, checked as the API checks a request's
    (``api.body``: the fields, their depth and characters); ``api.Invalid`` naming each problem. A blank
    optional field (and a blank JSON field) is left out, as if the form had not sent it."""
    op = api.RUN_ACTIONS[name]
    assert op.body is not None
    fields: dict[str, Any] = {}
    for field, info in op.body.model_fields.items():
        raw = form.get(field)
        if raw is None or (not raw.strip() and (field in JSON_FIELDS or not info.is_required())):
            continue
        fields[field] = _json(field, raw) if field in JSON_FIELDS else raw
    return api.body(op.body, orjson.dumps(fields))


def permitted(principal: Principal) -> frozenset[str]:
    """The run actions the principal's roles allow (an approval's or question's owner is asked apart)."""
    return frozenset(name for name, op in api.RUN_ACTIONS.items()
                     if op.role is not None and principal.may(op.role))


def signal_names(kinds: Registry, kind: str, version: str) -> list[str]:
    """The signals a run of ``kind`` at ``version`` accepts (``RunKind.signals``), if this gateway deploys it."""
    try:
        return sorted(kinds.get(kind, version).signals)
    except LookupError:
        return []


def received_signals(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The signals a run's view holds (its facts ``signal:<id>``), oldest first, as the run page lists them."""
    found = [{"signal_id": f["key"].removeprefix(SIGNAL_FACT_PREFIX), **f["value"], "source": f["source"],
              "recorded_at": f["recorded_at"]}
             for f in snapshot["facts"] if f["key"].startswith(SIGNAL_FACT_PREFIX) and isinstance(f["value"], dict)]
    return sorted(found, key=lambda s: s["recorded_at"])


def migration_targets(kinds: Registry, kind: str, version: str) -> list[str]:
    """The workflow versions of ``kind`` deployed on this gateway that declare they take over runs of
    ``version`` (``RunKind.migrates_from``); whether at the run's stage, the use case checks and says."""
    return [v for name, v in kinds.advertised()
            if name == kind and v != version and version in kinds.get(kind, v).migrates_from]


def _json(field: str, raw: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise api.Invalid(422, [f"{field} is not JSON: {e}"]) from None
