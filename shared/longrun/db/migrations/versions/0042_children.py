"""Child runs (``domain.children``): the ``children`` table linking a child run to its parent, and the
timer kind ``child_ended`` that carries a child's end to its parent.

Revision ID: 0042
Revises: 0041
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0042'
down_revision = '0041'
branch_labels = None
depends_on = None

_BEFORE = ('retry_backoff', 'wait_deadline', 'business_deadline', 'schedule_to_start', 'start_to_close',
           'heartbeat', 'sleep', 'wait_reminder', 'wait_escalation')
_AFTER = (*_BEFORE, 'child_ended')


def _kinds(kinds: tuple[str, ...]) -> str:
    return "kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"


def upgrade() -> None:
    op.create_table(
        'children',
        sa.Column('child_run_id', sa.Text(), nullable=False),
        sa.Column('parent_run_id', sa.Text(), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('on_parent_cancel', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("on_parent_cancel IN ('cancel', 'abandon')",
                           name=op.f('ck_children_on_parent_cancel_known')),
        sa.ForeignKeyConstraint(['child_run_id'], ['runs.run_id'], name=op.f('fk_children_child_run_id_runs')),
        sa.ForeignKeyConstraint(['parent_run_id'], ['runs.run_id'], name=op.f('fk_children_parent_run_id_runs')),
        sa.PrimaryKeyConstraint('child_run_id', name=op.f('pk_children')),
        sa.UniqueConstraint('parent_run_id', 'name', name=op.f('uq_children_parent_run_id_name')),
    )
    op.create_index('ix_children_parent', 'children', ['parent_run_id'])
    op.drop_constraint(op.f('ck_timers_kind'), 'timers', type_='check')
    op.create_check_constraint(op.f('ck_timers_kind'), 'timers', _kinds(_AFTER))


def downgrade() -> None:
    op.execute("DELETE FROM timers WHERE kind = 'child_ended'")
    op.drop_constraint(op.f('ck_timers_kind'), 'timers', type_='check')
    op.create_check_constraint(op.f('ck_timers_kind'), 'timers', _kinds(_BEFORE))
    op.drop_index('ix_children_parent', table_name='children')
    op.drop_table('children')
