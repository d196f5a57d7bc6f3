"""A run may wait for a person's answer to a question: WAITING_USER names either the approval it
waits for (id, owner, hash), as before, or the question (``wait_kind`` 'question' and the question's
id in the snapshot's wait).

The new CHECK is added NOT VALID and validated afterwards: validating takes only a SHARE UPDATE
EXCLUSIVE lock, so runs keep being written while the existing rows are checked.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

_NAMED = ("status <> 'WAITING_USER' OR (approval_id IS NOT NULL AND approval_owner IS NOT NULL "
          "AND approved_hash IS NOT NULL) OR (wait_kind = 'question' "
          "AND (snapshot #>> '{wait,question_id}') IS NOT NULL)")


def upgrade() -> None:
    op.execute(f"ALTER TABLE runs ADD CONSTRAINT ck_runs_user_wait_named CHECK ({_NAMED}) NOT VALID")
    op.execute("ALTER TABLE runs VALIDATE CONSTRAINT ck_runs_user_wait_named")
    op.drop_constraint(op.f('ck_runs_approval_named'), 'runs', type_='check')


def downgrade() -> None:
    # Runs waiting for an answer have no approval to name: refused by the old CHECK, as they should be.
    op.create_check_constraint(op.f('ck_runs_approval_named'), 'runs',
                               "status <> 'WAITING_USER' OR (approval_id IS NOT NULL AND approval_owner IS NOT NULL "
                               "AND approved_hash IS NOT NULL)")
    op.drop_constraint(op.f('ck_runs_user_wait_named'), 'runs', type_='check')
