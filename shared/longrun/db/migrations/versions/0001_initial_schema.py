"""Initial schema: runs, run_events, actions, timers, artifacts, outbox, inboxes, quarantine, leases, audit.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('actor', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('target', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('details', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    op.create_table('delivery_failures',
    sa.Column('service', sa.Text(), nullable=False),
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=False),
    sa.Column('first_failure_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_failure_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('service', 'message_id', name=op.f('pk_delivery_failures'))
    )
    op.create_table('inbox_gateway',
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('handled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('message_id', name=op.f('pk_inbox_gateway'))
    )
    op.create_table('inbox_reconciler',
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('handled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('message_id', name=op.f('pk_inbox_reconciler'))
    )
    op.create_table('inbox_scheduler',
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('handled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('message_id', name=op.f('pk_inbox_scheduler'))
    )
    op.create_table('inbox_timer',
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('handled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('message_id', name=op.f('pk_inbox_timer'))
    )
    op.create_table('inbox_worker',
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('handled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('message_id', name=op.f('pk_inbox_worker'))
    )
    op.create_table('outbox',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('event_id', sa.Text(), nullable=False),
    sa.Column('aggregate_type', sa.Text(), nullable=False),
    sa.Column('aggregate_id', sa.Text(), nullable=False),
    sa.Column('partition', sa.SmallInteger(), nullable=False),
    sa.Column('exchange', sa.Text(), nullable=False),
    sa.Column('routing_key', sa.Text(), nullable=False),
    sa.Column('type', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('traceparent', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('published_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_outbox')),
    sa.UniqueConstraint('event_id', name=op.f('uq_outbox_event_id'))
    )
    op.create_index('ix_outbox_unpublished', 'outbox', ['partition', 'id'], unique=False, postgresql_where=sa.text('published_at IS NULL'))
    op.create_table('partition_leases',
    sa.Column('service', sa.Text(), nullable=False),
    sa.Column('partition', sa.SmallInteger(), nullable=False),
    sa.Column('owner', sa.Text(), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('fencing_token', sa.BigInteger(), server_default='0', nullable=False),
    sa.CheckConstraint('(owner IS NULL) = (lease_until IS NULL)', name=op.f('ck_partition_leases_lease_whole')),
    sa.PrimaryKeyConstraint('service', 'partition', name=op.f('pk_partition_leases'))
    )
    op.create_table('quarantine',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('owner', sa.Text(), nullable=False),
    sa.Column('queue', sa.Text(), nullable=False),
    sa.Column('message_id', sa.Text(), nullable=True),
    sa.Column('message_type', sa.Text(), nullable=True),
    sa.Column('schema_version', sa.Integer(), nullable=True),
    sa.Column('error_code', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('headers', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('first_failure_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_failure_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('quarantined_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('replayed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('replayed_by', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quarantine'))
    )
    op.create_table('runs',
    sa.Column('run_id', sa.Text(), nullable=False),
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('idempotency_key', sa.Text(), nullable=False),
    sa.Column('input_hash', sa.Text(), nullable=False),
    sa.Column('workflow', sa.Text(), nullable=False),
    sa.Column('workflow_version', sa.Text(), nullable=False),
    sa.Column('prompt_version', sa.Text(), nullable=False),
    sa.Column('model_policy_version', sa.Text(), nullable=False),
    sa.Column('tool_schema_version', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('revision', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('last_seq', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('priority', sa.SmallInteger(), server_default='5', nullable=False),
    sa.Column('partition', sa.SmallInteger(), nullable=False),
    sa.Column('lease_owner', sa.Text(), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('fencing_token', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('wait_kind', sa.Text(), nullable=True),
    sa.Column('wait_correlation_key', sa.Text(), nullable=True),
    sa.Column('wait_deadline', sa.DateTime(timezone=True), nullable=True),
    sa.Column('approval_id', sa.Text(), nullable=True),
    sa.Column('approval_owner', sa.Text(), nullable=True),
    sa.Column('approved_hash', sa.Text(), nullable=True),
    sa.Column('budget', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('snapshot', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status <> 'WAITING_EVENT' OR wait_correlation_key IS NOT NULL OR wait_kind IS NOT DISTINCT FROM 'timer'", name=op.f('ck_runs_wait_has_wake_condition')),
    sa.CheckConstraint("status <> 'WAITING_USER' OR (approval_id IS NOT NULL AND approval_owner IS NOT NULL AND approved_hash IS NOT NULL)", name=op.f('ck_runs_approval_named')),
    sa.CheckConstraint("status IN ('READY', 'RUNNING', 'WAITING_EVENT', 'WAITING_USER', 'RETRY_SCHEDULED', 'ACTION_UNKNOWN', 'CANCELLING', 'PAUSED', 'NEEDS_ATTENTION', 'COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT', 'BUDGET_EXHAUSTED')", name=op.f('ck_runs_status')),
    sa.CheckConstraint("status NOT IN ('WAITING_EVENT', 'WAITING_USER') OR wait_deadline IS NOT NULL", name=op.f('ck_runs_wait_has_deadline')),
    sa.CheckConstraint('(lease_owner IS NULL) = (lease_until IS NULL)', name=op.f('ck_runs_lease_whole')),
    sa.CheckConstraint('revision >= 0 AND last_seq >= 0 AND fencing_token >= 0', name=op.f('ck_runs_counters')),
    sa.PrimaryKeyConstraint('run_id', name=op.f('pk_runs')),
    sa.UniqueConstraint('tenant_id', 'idempotency_key', name=op.f('uq_runs_tenant_id_idempotency_key'))
    )
    op.create_index('ix_runs_lease_until', 'runs', ['lease_until'], unique=False, postgresql_where=sa.text('lease_owner IS NOT NULL'))
    op.create_index('ix_runs_ready_queue', 'runs', ['tenant_id', 'priority', 'created_at'], unique=False, postgresql_where=sa.text('admitted_at IS NULL'))
    op.create_index('ix_runs_tenant_status', 'runs', ['tenant_id', 'status'], unique=False)
    op.create_index('ix_runs_wait_correlation_key', 'runs', ['wait_correlation_key'], unique=False, postgresql_where=sa.text('wait_correlation_key IS NOT NULL'))
    op.create_table('service_members',
    sa.Column('service', sa.Text(), nullable=False),
    sa.Column('instance_id', sa.Text(), nullable=False),
    sa.Column('alive_until', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('service', 'instance_id', name=op.f('pk_service_members'))
    )
    op.create_table('actions',
    sa.Column('action_id', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=False),
    sa.Column('logical_action', sa.Text(), nullable=False),
    sa.Column('tool', sa.Text(), nullable=False),
    sa.Column('tool_version', sa.Text(), nullable=False),
    sa.Column('effect_kind', sa.Text(), nullable=False),
    sa.Column('idempotency_key', sa.Text(), nullable=False),
    sa.Column('request_hash', sa.Text(), nullable=False),
    sa.Column('request', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('external_id', sa.Text(), nullable=True),
    sa.Column('receipt', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('receipt_ref', sa.Text(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('fencing_token', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("effect_kind IN ('pure', 'read', 'idempotent_write', 'non_idempotent_write')", name=op.f('ck_actions_effect_kind')),
    sa.CheckConstraint("status IN ('PREPARED', 'SUBMITTED', 'CONFIRMED', 'FAILED', 'UNKNOWN', 'RECONCILING', 'RETRYABLE', 'NEEDS_ATTENTION', 'COMPENSATING', 'COMPENSATED')", name=op.f('ck_actions_status')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.run_id'], name=op.f('fk_actions_run_id_runs')),
    sa.PrimaryKeyConstraint('action_id', name=op.f('pk_actions')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_actions_idempotency_key')),
    sa.UniqueConstraint('run_id', 'logical_action', name=op.f('uq_actions_run_id_logical_action'))
    )
    op.create_index('ix_actions_unresolved', 'actions', ['status', 'updated_at'], unique=False, postgresql_where=sa.text("status IN ('UNKNOWN', 'RECONCILING')"))
    op.create_table('artifacts',
    sa.Column('content_hash', sa.Text(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('media_type', sa.Text(), nullable=False),
    sa.Column('location', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("content_hash ~ '^[0-9a-f]{64}$'", name=op.f('ck_artifacts_sha256')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.run_id'], name=op.f('fk_artifacts_run_id_runs')),
    sa.PrimaryKeyConstraint('content_hash', name=op.f('pk_artifacts'))
    )
    op.create_table('run_events',
    sa.Column('run_id', sa.Text(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('event_id', sa.Text(), nullable=False),
    sa.Column('type', sa.Text(), nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('applied', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    sa.Column('fencing_token', sa.BigInteger(), nullable=True),
    sa.Column('occurred_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('seq >= 1', name=op.f('ck_run_events_seq_positive')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.run_id'], name=op.f('fk_run_events_run_id_runs')),
    sa.PrimaryKeyConstraint('run_id', 'seq', name=op.f('pk_run_events')),
    sa.UniqueConstraint('event_id', name=op.f('uq_run_events_event_id'))
    )
    op.create_table('timers',
    sa.Column('timer_key', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('wake_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('fired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('retry_backoff', 'wait_deadline', 'business_deadline', 'schedule_to_start', 'start_to_close', 'heartbeat', 'sleep')", name=op.f('ck_timers_kind')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.run_id'], name=op.f('fk_timers_run_id_runs')),
    sa.PrimaryKeyConstraint('timer_key', name=op.f('pk_timers'))
    )
    op.create_index('ix_timers_due', 'timers', ['wake_at'], unique=False, postgresql_where=sa.text('fired_at IS NULL'))
    # run_events is append-only: corrections are new events, never edits.
    op.execute("""
        CREATE FUNCTION run_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'run_events is append-only: % refused', TG_OP;
        END $$;
    """)
    op.execute("""
        CREATE TRIGGER run_events_append_only BEFORE UPDATE OR DELETE ON run_events
        FOR EACH ROW EXECUTE FUNCTION run_events_append_only();
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER run_events_append_only ON run_events")
    op.execute("DROP FUNCTION run_events_append_only()")
    op.drop_index('ix_timers_due', table_name='timers', postgresql_where=sa.text('fired_at IS NULL'))
    op.drop_table('timers')
    op.drop_table('run_events')
    op.drop_table('artifacts')
    op.drop_index('ix_actions_unresolved', table_name='actions', postgresql_where=sa.text("status IN ('UNKNOWN', 'RECONCILING')"))
    op.drop_table('actions')
    op.drop_table('service_members')
    op.drop_index('ix_runs_wait_correlation_key', table_name='runs', postgresql_where=sa.text('wait_correlation_key IS NOT NULL'))
    op.drop_index('ix_runs_tenant_status', table_name='runs')
    op.drop_index('ix_runs_ready_queue', table_name='runs', postgresql_where=sa.text('admitted_at IS NULL'))
    op.drop_index('ix_runs_lease_until', table_name='runs', postgresql_where=sa.text('lease_owner IS NOT NULL'))
    op.drop_table('runs')
    op.drop_table('quarantine')
    op.drop_table('partition_leases')
    op.drop_index('ix_outbox_unpublished', table_name='outbox', postgresql_where=sa.text('published_at IS NULL'))
    op.drop_table('outbox')
    op.drop_table('inbox_worker')
    op.drop_table('inbox_timer')
    op.drop_table('inbox_scheduler')
    op.drop_table('inbox_reconciler')
    op.drop_table('inbox_gateway')
    op.drop_table('delivery_failures')
    op.drop_table('audit_log')
