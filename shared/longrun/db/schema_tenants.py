"""The tables of tenants and of the people who operate them: tenant policies, limits and ceilings,
their budgets' use per period, the permits of their bounded tool groups, the audit log, operators' named tokens and console sessions. On the one MetaData (``schema_base``)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from longrun.db.schema_base import metadata

tenant_policies = Table(
    "tenant_policies", metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("tools", JSONB, nullable=False),
    Column("resources", JSONB, nullable=False),
    Column("updated_by", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("version >= 1", name="version_positive"),
)
"""What each tenant lets its runs do (``domain.scope.TenantPolicy``): one row per tenant, its version
raised by every change, so an approval re-validated on resume sees whether the policy moved."""

tenant_ceilings = Table(
    "tenant_ceilings", metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("limits", JSONB, nullable=False),
    Column("updated_by", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("version >= 1", name="version_positive"),
)
"""How far each tenant's own admins may set its settings (``domain.ceiling``): one document per tenant
(``{"tools": [...], "resources": [...]}``), set by an admin of every tenant, its version raised by
every change."""

tenant_limits = Table(
    "tenant_limits", metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("run_slots", Integer, nullable=True),
    Column("token_budget", BigInteger, nullable=True),
    Column("cost_budget", Float, nullable=True),
    Column("tool_concurrency", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("updated_by", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("version >= 1", name="version_positive"),
    CheckConstraint("run_slots >= 0", name="run_slots_not_negative"),
    CheckConstraint("token_budget >= 0", name="token_budget_not_negative"),
    CheckConstraint("cost_budget >= 0", name="cost_budget_not_negative"),
)
"""Each tenant's limits (``domain.tenant_limits``): run slots, a model token and a cost budget per
period, concurrent calls per tool group. A null is the platform's default
(``LONGRUN_TENANT_SLOTS``, ``LONGRUN_TENANT_TOKEN_BUDGET``, ``LONGRUN_TENANT_COST_BUDGET``); a tenant
without a row has the defaults. Admission reads ``run_slots`` in the statements it already runs."""

tenant_budget_use = Table(
    "tenant_budget_use", metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("period_start", DateTime(timezone=True), nullable=False),
    Column("period_end", DateTime(timezone=True), nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("cost", Float, nullable=False),
    Column("spent", Boolean, nullable=False),
    CheckConstraint("period_end > period_start", name="period_ordered"),
)
"""What each tenant with a budget used in its current period: written by the statement that charges
a run's model call, only when the tenant has a budget; a charge in a later period starts it afresh.
``spent``: a budget was reached, judged at the charge (and again when an operator changes the
tenant's limits); admission admits none of the tenant's runs while it is spent and its period runs."""

tool_permits = Table(
    "tool_permits", metadata,
    Column("tenant_id", Text, nullable=False),
    Column("tool_group", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("holder", Text, nullable=False),
    Column("taken_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("tenant_id", "tool_group", "run_id", "holder"),
)
"""One row per tool call in flight of a tenant's bounded tool group (``domain.tool_permits``), taken
just before the call under the group's advisory lock and deleted once its outcome is recorded.
``holder``: the worker's instance id; its permits are free once its membership (``service_members``)
lapses, or once it no longer holds the run's lease."""

audit_log = Table(
    "audit_log", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("tenant_id", Text, nullable=True),
)
"""``tenant_id``: the tenant the entry concerns (a run's, a policy's), null when none or every
tenant's; a tenant's viewers see the entries of their tenants by it."""
# The reconciler checks for its own earlier alerts (action + target) on every pass.
Index("ix_audit_log_action_target", audit_log.c.action, audit_log.c.target)
# A tenant-scoped viewer's audit log, newest first.
Index("ix_audit_log_tenant", audit_log.c.tenant_id, audit_log.c.at, postgresql_where=text("tenant_id IS NOT NULL"))

operator_tokens = Table(
    "operator_tokens", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("secret_sha256", Text, nullable=False, unique=True),
    Column("roles", JSONB, nullable=False),
    Column("tenants", JSONB, nullable=True),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("permissions", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
)
"""Named API tokens of operators (``longrun.identity``): only the SHA-256 of each secret is kept, so
the table leaks no credential. ``name`` is who acts with the token (the audit log's actor);
``permissions`` are its grants beside its roles (``create_runs``);
``tenants`` NULL is every tenant; ``expires_at`` NULL: until revoked. A revoked or expired token
stays, for the audit trail (an expired one keeps its name until it is revoked)."""
# A live token's name belongs to one holder: approvals owned by a name are decided by its token alone.
Index("ux_operator_tokens_live_name", operator_tokens.c.name, unique=True,
      postgresql_where=text("revoked_at IS NULL"))

console_sessions = Table(
    "console_sessions", metadata,
    Column("id_sha256", Text, primary_key=True),
    Column("principal", JSONB, nullable=False),
    Column("token_id", BigInteger, ForeignKey("operator_tokens.id"), nullable=True),
    Column("bootstrap_sha256", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("token_id IS NULL OR bootstrap_sha256 IS NULL", name="one_credential"),
)
"""Signed-in web console sessions (``longrun.db.console_sessions``): the browser's cookie holds the
session's random id, the table only its SHA-256, and no bearer token is kept. ``principal`` is who
signed in (subject, roles, tenants, groups, credential); what signed them in is asked again on every
request: a named token (``token_id``) while it is live, a bootstrap token (``bootstrap_sha256``)
while it is configured, an OIDC access token (neither) while the issuer is the configured one, the
session ending no later than the token. Sign-out sets ``ended_at``; a row past ``expires_at`` goes
at a later sign-in."""
Index("ix_console_sessions_expires_at", console_sessions.c.expires_at)
