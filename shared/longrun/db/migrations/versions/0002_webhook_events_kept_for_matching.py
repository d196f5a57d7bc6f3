"""Webhook events kept for matching: an event that arrives before its wait starts is matched later.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('webhook_events',
    sa.Column('provider', sa.Text(), nullable=False),
    sa.Column('event_id', sa.Text(), nullable=False),
    sa.Column('correlation_key', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('matched_run_id', sa.Text(), nullable=True),
    sa.Column('matched_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('provider', 'event_id', name=op.f('pk_webhook_events'))
    )
    op.create_index('ix_webhook_events_unmatched', 'webhook_events', ['correlation_key'], unique=False, postgresql_where=sa.text('matched_run_id IS NULL'))


def downgrade() -> None:
    op.drop_index('ix_webhook_events_unmatched', table_name='webhook_events', postgresql_where=sa.text('matched_run_id IS NULL'))
    op.drop_table('webhook_events')
