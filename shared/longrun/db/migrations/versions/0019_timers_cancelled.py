"""A timer whose wait or run ended another way is cancelled (``timers.cancelled_at``), in the
transaction that ended it, so it never fires: no late wake is stored for it. Cancelled timers
stay distinguishable from fired ones (retention prunes both).

The due index leaves cancelled timers out; a second partial index finds a run's open timers, which
is what the cancellation looks up. Both are built CONCURRENTLY, outside the migration's transaction,
so timers keep being written; the old due index is dropped once the new one exists.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

_OPEN = 'fired_at IS NULL AND cancelled_at IS NULL'


def upgrade() -> None:
    op.add_column('timers', sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True))
    with op.get_context().autocommit_block():
        op.create_index('ix_timers_due_open', 'timers', ['wake_at'], postgresql_where=sa.text(_OPEN),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index('ix_timers_due', table_name='timers', postgresql_concurrently=True, if_exists=True)
        op.create_index('ix_timers_open_by_run', 'timers', ['run_id'], postgresql_where=sa.text(_OPEN),
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index('ix_timers_due', 'timers', ['wake_at'], postgresql_where=sa.text('fired_at IS NULL'),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index('ix_timers_open_by_run', table_name='timers', postgresql_concurrently=True, if_exists=True)
        op.drop_index('ix_timers_due_open', table_name='timers', postgresql_concurrently=True, if_exists=True)
    op.drop_column('timers', 'cancelled_at')
