"""The operator API's contract, in one place: a model for each request body, query and response, the
errors each route answers, and the route table the gateway validates requests by and
``services.gateway.openapi`` renders ``schemas/openapi.json`` from.

Requests are checked here before anything is read or written: a body that is not a JSON object or
lacks a required field is refused with 400, one whose fields have the wrong type or a value not
allowed with 422; a query or path parameter outside its schema, or one the operation does not name,
with 400. Text cannot hold the NUL
character (U+0000), which PostgreSQL cannot store; such a request is refused the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from longrun_client.model import TENANT_PATTERN
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, RootModel, TypeAdapter, ValidationError

from longrun.db import pages
from longrun.domain import ActionStatus, RunStatus
from longrun.identity import ROLES

Text = Annotated[str, Field(pattern=r"^[^\x00]*$")]
Reason = Annotated[str, Field(min_length=1, pattern=r"^[^\x00]*$",
                              description="Why, for the audit log; required for every operator action.")]
RUN_STATUS = Literal[tuple(s.value for s in RunStatus)]  # type: ignore[valid-type]
Role = Literal[ROLES]  # type: ignore[valid-type]
TOKEN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,199}$"
"""A token's name is who acts with it: letters, digits, ``.``, ``_``, ``@``, ``-`` (no ``:``, which
marks an approval's owner as a role or group)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Query(Strict):
    """Query parameters: one not named is refused (a misspelt filter would otherwise widen a search)."""


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


class TokenRequest(Strict):
    """A named API token: ``name`` is who acts with it, in the audit log and for approvals bound to a
    subject; ``tenants`` null: every tenant."""

    name: Annotated[str, Field(pattern=TOKEN_NAME)]
    roles: Annotated[list[Role], Field(min_length=1)]
    tenants: list[Annotated[str, Field(pattern=TENANT_PATTERN)]] | None
    reason: Reason


class Revoke(Strict):
    reason: Reason


# --- queries --------------------------------------------------------------------------------------

Limit = Annotated[int, Field(ge=1, le=pages.MAX_LIMIT,
                              description=f"At most this many (default {pages.DEFAULT_LIMIT})."),
                  BeforeValidator(pages.limit)]
Cursor = Annotated[Text, Field(description="The ``next_cursor`` of the page before.")]
DURATION = "seconds, or a number with s, m, h or d: 90s, 15m, 12h, 30d"


class RunSearch(Query):
    """Every filter given must match; newest first."""

    tenant_id: Annotated[str, Field(pattern=TENANT_PATTERN)] | None = None
    status: RUN_STATUS | None = None
    wait_kind: Text | None = None
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
}


# --- responses ------------------------------------------------------------------------------------

class Error(Strict):
    error: str
    problems: list[str] | None = Field(None, description="Every violation, where there are several.")


class ActionResult(Strict):
    run_id: str
    status: RUN_STATUS
    revision: int


class Answered(ActionResult):
    repeated: bool = Field(description="The same answer was given before; nothing changed.")


class SettledAction(Strict):
    logical_action: str
    status: Literal[ActionStatus.CONFIRMED.value, ActionStatus.RETRYABLE.value]  # type: ignore[valid-type]


class Resolved(ActionResult):
    action: SettledAction


class Versions(Strict):
    workflow: str
    prompt: str
    model_policy: str
    tool_schemas: str


class Migrated(ActionResult):
    versions: Versions


class Lease(Strict):
    owner: str
    fencing_token: int
    until: datetime | None


class NextTimer(Strict):
    kind: str
    wake_at: datetime


class Archived(Strict):
    at: datetime
    archive: str
    location: str
    media_type: str


class RunEvent(BaseModel):
    """One event of the run's history (``type`` names which; its other fields follow from it)."""

    type: str
    seq: int
    at: float


class CallView(Strict):
    """One of the run's calls as its ledger row holds it."""

    logical_action: str
    tool: str
    effect_kind: str
    status: str
    attempts: int
    external_id: str | None
    progress: dict[str, Any] | None = Field(description="What the call's heartbeats last reported.")
    heartbeat_at: datetime | None


class AttachedArtifact(Strict):
    name: str
    content_hash: str
    size: int
    media_type: str


class Attached(ActionResult):
    artifact: AttachedArtifact


class RunView(Strict):
    snapshot: dict[str, Any] = Field(description="The run's state, as the runtime keeps it.")
    actions: list[CallView]
    lease: Lease | None
    next_timer: NextTimer | None
    allowed_operations: list[Literal["approve", "deny", "answer", "resolve", "retry-action", "pause", "cancel",
                                     "terminate", "resume"]] = Field(description="What an operator may do to the run now "
                                                                    "(POST /runs/{run_id}/<operation>).")
    waiting_for: str | None
    archived: Archived | None = Field(description="Where the history of an archived run went (its events here "
                                                  "are then pruned).")
    events: list[RunEvent]


class RunRow(Strict):
    run_id: str
    tenant_id: str
    status: RUN_STATUS
    workflow: str
    workflow_version: str
    wait_kind: str | None
    awaiting_worker: str | None
    idempotency_key: str
    created_at: datetime
    updated_at: datetime
    labels: dict[str, str]


class RunPage(Strict):
    runs: list[RunRow]
    next_cursor: str | None = Field(description="None on the last page.")


class AuditEntry(Strict):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    reason: str
    details: dict[str, Any]


class AuditPage(Strict):
    entries: list[AuditEntry]
    next_cursor: str | None


class VersionsInUse(Strict):
    kind: str
    versions: Versions
    open_runs: dict[str, int] = Field(description="Open runs by status.")
    oldest_wait: datetime | None
    waiting_for_a_worker: int
    served_by: list[str] = Field(description="The live workers that advertise these versions.")


