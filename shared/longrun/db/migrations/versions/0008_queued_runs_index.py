"""The queue's index holds only runs waiting for a slot: READY and not admitted. It held every
unadmitted run, so a run cancelled or terminated while queued (never admitted) stayed in it for
good, and admission's scan of a tenant's oldest queued runs skipped it every time.

Built and dropped CONCURRENTLY, outside the migration's transaction, so runs keep being written.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

COLUMNS = ['tenant_id', 'priority', 'created_at']


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_queued', 'runs', COLUMNS,
                        postgresql_where=sa.text("admitted_at IS NULL AND status = 'READY'"),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index('ix_runs_ready_queue', table_name='runs', postgresql_concurrently=True, if_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_ready_queue', 'runs', COLUMNS, postgresql_where=sa.text('admitted_at IS NULL'),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index('ix_runs_queued', table_name='runs', postgresql_concurrently=True, if_exists=True)
