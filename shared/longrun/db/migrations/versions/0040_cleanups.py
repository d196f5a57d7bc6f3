"""Cleanup at closure: one row per finished run that owes its kind's cleanup steps, due for the
reconciler, with its attempts, last error and whether its alert was raised.

Revision ID: 0040
Revises: 0039
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0040'
down_revision = '0039'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'cleanups',
        sa.Column('run_id', sa.Text(), nullable=False),
        sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('due_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('alerted', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('done_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.run_id'], name=op.f('fk_cleanups_run_id_runs')),
        sa.PrimaryKeyConstraint('run_id', name=op.f('pk_cleanups')),
    )
    op.create_index('ix_cleanups_due', 'cleanups', ['due_at'], unique=False,
                    postgresql_where=sa.text('done_at IS NULL'))


def downgrade() -> None:
    op.drop_index('ix_cleanups_due', table_name='cleanups', postgresql_where=sa.text('done_at IS NULL'))
    op.drop_table('cleanups')
