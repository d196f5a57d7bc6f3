"""Concurrency keys: a run may carry a key of its tenant (``concurrency_key``) that at most
``concurrency_limit`` runs hold at once, from their first admission (``concurrency_held_at``) until
they end. Runs without a key leave the three columns NULL and are in neither new index, so their
writes cost what they did.

The columns are added without a default (no table rewrite); the indexes are built CONCURRENTLY,
outside the migration's transaction, so runs keep being written.

Revision ID: 0036
Revises: 0035
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0036'
down_revision = '0035'
branch_labels = None
depends_on = None

OPEN_RUN = "status NOT IN ('BUDGET_EXHAUSTED', 'CANCELLED', 'COMPLETED', 'FAILED', 'TERMINATED', 'TIMED_OUT')"
HOLDS_KEY = f"concurrency_held_at IS NOT NULL AND {OPEN_RUN}"
KEYED_OPEN = f"concurrency_key IS NOT NULL AND {OPEN_RUN}"
KEY_HOLDERS = f"""
    CREATE OR REPLACE FUNCTION concurrency_key_holders(tenant text, key text, up_to integer, besides text)
    RETURNS bigint LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RETURN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE tenant_id = tenant AND concurrency_key = key
                AND {HOLDS_KEY} AND run_id IS DISTINCT FROM besides LIMIT up_to) AS h);
    END $$
"""
WHOLE = ("(concurrency_key IS NULL) = (concurrency_limit IS NULL) AND concurrency_limit > 0 "
         "AND (concurrency_held_at IS NULL OR concurrency_key IS NOT NULL)")


def upgrade() -> None:
    op.add_column('runs', sa.Column('concurrency_key', sa.Text(), nullable=True))
    op.add_column('runs', sa.Column('concurrency_limit', sa.SmallInteger(), nullable=True))
    op.add_column('runs', sa.Column('concurrency_held_at', sa.DateTime(timezone=True), nullable=True))
    op.execute(f"ALTER TABLE runs ADD CONSTRAINT ck_runs_concurrency_key_whole CHECK ({WHOLE}) NOT VALID")
    op.execute("ALTER TABLE runs VALIDATE CONSTRAINT ck_runs_concurrency_key_whole")
    # Admission asks it only for queued runs with a key: as a function, the statements that read none
    # carry no subquery to set up.
    op.execute(KEY_HOLDERS)
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_holding_keys', 'runs', ['tenant_id', 'concurrency_key'],
                        postgresql_where=sa.text(HOLDS_KEY), postgresql_concurrently=True, if_not_exists=True)
        op.create_index('ix_runs_keyed_open', 'runs', ['tenant_id', 'concurrency_key', 'created_at'],
                        postgresql_where=sa.text(KEYED_OPEN), postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index('ix_runs_keyed_open', table_name='runs', postgresql_concurrently=True, if_exists=True)
        op.drop_index('ix_runs_holding_keys', table_name='runs', postgresql_concurrently=True, if_exists=True)
    op.execute("DROP FUNCTION concurrency_key_holders(text, text, integer, text)")
    op.drop_constraint('concurrency_key_whole', 'runs', type_='check')
    op.drop_column('runs', 'concurrency_held_at')
    op.drop_column('runs', 'concurrency_limit')
    op.drop_column('runs', 'concurrency_key')
