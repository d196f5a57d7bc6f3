"""Eager publish after commit: ``outbox.hold_until``, the rows a worker publishes itself right after
its commit (``longrun.eager_publish``), an index of them for the relay, and the NOTIFY trigger
waking the relay only for rows it is to publish.

Revision ID: 0043
Revises: 0042
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0043'
down_revision = '0042'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('outbox', sa.Column('hold_until', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_outbox_held', 'outbox', ['partition', 'id'],
                    postgresql_where=sa.text('published_at IS NULL AND hold_until IS NOT NULL'))
    # A held row's writer publishes it: waking the relay for it would only have it read and leave it.
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("""
        CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM inserted WHERE hold_until IS NULL) THEN
                PERFORM pg_notify('longrun_outbox', '');
            END IF;
            RETURN NULL;
        END $$;
    """)
    op.execute("CREATE TRIGGER outbox_notify AFTER INSERT ON outbox REFERENCING NEW TABLE AS inserted "
               "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()")


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("""
        CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('longrun_outbox', '');
            RETURN NULL;
        END $$;
    """)
    op.execute("CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()")
    op.drop_index('ix_outbox_held', table_name='outbox')
    op.drop_column('outbox', 'hold_until')
