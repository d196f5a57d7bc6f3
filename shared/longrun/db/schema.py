"""Every table, defined once on one MetaData (SQLAlchemy Core).

Constraints are the last line of defence for the invariants a database can hold:
a lease is fully set or fully unset; a waiting run has a deadline and a wake
condition; an approval wait names what is approved, a question wait its question; an
idempotency key is used once;
event sequence numbers are unique per run. Status CHECKs are derived from the domain
enums, never retyped. Alembic migrations in ``migrations/`` must produce exactly this.
"""

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
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    and_,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSON, JSONB

from longrun.db.schema_base import created_at, metadata, one_of, sql_name, sql_names
from longrun.domain.action import ActionStatus, EffectKind
from longrun.domain import slots
from longrun.domain.breaker import BreakerState
from longrun.domain.run import AWAITING_ANSWER, HELD_FOR_RECONCILIATION, TERMINAL, RunStatus
from longrun.domain import reminders
from longrun.domain.snapshot import QUESTION_WAIT

CONSUMING_SERVICES = ("scheduler", "worker", "reconciler", "gateway")
"""Services that consume messages, each with its own inbox table (the timer reads the timers table)."""
TIMER_KINDS = ("retry_backoff", "wait_deadline", "business_deadline", "schedule_to_start",
               "start_to_close", "heartbeat", "sleep", *reminders.TIMER_KINDS, "child_ended")


