"""Tool health: one circuit breaker per far side (``tool_health``), shared by every worker, so runs
stop calling a far side that answers unavailable and wait for it to be healthy again.

A new, empty table: nothing to rewrite.

Revision ID: 0017
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tool_health',
        sa.Column('far_side', sa.Text(), nullable=False),
        sa.Column('state', sa.Text(), nullable=False),
        sa.Column('failures', sa.Integer(), server_default='0', nullable=False),
        sa.Column('window_start', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reopen_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('probe_by', sa.Text(), nullable=True),
        sa.Column('probe_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("state IN ('CLOSED', 'OPEN', 'HALF_OPEN')", name=op.f('ck_tool_health_state')),
        sa.CheckConstraint("state = 'CLOSED' OR reopen_at IS NOT NULL OR probe_until IS NOT NULL",
                           name=op.f('ck_tool_health_open_until')),
        sa.PrimaryKeyConstraint('far_side', name=op.f('pk_tool_health')),
    )


def downgrade() -> None:
    op.drop_table('tool_health')
