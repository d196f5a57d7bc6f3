"""The operator API's contract, in one place: a model for each request body, query and response, the
errors each route answers, and the route table the gateway validates requests by and
``longrun.services.gateway.openapi`` renders ``schemas/openapi.json`` from.

Requests are checked here before anything is read or written: a body that is not a JSON object or
lacks a required field is refused with 400, one whose fields have the wrong type or a value not
allowed with 422; a query or path parameter outside its schema, or one the operation does not name,
with 400. Text cannot hold the NUL
character (U+0000), which PostgreSQL cannot store; such a request is refused the same way. A body
nested more than 64 arrays or objects deep is refused with 400, and one larger than its route takes
with 413, as soon as the bytes read pass the limit.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from longrun_client.model import TENANT_PATTERN
from longrun_client.payloads import SIGNAL_NAME_PATTERN
from pydantic import BaseModel, BeforeValidator, Field, TypeAdapter, ValidationError, model_validator

from longrun.db import pages
from longrun.services.gateway.api_responses import (
    ActionResult,
    Answered,
    Attached,
    CeilingView,
    AuditPage,
    CreatedToken,
    CreateRefused,
    Health,
    LimitsCeiling,
    LimitsView,
    Me,
    Migrated,
    Policy,
    QuarantineList,
    ReplayResult,
    Resolved,
    RunAccepted,
    RunPage,
    RunView,
    Signalled,
    Token,
    TokenList,
    VersionsReport,
)
from longrun.services.gateway.api_operation import ACT as _ACT
from longrun.services.gateway.api_operation import READ as _READ
from longrun.services.gateway.api_operation import Operation
from longrun.services.gateway.api_schedules import SCHEDULE_OPERATIONS
from longrun.services.gateway.api_types import (
    DURATION,
    RUN_STATUS,
    TOKEN_NAME,
    Permission,
    Query,
    Reason,
    Role,
    Strict,
    Text,
)

M = TypeVar("M", bound=BaseModel)


# --- request bodies -------------------------------------------------------------------------------

class Steer(Strict):
    """``cancel``, ``pause``, ``resume``, ``terminate``: the reason is all they take."""

    reason: Reason


class Decide(Strict):
    """``approve`` or ``deny`` exactly the request with this hash, as shown in ``GET /runs/{run_id}``."""

    approval_id: Text
    approved_hash: Text
    reason: Reason


class Answer(Strict):
    """An answer to the question the run asks; checked against the question's answer schema."""

    question_id: Text
    answer: Any = Field(description="Any JSON value the question's answer schema accepts.")
    reason: Reason


class Signal(Strict):
    """A named signal for the run; its kind must declare the name, and the payload satisfy its schema."""

    signal_id: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00]*$",
                           description="Your id for it: the same id again records it once and wakes the run once.")
    name: str = Field(pattern=SIGNAL_NAME_PATTERN, description="A signal the run's kind declares.")
    payload: Any = Field(default_factory=dict, description="Any JSON value the kind's schema for the name accepts.")
    reason: Reason


class Resolve(Strict):
    """What a person found on the far side of an action in doubt: ``confirmed`` (with its external id
    and, optionally, the receipt) or ``not_done`` (it is sent again under the same idempotency key)."""

    logical_action: Text
    outcome: Literal["confirmed", "not_done"]
    external_id: Text | None = None
    receipt: dict[str, Any] | None = None
    reason: Reason


class RetryAction(Strict):
    """Send an action that FAILED again, under the same idempotency key, once its cause is fixed."""

    logical_action: Text
    reason: Reason


class Migrate(Strict):
    """Move the run to another workflow version of its kind that declares it takes the run over."""

    to_version: Text
    reason: Reason


class Replay(Strict):
    reason: Reason


class PolicyChange(Strict):
    """The tenant's whole policy (or ceiling): tool names or prefixes ending in ``*``, and the resources
    tools act on."""

    tools: list[Text]
    resources: list[Text]
    reason: Reason


Bound = Annotated[int, Field(ge=0, le=2**62)]
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
ToolGroups = dict[Annotated[str, Field(min_length=1, pattern=r"^[^\x00]*$")], Annotated[int, Field(ge=1, le=2**31 - 1)]]


