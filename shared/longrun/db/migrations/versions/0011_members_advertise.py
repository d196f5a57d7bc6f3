"""Members say what they can run: ``service_members.advertised`` holds a worker's run kinds with
every pinned version, so operators see which versions a live worker serves.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('service_members', sa.Column('advertised', JSONB(), nullable=False,
                                               server_default=sa.text("'[]'::jsonb")))


def downgrade() -> None:
    op.drop_column('service_members', 'advertised')
