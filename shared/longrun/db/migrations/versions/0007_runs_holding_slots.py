"""Admission counts a tenant's runs that hold a slot (admitted, not finished) through an index of
exactly those: the index of all its open runs (0006) made every count read its queue as well, so
with a backlog each create and each finished run (which hands its slot on) paid for the whole
queue. Whether a run is queued is read from ix_runs_ready_queue. The index of open runs has no
other reader and goes.

Built and dropped CONCURRENTLY, outside the migration's transaction, so runs keep being written.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

OPEN_RUN = "status NOT IN ('BUDGET_EXHAUSTED', 'CANCELLED', 'COMPLETED', 'FAILED', 'TERMINATED', 'TIMED_OUT')"
HOLDS_SLOT = f"admitted_at IS NOT NULL AND {OPEN_RUN}"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_holding_slots', 'runs', ['tenant_id'], postgresql_where=sa.text(HOLDS_SLOT),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index('ix_runs_open_by_tenant', table_name='runs', postgresql_concurrently=True, if_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_open_by_tenant', 'runs', ['tenant_id'], postgresql_where=sa.text(OPEN_RUN),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index('ix_runs_holding_slots', table_name='runs', postgresql_concurrently=True, if_exists=True)
