"""The reconciler's held runs (ACTION_UNKNOWN, CANCELLING, PAUSED) get a partial index: every round
it looks for their actions in doubt, and without one it read every run, parked or kept, to find
the handful (``docs/cost-model.md``, a million parked runs). Keyed on status alone, which another
index already holds, so updates that were HOT stay HOT. Built CONCURRENTLY: runs keep being written.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

_HELD = "status IN ('ACTION_UNKNOWN', 'CANCELLING', 'PAUSED')"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_held', 'runs', ['status'], postgresql_where=sa.text(_HELD),
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index('ix_runs_held', table_name='runs', postgresql_concurrently=True, if_exists=True)
