"""Schedules: runs of a kind created on a cron expression or an interval (``schedules``), and what
each due time did (``schedule_fires``).

Revision ID: 0041
Revises: 0040
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0041'
down_revision = '0040'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'schedules',
        sa.Column('schedule_id', sa.Text(), nullable=False),
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('run', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('cron', sa.Text(), nullable=True),
        sa.Column('every_seconds', sa.Float(), nullable=True),
        sa.Column('anchor', sa.DateTime(timezone=True), nullable=False),
        sa.Column('overlap', sa.Text(), nullable=False),
        sa.Column('catch_up_seconds', sa.Float(), nullable=False),
        sa.Column('paused', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('next_due_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint('(cron IS NULL) <> (every_seconds IS NULL)', name=op.f('ck_schedules_one_cadence')),
        sa.CheckConstraint("overlap IN ('skip', 'buffer_one', 'cancel_previous', 'allow')",
                           name=op.f('ck_schedules_overlap_known')),
        sa.CheckConstraint('catch_up_seconds >= 0', name=op.f('ck_schedules_catch_up_not_negative')),
        sa.PrimaryKeyConstraint('schedule_id', name=op.f('pk_schedules')),
    )
    op.create_index('ix_schedules_due', 'schedules', ['next_due_at'], postgresql_where=sa.text('NOT paused'))
    op.create_index('ix_schedules_tenant_id', 'schedules', ['tenant_id', 'schedule_id'])
    op.create_table(
        'schedule_fires',
        sa.Column('schedule_id', sa.Text(), nullable=False),
        sa.Column('due_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('outcome', sa.Text(), nullable=False),
        sa.Column('run_id', sa.Text(), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('through', sa.DateTime(timezone=True), nullable=True),
        sa.Column('backfill', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('recorded_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("outcome IN ('created', 'skipped', 'missed')", name=op.f('ck_schedule_fires_outcome_known')),
        sa.ForeignKeyConstraint(['schedule_id'], ['schedules.schedule_id'], ondelete='CASCADE',
                                name=op.f('fk_schedule_fires_schedule_id_schedules')),
        sa.PrimaryKeyConstraint('schedule_id', 'due_at', name=op.f('pk_schedule_fires')),
    )


def downgrade() -> None:
    op.drop_table('schedule_fires')
    op.drop_index('ix_schedules_tenant_id', table_name='schedules')
    op.drop_index('ix_schedules_due', table_name='schedules', postgresql_where=sa.text('NOT paused'))
    op.drop_table('schedules')