class VersionsReport(RootModel[list[VersionsInUse]]):
    pass


class QuarantineEntry(Strict):
    id: int
    owner: str
    queue: str
    message_id: str | None
    message_type: str | None
    schema_version: int | None
    error_code: str
    reason: str
    headers: dict[str, Any]
    attempts: int
    first_failure_at: datetime
    last_failure_at: datetime
    quarantined_at: datetime
    replayed_at: datetime | None
    replayed_by: str | None
    body_preview: str


class QuarantineList(RootModel[list[QuarantineEntry]]):
    pass


class Replayed(Strict):
    id: int
    replayed_to: str = Field(description="exchange/routing key")
    message_id: str


class NotSent(Strict):
    """Past the replay window, and its effect is there already: marked replayed, not sent again."""

    id: int
    not_sent: str
    message_id: str


class ReplayResult(RootModel[Replayed | NotSent]):
    pass


class Policy(Strict):
    tenant_id: str
    version: int
    tools: list[str]
    resources: list[str]


class CeilingView(Strict):
    """How far the tenant's own admins may set its policy, and where each setting's ceiling comes from."""

    tenant_id: str
    version: int | None = Field(description="The ceiling's version; None: no ceiling is set.")
    tools: list[str]
    resources: list[str]
    origins: dict[str, str] = Field(description="Per setting: set by an admin of every tenant, the value in "
                                                "force (no ceiling is set) or the kinds' maximum (neither is).")


class Health(Strict):
    ok: Literal[True]


class Token(Strict):
    """A named token as kept (its secret is not)."""

    id: int
    name: str
    roles: list[str]
    tenants: list[str] | None = Field(description="None: every tenant.")
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenList(RootModel[list[Token]]):
    pass


class CreatedToken(Strict):
    token: Token
    secret: str = Field(description="The bearer token; shown this once, kept nowhere.")


class Me(Strict):
    """Who the bearer token names."""

    subject: str
    roles: list[str]
    tenants: list[str] | None = Field(description="None: every tenant.")
    groups: list[str]


# --- the route table ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Operation:
    method: Literal["GET", "POST", "PUT"]
    path: str
    name: str
    summary: str
    response: type[BaseModel] | None
    """None: the answer is bytes of the media type they were stored with."""
    errors: tuple[int, ...]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    role: Role | None = "viewer"
    """The least role the caller needs (``longrun.identity``); None: no bearer token is needed."""
    every_tenant: bool = False
    """Only a principal of every tenant may call it: what it shows or changes is not one tenant's."""
    raw_body: bool = False
    """The request's body is the bytes themselves, of the media type its Content-Type names."""


_READ = (400, 401, 403, 503)
_ACT = (400, 401, 403, 404, 409, 422, 503)


def _on_a_run(action: str, body: type[BaseModel], response: type[BaseModel], summary: str,
              role: Role = "operator") -> Operation:
    first, *rest = action.split("-")
    return Operation("POST", f"/runs/{{run_id}}/{action}", first + "".join(w.title() for w in rest) + "Run", summary,
                     response, _ACT, body, role=role)


OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/runs", "searchRuns", "Runs matching every filter given, newest first, a page at a time",
              RunPage, _READ, query=RunSearch),
    Operation("GET", "/runs/{run_id}", "showRun", "A run: its state, lease, next timer, the operations allowed "
              "now and its events", RunView, (400, 401, 403, 404, 503)),
    _on_a_run("approve", Decide, ActionResult, "Approve exactly the pending request with this hash "
              "(only a principal its owner names)", role="approver"),
    _on_a_run("deny", Decide, ActionResult, "Deny the pending request with this hash", role="approver"),
    _on_a_run("answer", Answer, Answered, "Answer the question the run asks", role="approver"),
    _on_a_run("resolve", Resolve, Resolved, "Settle an action in doubt with what was found on the far side"),
    _on_a_run("retry-action", RetryAction, Resolved, "Send an action that FAILED again under the same "
              "idempotency key (the run must not have ended)"),
    _on_a_run("pause", Steer, ActionResult, "Pause the run"),
    _on_a_run("resume", Steer, ActionResult, "Resume a paused run"),
    _on_a_run("cancel", Steer, ActionResult, "Cancel the run (its cleanup runs)"),
    _on_a_run("terminate", Steer, ActionResult, "End the run now, skipping cleanup"),
    _on_a_run("migrate", Migrate, Migrated, "Move the run to another workflow version of its kind"),
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
    Operation("GET", "/me", "whoAmI", "Who the bearer token names: subject, roles, tenants, groups", Me,
              (401, 503)),
    Operation("GET", "/tokens", "listTokens", "The named API tokens (not their secrets)", TokenList, _READ,
              query=TokenListing, role="admin", every_tenant=True),
    Operation("POST", "/tokens", "createToken", "Create a named API token; its secret is in this answer only",
              CreatedToken, (400, 401, 403, 422, 503), body=TokenRequest, role="admin", every_tenant=True),
    Operation("POST", "/tokens/{token_id}/revoke", "revokeToken", "Revoke a named API token: it is refused from "
              "now on", Token, (400, 401, 403, 404, 422, 503), body=Revoke, role="admin", every_tenant=True),
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


_MISSING = frozenset({"missing", "string_too_short"})
"""Pydantic's error types that mean a required field is missing or empty (400, not 422)."""


def body(model: type[M], raw: bytes) -> M:
    """The request body as ``model``; ``Invalid`` naming every problem otherwise."""
    try:
        data = json.loads(raw, parse_constant=_no_constant) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise Invalid(400, [f"the body is not JSON: {e}"]) from None
    if not isinstance(data, dict):
        raise Invalid(400, [f"the body must be a JSON object, not {type(data).__name__}"])
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
