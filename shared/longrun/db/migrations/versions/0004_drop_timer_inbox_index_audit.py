"""The timer service reads the timers table, not messages: its inbox table goes. The reconciler
looks up its own alerts by action and target on every pass: index them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table('inbox_timer')
    op.create_index('ix_audit_log_action_target', 'audit_log', ['action', 'target'])


def downgrade() -> None:
    op.drop_index('ix_audit_log_action_target', table_name='audit_log')
    op.create_table('inbox_timer',
    sa.Column('message_id', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('handled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('message_id', name=op.f('pk_inbox_timer'))
    )