class LimitsChange(Strict):
    """The tenant's whole limits; null (or left out): the platform's default (``LONGRUN_TENANT_*``)."""

    run_slots: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = Field(None, description="Runs admitted at once.")
    token_budget: Bound | None = Field(None, description="Model tokens (input and output) per budget period.")
    cost_budget: Amount | None = Field(None, description="Model cost per budget period.")
    tool_concurrency: ToolGroups = Field({}, description="Calls in flight at once per tool group (a tool name or "
                                                         "a prefix ending in *).")
    reason: Reason


class LimitsCeilingChange(Strict):
    """Ceilings of the tenant's limits that its own admins may not set past; a setting left out keeps
    its ceiling, null is unbounded."""

    run_slots: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    token_budget: Bound | None = None
    cost_budget: Amount | None = None
    tool_concurrency: ToolGroups | None = None
    reason: Reason


class TokenRequest(Strict):
    """A named API token: ``name`` is who acts with it, in the audit log and for approvals bound to a
    subject; ``tenants`` null: every tenant. It holds a role, a permission or both: a producer's token
    may hold ``create_runs`` alone."""

    name: Annotated[str, Field(pattern=TOKEN_NAME)]
    roles: list[Role]
    permissions: list[Permission] = Field([], description="Grants beside the roles, implied by none of them: "
                                                          "create_runs lets the token create runs (POST /runs).")
    tenants: list[Annotated[str, Field(pattern=TENANT_PATTERN)]] | None
    expires_in: Text | None = Field(None, description=f"Refused this long after its creation ({DURATION}); "
                                                      "none: until revoked.")
    reason: Reason

    @model_validator(mode="after")
    def _grants_something(self) -> TokenRequest:
        if not self.roles and not self.permissions:
            raise ValueError("a token needs a role or a permission: one with neither could do nothing")
        return self


class Revoke(Strict):
    reason: Reason


class CreateRun(Strict):
    """A run.create as a producer publishes it on the bus, less what the gateway fills in (its event id,
    time, producer and trace): ``payload`` is read by ``schema_version``, any version the bus accepts."""

    tenant_id: Annotated[str, Field(pattern=TENANT_PATTERN)]
    schema_version: int = Field(ge=1, le=2**31 - 1, description="The run.create payload's version: "
                                "schemas/run.create.v<N>.schema.json; an older one is upcast as on the bus.")
    payload: dict[str, Any] = Field(description="The run.create payload of that version; its idempotency_key "
                                                "must equal the Idempotency-Key header.")
    correlation_id: Text | None = Field(None, description="Carried by the run's events (default: the "
                                                          "idempotency key).")


# --- queries --------------------------------------------------------------------------------------

Limit = Annotated[int, Field(ge=1, le=pages.MAX_LIMIT,
                              description=f"At most this many (default {pages.DEFAULT_LIMIT})."),
                  BeforeValidator(pages.limit)]
Cursor = Annotated[Text, Field(description="The ``next_cursor`` of the page before.")]


class RunSearch(Query):
    """Every filter given must match; newest first."""

    tenant_id: Annotated[str, Field(pattern=TENANT_PATTERN)] | None = None
    status: RUN_STATUS | None = None
    wait_kind: Text | None = None
    waiting_for: Annotated[str, Field(pattern=r"^[a-z_]+:[^\x00]+$", max_length=512, description=(
        "What a parked run waits for, as its view shows it: rate_limit:<limit name>, tool_concurrency:<group>."))] | None = None
    workflow_version: Text | None = None
    idempotency_key: Text | None = None
    label: list[Annotated[str, Field(pattern=r"^[^=\x00]+=[^\x00]*$", description="key=value")]] = []
    older_than: Text | None = Field(None, description=f"Created more than this long ago ({DURATION}).")
    idle_for: Text | None = Field(None, description=f"Unchanged for at least this long ({DURATION}).")
    limit: Limit | None = None
    cursor: Cursor | None = None


class AuditSearch(Query):
    actor: Text | None = None
    action: Text | None = None
    target: Text | None = None
    limit: Limit | None = None
    cursor: Cursor | None = None


