"""A finished run's events and actions are archived to the artifact store and pruned; its row stays
as a tombstone that says when it was archived and which artifact holds the archive. Retention finds
the finished runs not archived yet through an index of exactly those.

run_events stays append-only, except that the events of an archived run may be deleted: they are in
its archive.

The CHECK is added unvalidated and validated after (no long lock on runs), the index CONCURRENTLY,
outside the migration's transaction, so runs keep being written.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

TO_ARCHIVE = ("status IN ('BUDGET_EXHAUSTED', 'CANCELLED', 'COMPLETED', 'FAILED', 'TERMINATED', 'TIMED_OUT') "
              "AND archived_at IS NULL")

APPEND_ONLY = """
    CREATE OR REPLACE FUNCTION run_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {archived}RAISE EXCEPTION 'run_events is append-only: % refused', TG_OP;
    END $$;
"""
ARCHIVED = """IF TG_OP = 'DELETE' AND EXISTS (
            SELECT 1 FROM runs WHERE run_id = OLD.run_id AND archived_at IS NOT NULL) THEN
            RETURN OLD;
        END IF;
        """


def upgrade() -> None:
    op.add_column('runs', sa.Column('archived_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('runs', sa.Column('archive', sa.Text(), nullable=True))
    op.execute("ALTER TABLE runs ADD CONSTRAINT ck_runs_archive_whole "
               "CHECK ((archived_at IS NULL) = (archive IS NULL)) NOT VALID")
    op.execute("ALTER TABLE runs VALIDATE CONSTRAINT ck_runs_archive_whole")
    op.execute(APPEND_ONLY.format(archived=ARCHIVED))
    with op.get_context().autocommit_block():
        op.create_index('ix_runs_to_archive', 'runs', ['created_at', 'run_id'], postgresql_where=sa.text(TO_ARCHIVE),
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    op.execute(APPEND_ONLY.format(archived=""))
    with op.get_context().autocommit_block():
        op.drop_index('ix_runs_to_archive', table_name='runs', postgresql_concurrently=True, if_exists=True)
    op.drop_constraint('archive_whole', 'runs', type_='check')
    op.drop_column('runs', 'archive')
    op.drop_column('runs', 'archived_at')
