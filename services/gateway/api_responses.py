"""The operator API's answers: one model per response body, rendered into ``schemas/openapi.json``
by ``longrun.services.gateway.openapi`` and checked against what the gateway answers by the contract test."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, RootModel

from longrun.domain import ActionStatus
from longrun_client.payloads import RunAcceptedV2, RunRejectedV3
from longrun.services.gateway.api_types import RUN_STATUS, Strict


class Error(Strict):
    error: str
    problems: list[str] | None = Field(None, description="Every violation, where there are several.")


class CreateRefused(Error):
    """A create refused: ``code`` is the run.rejected code (none when the caller or the request's form is
    refused, before the create is read); ``rejected`` the run.rejected published for it, when one was."""

    code: str | None = None
    rejected: RunRejectedV3 | None = None


class RunAccepted(RunAcceptedV2):
    """The run a create made (201) or a repeat of it had made (200, ``repeated``): the run.accepted payload."""


class ActionResult(Strict):
    run_id: str
    status: RUN_STATUS
    revision: int


class Answered(ActionResult):
    repeated: bool = Field(description="The same answer was given before; nothing changed.")


class Signalled(ActionResult):
    signal_id: str
    outcome: Literal["woke", "recorded", "late", "duplicate"] = Field(description=(
        "woke: it ended the run's wait for it; recorded: the run was open and not waiting for it, its decide "
        "reads it later; late: the run had ended, so it is kept in the history and not applied; duplicate: a "
        "signal with this id was recorded before, and nothing changed."))


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


class ParentView(Strict):
    run_id: str
    name: str = Field(description="The run's name among its parent's children.")


class ChildView(Strict):
    name: str
    run_id: str
    status: RUN_STATUS


class RunView(Strict):
    snapshot: dict[str, Any] = Field(description="The run's state, as the runtime keeps it.")
    actions: list[CallView]
    lease: Lease | None
    next_timer: NextTimer | None
    allowed_operations: list[Literal["approve", "deny", "answer", "resolve", "retry-action", "retry", "pause",
                                     "cancel", "terminate", "resume"]] = Field(description="What an operator may do to the run now "
                                                                    "(POST /runs/{run_id}/<operation>).")
    waiting_for: str | None
    archived: Archived | None = Field(description="Where the history of an archived run went (its events here "
                                                  "are then pruned).")
    parent: ParentView | None = Field(description="The run that started this one as its child.")
    children: list[ChildView] = Field(description="The child runs this one started, by name.")
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
    waiting_for: str | None = Field(description="concurrency_key:<key> while the run waits for its concurrency key.")


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


class LimitsCeiling(Strict):
    """How far the tenant's own admins may set its limits (null: unbounded), and where each comes from."""

    version: int | None = Field(description="The ceiling's version; None: no ceiling is set.")
    run_slots: int | None
    token_budget: int | None
    cost_budget: float | None
    tool_concurrency: dict[str, int] | None
    origins: dict[str, str] = Field(description="Per setting: set by an admin of every tenant, or the value in "
                                                "force (no ceiling is set).")


class LimitsInForce(Strict):
    run_slots: int
    token_budget: int | None
    cost_budget: float | None
    tool_concurrency: dict[str, int]


class BudgetUse(Strict):
    """The tenant's use of its budgets in the period now running."""

    period_start: str
    period_end: str
    tokens: int
    cost: float
    spent: bool = Field(description="A budget was reached: none of its runs is admitted until the period "
                                    "ends or a budget is raised.")


class LimitsView(Strict):
    """A tenant's limits as set (null: the platform's default), as in force, and their ceiling."""

    tenant_id: str
    version: int | None = Field(description="The limits' version; None: the tenant never set any.")
    run_slots: int | None
    token_budget: int | None
    cost_budget: float | None
    tool_concurrency: dict[str, int]
    in_force: LimitsInForce
    ceiling: LimitsCeiling
    use: BudgetUse | None = Field(description="None: nothing charged in the period now running.")


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
    expires_at: datetime | None = Field(description="Refused from then on; None: until revoked.")
    permissions: list[str] = Field(description="Grants beside the roles (create_runs).")


class TokenList(RootModel[list[Token]]):
    pass


class CreatedToken(Strict):
    token: Token
    secret: str = Field(description="The bearer token; shown this once, kept nowhere.")


class Me(Strict):
    """Who the bearer token names."""

    subject: str
    roles: list[str]
    permissions: list[str] = Field(description="Grants beside the roles (create_runs).")
    tenants: list[str] | None = Field(description="None: every tenant.")
    groups: list[str]
