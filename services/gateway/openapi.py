"""The operator API's OpenAPI 3.1 document, rendered from its route table (``longrun.services.gateway.api``).

``python -m longrun.services.gateway.openapi schemas/openapi.json`` writes it (``make schemas``); the gateway
serves the same document at ``GET /openapi.json``; a unit test fails when the committed file drifts.
"""

from __future__ import annotations

import json
import re
import sys
from http import HTTPStatus
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from longrun import __version__
from longrun.services.gateway import api, api_responses

REF = "#/components/schemas/{model}"
_DESCRIPTION = (
    "Search, inspect and steer runs, read the audit log and the alerts, replay quarantined messages and set "
    "tenants' policies, manage named API tokens. Every operation but /healthz needs a bearer token, which names "
    "who acts (the audit log's actor, the approver an approval is checked against): a named API token, an OIDC "
    "token (JWT) of the configured issuer, or a bootstrap token. 401: no valid token; 403: the caller lacks the "
    "role the operation needs (x-longrun-role: viewer < operator < approver < admin, each allowing what the ones "
    "before it allow), the permission it needs beside the roles (x-longrun-permission: create_runs, which no "
    "role carries), or is not the approver the request names. A caller sees only its tenants: another "
    "tenant's run answers 404, and creating a run in another tenant 403. Every action takes a reason, which is "
    "audited.\n\n"
    + (api.__doc__ or "").split("\n\n", 1)[1].strip())


def document() -> dict[str, Any]:
    models = _models()
    refs, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    schemas = {name: schema for name, schema in sorted(defs["$defs"].items())}
    paths: dict[str, dict[str, Any]] = {}
    for op in api.OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "longrun operator API", "version": __version__, "description": _DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"operatorToken": {
                "type": "http", "scheme": "bearer",
                "description": "A named API token (longrunctl token create), an OIDC token (JWT) of "
                               "LONGRUN_OIDC_ISSUER, or a bootstrap token of LONGRUN_OPERATOR_TOKENS."}},
        },
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def _models() -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = [api_responses.Error]
    for op in api.OPERATIONS:
        for model in (op.body, op.response, op.refusal):
            if model is not None and model not in seen:
                seen.append(model)
    return seen


def _ref(refs: dict[Any, Any], model: type[BaseModel]) -> dict[str, Any]:
    return refs[(model, "validation")]  # type: ignore[no-any-return]


def _operation(op: api.Operation, refs: dict[Any, Any]) -> dict[str, Any]:
    def json_content(model: type[BaseModel]) -> dict[str, Any]:
        return {"application/json": {"schema": _ref(refs, model)}}

    parameters = [_path_parameter(name) for name in re.findall(r"{(\w+)}", op.path)]
    if op.query is not None:
        parameters += _query_parameters(op.query)
    binary = {"schema": {"type": "string", "format": "binary"}}
    responses = {"200": {"description": "OK", "content": {"*/*": binary} if op.response is None
                         else json_content(op.response)}}
    if op.event_stream:
        # OpenAPI 3.1 has a text/event-stream's schema describe each event, as its fields read
        # (a frame of ``retry`` alone included).
        event = {"type": "object", "properties": {
            "event": {"enum": list(op.event_stream)}, "id": {"type": "string"}, "data": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0}}}
        responses["200"]["content"] = {"text/event-stream": {"schema": event}}
    if op.idempotency_key:
        assert op.response is not None
        parameters.append(IDEMPOTENCY_KEY)
        responses = {"201": {"description": "Created", "content": json_content(op.response)},
                     "200": {"description": "Created before, by the same request", "content": json_content(op.response)}}
    for status in op.errors:
        responses[str(status)] = {"description": HTTPStatus(status).phrase,
                                  "content": json_content(op.refusal)}
    operation: dict[str, Any] = {"operationId": op.name, "summary": op.summary, "responses": responses,
                                 "security": [{"operatorToken": []}] if op.authenticated else []}
    if op.role:
        operation["x-longrun-role"] = op.role
    if op.permission:
        operation["x-longrun-permission"] = op.permission
    if op.authenticated:
        operation["x-longrun-every-tenant"] = op.every_tenant
    if op.body is not None:
        operation["requestBody"] = {"required": True, "content": json_content(op.body)}
    if op.raw_body:
        operation["requestBody"] = {"required": True, "description": "The artifact's bytes; Content-Type: their "
                                    "media type.", "content": {"application/octet-stream": binary}}
    if parameters:
        operation["parameters"] = parameters
    return operation


IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": True,
                   "description": "The payload's idempotency_key, again: a retry sends the same one.",
                   "schema": {"type": "string", "minLength": 1, "maxLength": 200}}


def _path_parameter(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": api.PATH_PARAMETERS[name].json_schema()}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema()
    parameters = []
    for name, prop in schema["properties"].items():
        prop = _without_null(prop)
        description = prop.pop("description", None)
        prop.pop("title", None)
        prop.pop("default", None)
        parameter = {"name": name, "in": "query", "required": False, "schema": prop}
        if prop.get("type") == "array":
            parameter.update(style="form", explode=True)
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return parameters


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter is absent, never null: its schema without the null branch."""
    options = [o for o in prop.get("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        return {**options[0], **{k: v for k, v in prop.items() if k != "anyOf"}}
    return dict(prop)


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas/openapi.json")
    target.write_text(render())


if __name__ == "__main__":
    main()
