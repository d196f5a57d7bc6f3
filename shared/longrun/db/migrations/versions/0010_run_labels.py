"""Run labels as rows (``run_labels``), so operators find runs by label: a run.create's labels
were accepted and dropped. Written with the run, never updated.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_labels',
        sa.Column('run_id', sa.Text(), sa.ForeignKey('runs.run_id'), nullable=False),
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('key', sa.Text(), nullable=False),
        sa.Column('value', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('run_id', 'key'),
    )
    op.create_index('ix_run_labels_tenant_key_value', 'run_labels', ['tenant_id', 'key', 'value'])


def downgrade() -> None:
    op.drop_index('ix_run_labels_tenant_key_value', table_name='run_labels')
    op.drop_table('run_labels')