class Attachment(Query):
    """``POST /runs/{run_id}/artifacts``: the artifact's bytes are the body, its media type the Content-Type."""

    name: Text = Field(description="What the run calls it: the fact artifact:<name>.")
    reason: Text = Field(description="Why it is attached, for the audit log.")


class QuarantineListing(Query):
    all: Literal["0", "1"] | None = Field(None, description="1: the entries replayed already too.")


class TokenListing(Query):
    all: Literal["0", "1"] | None = Field(None, description="1: the revoked tokens too.")


# --- path parameters ------------------------------------------------------------------------------

PATH_PARAMETERS: dict[str, TypeAdapter[Any]] = {
    "run_id": TypeAdapter(Annotated[str, Field(pattern=r"^[^/\x00]+$")]),
    "tenant_id": TypeAdapter(Annotated[str, Field(pattern=TENANT_PATTERN)]),
    "entry_id": TypeAdapter(Annotated[int, Field(ge=1, le=2**63 - 1)]),
    "content_hash": TypeAdapter(Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]),
    "token_id": TypeAdapter(Annotated[int, Field(ge=1, le=2**63 - 1)]),
    "schedule_id": TypeAdapter(Annotated[str, Field(pattern=r"^sched-[0-9a-f-]{36}$")]),
}


# --- the route table ------------------------------------------------------------------------------

def _on_a_run(action: str, body: type[BaseModel], response: type[BaseModel], summary: str,
              role: Role = "operator") -> Operation:
    first, *rest = action.split("-")
    return Operation("POST", f"/runs/{{run_id}}/{action}", first + "".join(w.title() for w in rest) + "Run", summary,
                     response, _ACT, body, role=role)


OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/runs", "searchRuns", "Runs matching every filter given, newest first, a page at a time",
              RunPage, _READ, query=RunSearch),
    Operation("POST", "/runs", "createRun", "Create a run, as a run.create on the bus would: 201 with the run made, "
              "200 with the run a repeat of the same create made (the Idempotency-Key). A refusal answers the "
              "run.rejected code: 409 idempotency_key_reused or concurrency_key_held, 413 input_too_large, 403 tenant_not_allowed, 422 "
              "every other; 400 when the header is missing or differs from payload.idempotency_key",
              RunAccepted, (400, 401, 403, 409, 413, 422, 503), body=CreateRun, role=None, permission="create_runs",
              refusal=CreateRefused, idempotency_key=True),
    Operation("GET", "/runs/{run_id}", "showRun", "A run: its state, lease, next timer, the operations allowed "
              "now and its events", RunView, (400, 401, 403, 404, 503)),
    _on_a_run("approve", Decide, ActionResult, "Approve exactly the pending request with this hash "
              "(only a principal its owner names)", role="approver"),
    _on_a_run("deny", Decide, ActionResult, "Deny the pending request with this hash", role="approver"),
    _on_a_run("answer", Answer, Answered, "Answer the question the run asks", role="approver"),
    Operation("POST", "/runs/{run_id}/signals", "signalRun", "Send the run a named signal: recorded once per "
              "signal_id, it wakes the run waiting for it; after the run ended it is kept, not applied (422: a name "
              "the run's kind does not declare, or a payload its schema refuses)", Signalled, _ACT, Signal,
              role="operator"),
    _on_a_run("resolve", Resolve, Resolved, "Settle an action in doubt with what was found on the far side"),
    _on_a_run("retry-action", RetryAction, Resolved, "Send an action that FAILED again under the same "
              "idempotency key (the run must not have ended)"),
    _on_a_run("pause", Steer, ActionResult, "Pause the run"),
    _on_a_run("resume", Steer, ActionResult, "Resume a paused run"),
    _on_a_run("retry", Steer, ActionResult, "Send a run that needs attention back to work (e.g. once its kind's "
              "code that raised is fixed); its failed steps count anew"),
    _on_a_run("cancel", Steer, ActionResult, "Cancel the run (its cleanup runs)"),
    _on_a_run("terminate", Steer, ActionResult, "End the run now, skipping cleanup"),
    _on_a_run("migrate", Migrate, Migrated, "Move the run to another workflow version of its kind"),
    Operation("GET", "/runs/{run_id}/events/stream", "streamRun", "The run's live stream as Server-Sent Events "
              "(text/event-stream): its events in seq order (status), its calls' heartbeat details (progress) and "
              "output chunks (chunk), gap when chunks were missed, end once it ended; resumable with Last-Event-ID",
              None, (400, 401, 403, 404, 503), event_stream=("status", "progress", "chunk", "gap", "end")),
    Operation("POST", "/runs/{run_id}/artifacts", "attachArtifact", "Attach evidence to the run (the fact "
              "artifact:<name>)", Attached, (400, 401, 403, 404, 413, 422, 503), query=Attachment,
              role="operator", raw_body=True),
    Operation("GET", "/runs/{run_id}/artifacts/{content_hash}", "runArtifact", "An artifact the run refers to "
              "(attached, or an action's receipt)", None, (400, 401, 403, 404, 503)),
    Operation("GET", "/versions", "versionsInUse", "Per run kind and pinned versions: open runs by status, the "
              "oldest wait, the live workers serving them", VersionsReport, (401, 403, 503), every_tenant=True),
    Operation("GET", "/audit", "auditLog", "The audit log, newest first, a page at a time", AuditPage, _READ,
              query=AuditSearch),
    Operation("GET", "/alerts", "alerts", "The alerts the reconciler raised (audit entries alert.*), newest first",
              AuditPage, _READ, query=AuditSearch),
    Operation("GET", "/quarantine", "quarantine", "Quarantined messages and why", QuarantineList, _READ,
              query=QuarantineListing, every_tenant=True),
    Operation("POST", "/quarantine/{entry_id}/replay", "replayQuarantined", "Replay one quarantined message "
              "after re-validating it (404: no such entry; 409: replayed already, or not replayable)", ReplayResult,
              (400, 401, 403, 404, 409, 422, 503), body=Replay, role="operator",
              every_tenant=True),
    Operation("GET", "/tenants/{tenant_id}/policy", "tenantPolicy", "The tenant's policy (404: it has none, or "
              "the caller does not see the tenant)", Policy, (400, 401, 403, 404, 503)),
    Operation("PUT", "/tenants/{tenant_id}/policy", "setTenantPolicy", "Replace the tenant's policy under the "
              "next version (403: an admin of one tenant asked beyond its ceiling; nothing changed)", Policy,
              (400, 401, 403, 404, 422, 503), body=PolicyChange, role="admin"),
    Operation("GET", "/tenants/{tenant_id}/ceiling", "tenantCeiling", "How far the tenant's own admins may set "
              "its policy (404: the caller does not see the tenant)", CeilingView, (400, 401, 403, 404, 503)),
    Operation("PUT", "/tenants/{tenant_id}/ceiling", "setTenantCeiling", "Replace the tenant's ceiling under the "
              "next version", CeilingView, (400, 401, 403, 404, 422, 503), body=PolicyChange, role="admin",
              every_tenant=True),
    Operation("GET", "/tenants/{tenant_id}/limits", "tenantLimits", "The tenant's limits as set and in force, "
              "their ceiling and the budget period's use (404: the caller does not see the tenant)", LimitsView,
              (400, 401, 403, 404, 503)),
    Operation("PUT", "/tenants/{tenant_id}/limits", "setTenantLimits", "Replace the tenant's limits under the next "
              "version; they hold at once (403: an admin of one tenant asked beyond its ceiling; nothing changed)",
              LimitsView, (400, 401, 403, 404, 422, 503), body=LimitsChange, role="admin"),
    Operation("PUT", "/tenants/{tenant_id}/limits/ceiling", "setTenantLimitsCeiling", "Set how far the tenant's "
              "own admins may set its limits", LimitsCeiling, (400, 401, 403, 404, 422, 503),
              body=LimitsCeilingChange, role="admin", every_tenant=True),
    Operation("GET", "/me", "whoAmI", "Who the bearer token names: subject, roles, permissions, tenants, groups", Me,
              (401, 503), role=None, any_principal=True),
    Operation("GET", "/tokens", "listTokens", "The named API tokens (not their secrets)", TokenList, _READ,
              query=TokenListing, role="admin", every_tenant=True),
    Operation("POST", "/tokens", "createToken", "Create a named API token; its secret is in this answer only "
              "(409: a live token holds the name)",
              CreatedToken, (400, 401, 403, 409, 422, 503), body=TokenRequest, role="admin", every_tenant=True),
    Operation("POST", "/tokens/{token_id}/revoke", "revokeToken", "Revoke a named API token: it is refused from "
              "now on", Token, (400, 401, 403, 404, 422, 503), body=Revoke, role="admin", every_tenant=True),
    *SCHEDULE_OPERATIONS,
    Operation("GET", "/healthz", "health", "The gateway answers", Health, (), role=None),
)
RUN_ACTIONS: dict[str, Operation] = {op.path.rsplit("/", 1)[1]: op for op in OPERATIONS
                                     if op.path.startswith("/runs/{run_id}/") and op.body is not None}
