"""A run no worker that took its wakeup can run waits for one that can: ``runs.awaiting_worker``
names what it needs (``kind@version``), and workers that serve it take it over from the index.

The column is nullable with no default (no table rewrite); the partial index holds only the runs
waiting, and is built CONCURRENTLY, outside the migration's transaction, so runs keep being written.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('awaiting_worker', sa.Text(), nullable=True))
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_awaiting_worker', 'runs', ['awaiting_worker'],
                        postgresql_where=sa.text('awaiting_worker IS NOT NULL'),
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index('ix_runs_awaiting_worker', table_name='runs', postgresql_concurrently=True, if_exists=True)
    op.drop_column('runs', 'awaiting_worker')
