"""A long tool call's progress on its ledger row: the details of its last recorded heartbeat
(``actions.progress``) and when it was recorded (``actions.heartbeat_at``). Both nullable, so adding
them rewrites nothing.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('actions', sa.Column('progress', JSONB(), nullable=True))
    op.add_column('actions', sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('actions', 'heartbeat_at')
    op.drop_column('actions', 'progress')
