"""Tool concurrency: one permit per call in flight of a tenant's bounded tool group, naming the
worker that holds it (free once that worker's membership lapses).

Revision ID: 0037
Revises: 0036
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0037'
down_revision = '0036'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tool_permits',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('tool_group', sa.Text(), nullable=False),
        sa.Column('run_id', sa.Text(), nullable=False),
        sa.Column('holder', sa.Text(), nullable=False),
        sa.Column('taken_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', 'tool_group', 'run_id', 'holder', name=op.f('pk_tool_permits')),
    )


def downgrade() -> None:
    op.drop_table('tool_permits')