runs = Table(
    "runs", metadata,
    Column("run_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("input_hash", Text, nullable=False),
    Column("workflow", Text, nullable=False),
    Column("workflow_version", Text, nullable=False),
    Column("prompt_version", Text, nullable=False),
    Column("model_policy_version", Text, nullable=False),
    Column("tool_schema_version", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("revision", BigInteger, nullable=False, server_default="0"),
    Column("last_seq", BigInteger, nullable=False, server_default="0"),
    Column("priority", SmallInteger, nullable=False, server_default="5"),
    Column("partition", SmallInteger, nullable=False),
    Column("lease_owner", Text),
    Column("lease_until", DateTime(timezone=True)),
    Column("fencing_token", BigInteger, nullable=False, server_default="0"),
    Column("wait_kind", Text),
    Column("wait_correlation_key", Text),
    Column("wait_deadline", DateTime(timezone=True)),
    Column("approval_id", Text),
    Column("approval_owner", Text),
    Column("approved_hash", Text),
    Column("budget", JSONB, nullable=False),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    Column("snapshot", JSONB, nullable=False),
    created_at(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("admitted_at", DateTime(timezone=True)),
    # "kind@version" while no worker that took its wakeup could run it: handed over to one that can.
    Column("awaiting_worker", Text),
    # A finished run whose events and actions were archived and pruned: the row stays as a tombstone
    # (its creating key and input hash answer a repeated create); ``archive`` names the artifact.
    Column("archived_at", DateTime(timezone=True)),
    Column("archive", Text),
    # Seconds the run may sit queued before a worker starts it (``RunTimeouts.schedule_to_start``), set
    # at creation; NULL: no limit, and the take and the timers' bulk wakes pay nothing for it.
    Column("schedule_to_start", Float),
    # The W3C traceparent of the run's root span (``longrun.otel``): every span of the run is its child.
    Column("trace_root", Text),
    # The run's concurrency key (``authoring.ConcurrencyKey``, within its tenant) and the most runs that
    # may hold it at once, set at creation; NULL: no key, and admission reads nothing more for the run.
    Column("concurrency_key", Text),
    Column("concurrency_limit", SmallInteger),
    # When the run took its key (its first admission); it holds it until it ends, parked or not.
    Column("concurrency_held_at", DateTime(timezone=True)),
    CheckConstraint("(concurrency_key IS NULL) = (concurrency_limit IS NULL) AND concurrency_limit > 0 "
                    "AND (concurrency_held_at IS NULL OR concurrency_key IS NOT NULL)", name="concurrency_key_whole"),
    CheckConstraint("(archived_at IS NULL) = (archive IS NULL)", name="archive_whole"),
    UniqueConstraint("tenant_id", "idempotency_key"),
    CheckConstraint(one_of("status", RunStatus), name="status"),
    CheckConstraint("revision >= 0 AND last_seq >= 0 AND fencing_token >= 0", name="counters"),
    # A half-set lease would be invisible to both takeover and renewal.
    CheckConstraint("(lease_owner IS NULL) = (lease_until IS NULL)", name="lease_whole"),
    # A waiting run that nobody can wake, or that waits forever, is a lost run.
    CheckConstraint(f"status NOT IN ({sql_names(sorted(AWAITING_ANSWER))}) "
                    "OR wait_deadline IS NOT NULL", name="wait_has_deadline"),
    CheckConstraint(f"status <> {sql_name(RunStatus.WAITING_EVENT)} OR wait_correlation_key IS NOT NULL "
                    "OR wait_kind IS NOT DISTINCT FROM 'timer'", name="wait_has_wake_condition"),
    CheckConstraint(f"status <> {sql_name(RunStatus.WAITING_USER)} OR (approval_id IS NOT NULL "
                    "AND approval_owner IS NOT NULL AND approved_hash IS NOT NULL) "
                    f"OR (wait_kind = {sql_name(QUESTION_WAIT)} AND (snapshot #>> '{{wait,question_id}}') IS NOT NULL)",
                    name="user_wait_named"),
)
# Operator search: tenant + status.
Index("ix_runs_tenant_status", runs.c.tenant_id, runs.c.status)
# Webhook matching by correlation key.
Index("ix_runs_wait_correlation_key", runs.c.wait_correlation_key,
      postgresql_where=runs.c.wait_correlation_key.isnot(None))
# Reconciler: leases that may have expired.
Index("ix_runs_lease_until", runs.c.lease_until, postgresql_where=runs.c.lease_owner.isnot(None))
# Workers' hand-over sweep: runs waiting for a worker that can run them.
Index("ix_runs_awaiting_worker", runs.c.awaiting_worker, postgresql_where=runs.c.awaiting_worker.isnot(None))
HELD = f"status IN ({sql_names(sorted(HELD_FOR_RECONCILIATION))})"
"""As SQL; the reconciler's query uses exactly this text, so the planner matches the index below."""
# Reconciler, every round: the held runs, a handful, among however many runs wait or are kept.
# Keyed on status alone, already indexed, so no update that was HOT stops being one.
Index("ix_runs_held", runs.c.status, postgresql_where=text(HELD))
OPEN_RUN = f"status NOT IN ({sql_names(sorted(TERMINAL))})"
"""A run that has not finished, as SQL."""
HOLDS_SLOT = f"admitted_at IS NOT NULL AND {OPEN_RUN}"
"""An admitted run that has not finished: it holds one of its tenant's slots. Queries counting
them use exactly this text, so the planner matches it with the predicate of the index below."""
# Admission counts a tenant's runs holding a slot on every create, admission and finished run:
# neither its finished runs (most of the table in time) nor its queue are read.
Index("ix_runs_holding_slots", runs.c.tenant_id, postgresql_where=text(HOLDS_SLOT))
QUEUED_STATUS = slots.QUEUED_STATUS
"""The status of a run waiting for a slot (while not admitted; ``domain.slots.queued``)."""
QUEUED = f"admitted_at IS NULL AND status = {sql_name(QUEUED_STATUS)}"
"""A run waiting for a slot. Not every unadmitted run: one cancelled or terminated while queued
is never admitted, and must not stay in the queue's index for admission to skip every time."""
# Scheduler admission: queued runs by tenant and priority.
Index("ix_runs_queued", runs.c.tenant_id, runs.c.priority, runs.c.created_at, postgresql_where=text(QUEUED))
HOLDS_KEY = f"concurrency_held_at IS NOT NULL AND {OPEN_RUN}"
"""A run holding its concurrency key: taken at its first admission, held until it ends (also while it
waits having given its slot back: not read from ``admitted_at``)."""
# Admission counts a key's holders for each queued run with a key; runs without one are never in it.
Index("ix_runs_holding_keys", runs.c.tenant_id, runs.c.concurrency_key, postgresql_where=text(HOLDS_KEY))
KEYED_OPEN = f"concurrency_key IS NOT NULL AND {OPEN_RUN}"
"""An unfinished run with a concurrency key, holding it or not."""
# A create whose key refuses or cancels reads the key's open runs, oldest first.
Index("ix_runs_keyed_open", runs.c.tenant_id, runs.c.concurrency_key, runs.c.created_at,
      postgresql_where=text(KEYED_OPEN))
TO_ARCHIVE = f"status IN ({sql_names(sorted(TERMINAL))}) AND archived_at IS NULL"
"""A finished run whose events and actions are still in their tables."""
# Retention: finished runs not archived yet, oldest first. Keyed on columns a run's writes never
# change, so the runs' updates stay as cheap as before; an open run is not in it.
Index("ix_runs_to_archive", runs.c.created_at, runs.c.run_id, postgresql_where=text(TO_ARCHIVE))

# Labels as rows, written once with their run: searchable by key and value through one index,
# which the run's own updates never touch.
run_labels = Table(
    "run_labels", metadata,
    Column("run_id", Text, ForeignKey("runs.run_id"), nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("value", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "key"),
)
Index("ix_run_labels_tenant_key_value", run_labels.c.tenant_id, run_labels.c.key, run_labels.c.value)

run_events = Table(
    "run_events", metadata,
    Column("run_id", Text, ForeignKey("runs.run_id"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("applied", Boolean, nullable=False, server_default=text("true")),
    Column("fencing_token", BigInteger),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("run_id", "seq"),
    CheckConstraint("seq >= 1", name="seq_positive"),
    # Unique through the primary key: no index of its own to pay on every event.
    CheckConstraint("event_id = run_id || ':' || seq", name="event_id_is_run_seq"),
)

actions = Table(
    "actions", metadata,
    Column("action_id", Text, primary_key=True),
    Column("run_id", Text, ForeignKey("runs.run_id"), nullable=False),
    Column("logical_action", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("tool_version", Text, nullable=False),
    Column("effect_kind", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False, unique=True),
    Column("request_hash", Text, nullable=False),
    Column("request", JSONB, nullable=False),
    Column("status", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("external_id", Text),
    Column("receipt", JSONB),
    Column("receipt_ref", Text),
    Column("last_error", Text),
    Column("fencing_token", BigInteger, nullable=False),
    # What a long call last reported of its progress (its heartbeats' details), and when.
    Column("progress", JSONB),
    Column("heartbeat_at", DateTime(timezone=True)),
    created_at(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("run_id", "logical_action"),
    CheckConstraint(one_of("status", ActionStatus), name="status"),
    CheckConstraint(one_of("effect_kind", EffectKind), name="effect_kind"),
)
# Reconciler: actions whose outcome is unknown.
Index("ix_actions_unresolved", actions.c.status, actions.c.updated_at,
      postgresql_where=actions.c.status.in_([ActionStatus.UNKNOWN.value, ActionStatus.RECONCILING.value]))

timers = Table(
    "timers", metadata,
    Column("timer_key", Text, primary_key=True),
    Column("run_id", Text, ForeignKey("runs.run_id"), nullable=False),
    Column("kind", Text, nullable=False),
    Column("wake_at", DateTime(timezone=True), nullable=False),
    Column("fired_at", DateTime(timezone=True)),
    # Set when the wait or run the timer was for ended another way: a cancelled timer never fires.
    Column("cancelled_at", DateTime(timezone=True)),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    created_at(),
    CheckConstraint(one_of("kind", TIMER_KINDS), name="kind"),
)
_OPEN_TIMER = and_(timers.c.fired_at.is_(None), timers.c.cancelled_at.is_(None))
# Timer service: the next due timers neither fired nor cancelled.
Index("ix_timers_due_open", timers.c.wake_at, postgresql_where=_OPEN_TIMER)
# Closure: a run's open timers, cancelled when its wait or the run ends another way.
Index("ix_timers_open_by_run", timers.c.run_id, postgresql_where=_OPEN_TIMER)

# Keyed by tenant and hash: identical bytes of two tenants are two objects (per-tenant prefixes);
# the empty tenant id is the runtime's own (archives of finished runs).
artifacts = Table(
    "artifacts", metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("content_hash", Text, primary_key=True),
    Column("size_bytes", BigInteger, nullable=False),
    Column("media_type", Text, nullable=False),
    Column("location", Text, nullable=False),
    Column("run_id", Text, ForeignKey("runs.run_id")),
    created_at(),
    CheckConstraint("content_hash ~ '^[0-9a-f]{64}$'", name="sha256"),
)

# An upload in flight: written before the bytes, deleted when they are registered. A row older than
# the orphan grace period is an upload whose transaction never committed: the sweep deletes its object.
artifact_uploads = Table(
    "artifact_uploads", metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("content_hash", Text, primary_key=True),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("content_hash ~ '^[0-9a-f]{64}$'", name="sha256"),
)
# The orphan sweep: uploads older than the grace period, oldest first.
Index("ix_artifact_uploads_started_at", artifact_uploads.c.started_at)

outbox = Table(
    "outbox", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    # The envelope's id; consumers deduplicate by it, rows are identified by ``id``.
    Column("event_id", Text, nullable=False),
    Column("aggregate_type", Text, nullable=False),
    Column("aggregate_id", Text, nullable=False),
    Column("partition", SmallInteger, nullable=False),
    Column("exchange", Text, nullable=False),
    Column("routing_key", Text, nullable=False),
    Column("type", Text, nullable=False),
    # The envelope as the JSON text it was written as: only ever read whole (migration 0009).
    Column("payload", JSON, nullable=False),
    Column("traceparent", Text),
    created_at(),
    Column("published_at", DateTime(timezone=True)),
    # Written by a lease holder that publishes the row itself right after its commit: until then the
    # relay leaves it, and every later row of its partition, to that writer (``longrun.bus.eager``).
    Column("eager_until", DateTime(timezone=True)),
)
# Relay: unpublished rows of one partition in commit-independent id order (no high-water mark).
Index("ix_outbox_unpublished", outbox.c.partition, outbox.c.id,
      postgresql_where=outbox.c.published_at.is_(None))


def _inbox(service: str) -> Table:
    return Table(
        f"inbox_{service}", metadata,
        Column("message_id", Text, primary_key=True),
        Column("message_type", Text, nullable=False),
        Column("run_id", Text),
        Column("outcome", JSONB, nullable=False),
        Column("handled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )


inboxes: dict[str, Table] = {service: _inbox(service) for service in CONSUMING_SERVICES}

delivery_failures = Table(
    "delivery_failures", metadata,
    Column("service", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("last_error", Text, nullable=False),
    Column("first_failure_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_failure_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("service", "message_id"),
)

quarantine = Table(
    "quarantine", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("owner", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("message_id", Text),
    Column("message_type", Text),
    Column("schema_version", Integer),
    Column("error_code", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("headers", JSONB, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("first_failure_at", DateTime(timezone=True), nullable=False),
    Column("last_failure_at", DateTime(timezone=True), nullable=False),
    Column("quarantined_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("replayed_at", DateTime(timezone=True)),
    Column("replayed_by", Text),
)

partition_leases = Table(
    "partition_leases", metadata,
    Column("service", Text, nullable=False),
    Column("partition", SmallInteger, nullable=False),
    Column("owner", Text),
    Column("lease_until", DateTime(timezone=True)),
    Column("fencing_token", BigInteger, nullable=False, server_default="0"),
    PrimaryKeyConstraint("service", "partition"),
    CheckConstraint("(owner IS NULL) = (lease_until IS NULL)", name="lease_whole"),
)

service_members = Table(
    "service_members", metadata,
    Column("service", Text, nullable=False),
    Column("instance_id", Text, nullable=False),
    Column("alive_until", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # What the member can run: its run kinds with every pinned version (``Registry.pins``).
    Column("advertised", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    # Stopping: still a member (what it holds stays its own while it finishes it), given no partitions.
    Column("stopping", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("service", "instance_id"),
)

webhook_events = Table(
    "webhook_events", metadata,
    Column("provider", Text, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("correlation_key", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    # What the provider made of it, kept with it: whoever matches it later need not know the provider.
    Column("fact_key", Text),
    Column("fact", JSONB),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("matched_run_id", Text),
    Column("matched_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("provider", "event_id"),
)
# A wait that starts after its webhook arrived looks here for it.
Index("ix_webhook_events_unmatched", webhook_events.c.correlation_key,
      postgresql_where=webhook_events.c.matched_run_id.is_(None))

webhook_deliveries = Table(
    "webhook_deliveries", metadata,
    # The id of every delivery of a provider that signs the body alone, kept for as long as its
    # signatures are accepted: a captured delivery sent again after the inbox forgot it is recognised.
    Column("provider", Text, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("provider", "event_id"),
)

tool_health = Table(
    "tool_health", metadata,
    # One circuit breaker per far side (``domain.breaker``), shared by every worker; rows exist only
    # for far sides that have answered unavailable at least once.
    Column("far_side", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("window_start", DateTime(timezone=True)),
    Column("reopen_at", DateTime(timezone=True)),
    Column("probe_by", Text),
    Column("probe_until", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(one_of("state", BreakerState), name="state"),
    CheckConstraint("state = 'CLOSED' OR reopen_at IS NOT NULL OR probe_until IS NOT NULL", name="open_until"),
)

rate_limit_buckets = Table(
    "rate_limit_buckets", metadata,
    # One token bucket per rate limit (per tenant for a per-tenant limit: ``domain.rate_limit``),
    # shared by every worker and changed only under its row lock; a row exists once a call used it.
    Column("bucket", Text, primary_key=True),
    Column("level", Float, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    # The limit as last charged: what the gauges refill the level with to show it now.
    Column("rate", Float, nullable=False),
    Column("burst", Float, nullable=False),
    Column("hold_until", DateTime(timezone=True)),
)

cleanups = Table(
    "cleanups", metadata,
    # A finished run's cleanup (``domain.cleanup``), written with the move that finished it; the
    # reconciler runs it once due, holding it by moving ``due_at`` past its calls' time limits.
    Column("run_id", Text, ForeignKey("runs.run_id"), primary_key=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("due_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_error", Text),
    # Whether its ``alert.cleanup_failed`` was raised (resolved when the cleanup is done).
    Column("alerted", Boolean, nullable=False, server_default=text("false")),
    Column("done_at", DateTime(timezone=True)),
    created_at(),
)
# Reconciler: the cleanups due, soonest first.
Index("ix_cleanups_due", cleanups.c.due_at, postgresql_where=cleanups.c.done_at.is_(None))

# The tables of tenants and operators live in their own module, on this MetaData: imported here so
# that ``metadata`` (what the migrations must produce) holds every table whichever module is read.
from longrun.db import schema_tenants  # noqa: E402,F401  (it imports only ``schema_base``)
from longrun.db import schema_schedules  # noqa: E402,F401  (it imports only ``schema_base``)
from longrun.db import schema_children  # noqa: E402,F401  (it imports only ``schema_base``)