"""``POST /runs/{run_id}/<action>``: each action's operation (the body it takes, the role it needs)."""
BY_ROUTE: dict[tuple[str, str], Operation] = {(op.method, op.path): op for op in OPERATIONS}


# --- validation -----------------------------------------------------------------------------------

class Invalid(ValueError):
    """A request outside the contract: the status to answer, and every problem found."""

    def __init__(self, status: int, problems: list[str]) -> None:
        self.status = status
        self.problems = problems
        super().__init__("; ".join(problems))

    def body(self) -> dict[str, Any]:
        return {"error": str(self), **({"problems": self.problems} if len(self.problems) > 1 else {})}


MAX_DEPTH = 64
"""Arrays and objects a body may nest: far more than any operation's body needs, and few enough that
every walk over it (validation, storage as JSONB) stays shallow."""
_MISSING = frozenset({"missing", "string_too_short"})
"""Pydantic's error types that mean a required field is missing or empty (400, not 422)."""


def body(model: type[M], raw: bytes) -> M:
    """The request body as ``model``; ``Invalid`` naming every problem otherwise."""
    try:
        data = json.loads(raw, parse_constant=_no_constant) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise Invalid(400, [f"the body is not JSON: {e}"]) from None
    except RecursionError:
        raise Invalid(400, [f"the body is nested more than {MAX_DEPTH} deep"]) from None
    if not isinstance(data, dict):
        raise Invalid(400, [f"the body must be a JSON object, not {type(data).__name__}"])
    if _deeper_than(data, MAX_DEPTH):
        raise Invalid(400, [f"the body is nested more than {MAX_DEPTH} deep"])
    nul = _nul_in(data)
    if nul is not None:
        raise Invalid(422, [f"{nul} holds a NUL character (U+0000), which cannot be stored"])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        status = 400 if any(err["type"] in _MISSING for err in errors) else 422
        raise Invalid(status, [_problem(err) for err in errors]) from None


def query(model: type[M], params: Any) -> M:
    """The query string (a Starlette ``QueryParams``) as ``model``: lists for list fields, else the last value."""
    lists = {name for name, field in model.model_fields.items()
             if getattr(field.annotation, "__origin__", None) is list}
    data = {k: params.getlist(k) if k in lists else params[k] for k in params.keys()}
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise Invalid(400, [_problem(err) for err in e.errors(include_url=False)]) from None


def path_parameter(name: str, raw: str) -> Any:
    try:
        return PATH_PARAMETERS[name].validate_strings(raw)
    except ValidationError as e:
        raise Invalid(400, [f"{name}: {err['msg']}" for err in e.errors(include_url=False)]) from None


def _problem(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"])
    if err["loc"] == ("reason",) and err["type"] in _MISSING:
        return "a reason is required for every operator action"
    if err["type"] == "missing":
        return f"missing field {where!r}"
    if err["type"] == "literal_error":
        return f"{where} must be one of {err['ctx']['expected'].replace(' or ', ', ').replace(chr(39), '')}, " \
               f"not {err['input']!r}"
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    if err["type"] == "extra_forbidden":
        return f"unknown parameter {where!r}"
    return f"{where}: {err['msg']}"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _nul_in(value: Any, where: str = "the body") -> str | None:
    """Where ``value`` holds a NUL character, in a key or a string, or None."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return where
        found = _nul_in(item, f"{where}.{key}" if where != "the body" else str(key))
        if found is not None:
            return found
    return None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False
