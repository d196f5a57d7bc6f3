"""A stopping replica stays a member while it finishes what it holds, without taking partitions:
``service_members.stopping``.

Revision ID: 0043
Revises: 0042
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0043'
down_revision = '0042'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('service_members', sa.Column('stopping', sa.Boolean(), server_default=sa.text('false'),
                                               nullable=False))


def downgrade() -> None:
    op.drop_column('service_members', 'stopping')
