"""A run's schedule-to-start limit (seconds), kept next to its snapshot: set when the run is created,
NULL for a run without one. Statements that must not pay for the setting when a run has none read it
here instead of in the snapshot: the worker's take cancels the run's queue timer only when it is set,
and the timer service sends such a run's wakes through the domain, which schedules the next stint's
timer. Adding a nullable column without a default rewrites nothing.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('schedule_to_start', sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column('runs', 'schedule_to_start')
