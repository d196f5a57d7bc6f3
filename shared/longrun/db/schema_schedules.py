"""The tables of schedules (``domain.schedules``): each schedule, and what each of its due times did.
On the one MetaData (``schema_base``)."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from longrun.db.schema_base import metadata

schedules = Table(
    "schedules", metadata,
    Column("schedule_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    # The run.create payload each due time sends, less its idempotency key.
    Column("run", JSONB, nullable=False),
    Column("cron", Text, nullable=True),
    Column("every_seconds", Float, nullable=True),
    Column("anchor", DateTime(timezone=True), nullable=False),
    Column("overlap", Text, nullable=False),
    Column("catch_up_seconds", Float, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("next_due_at", DateTime(timezone=True), nullable=False),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="one_cadence"),
    CheckConstraint("overlap IN ('skip', 'buffer_one', 'cancel_previous', 'allow')", name="overlap_known"),
    CheckConstraint("catch_up_seconds >= 0", name="catch_up_not_negative"),
    Index("ix_schedules_due", "next_due_at", postgresql_where=text("NOT paused")),
    Index("ix_schedules_tenant_id", "tenant_id", "schedule_id"),
)
"""One row per schedule; the timer service fires those due (``next_due_at``, not paused) and moves
``next_due_at`` on in the transaction that creates their runs."""

schedule_fires = Table(
    "schedule_fires", metadata,
    Column("schedule_id", Text, ForeignKey("schedules.schedule_id", ondelete="CASCADE"), nullable=False),
    Column("due_at", DateTime(timezone=True), nullable=False),
    # created: a run was made (or found, made before); skipped: the overlap policy refused it;
    # missed: older than the catch-up window, not fired (``through``: the last due time missed).
    Column("outcome", Text, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Column("through", DateTime(timezone=True), nullable=True),
    Column("backfill", Boolean, nullable=False, server_default=text("false")),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("schedule_id", "due_at"),
    CheckConstraint("outcome IN ('created', 'skipped', 'missed')", name="outcome_known"),
)
"""What each due time of a schedule did, once per time: the record an operator reads (``GET
/schedules/{id}``) of the runs made, the times skipped by the overlap policy and those missed."""
