"""Rate limits per far side: one token bucket per limit (and tenant), shared by every worker.

Revision ID: 0035
Revises: 0034
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0035'
down_revision = '0034'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'rate_limit_buckets',
        sa.Column('bucket', sa.Text(), nullable=False),
        sa.Column('level', sa.Float(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('rate', sa.Float(), nullable=False),
        sa.Column('burst', sa.Float(), nullable=False),
        sa.Column('hold_until', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('bucket', name=op.f('pk_rate_limit_buckets')),
    )


def downgrade() -> None:
    op.drop_table('rate_limit_buckets')
