"""A run keeps the traceparent of its root span (``runs.trace_root``), so every span of the run, in
whichever service and after whatever wait, is a child of it: one trace per run.

Revision ID: 0023
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('trace_root', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('runs', 'trace_root')
