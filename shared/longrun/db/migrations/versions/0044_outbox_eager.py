"""Rows their writer publishes itself right after its commit: ``outbox.eager_until``, until when the
relay leaves them (and what follows them in their partition) to it.

Revision ID: 0044
Revises: 0043
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0044'
down_revision = '0043'
branch_labels = None
depends_on = None


_NOTIFY_UNLESS_EAGER = """
    CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM inserted WHERE eager_until IS NULL) THEN
            PERFORM pg_notify('longrun_outbox', '');
        END IF;
        RETURN NULL;
    END $$;
"""
_NOTIFY_ALWAYS = """
    CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('longrun_outbox', '');
        RETURN NULL;
    END $$;
"""


def upgrade() -> None:
    op.add_column('outbox', sa.Column('eager_until', sa.DateTime(timezone=True), nullable=True))
    # The relay is woken only by rows it is to publish now: an eager row's writer publishes it.
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute(_NOTIFY_UNLESS_EAGER)
    op.execute("CREATE TRIGGER outbox_notify AFTER INSERT ON outbox REFERENCING NEW TABLE AS inserted "
               "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()")


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute(_NOTIFY_ALWAYS)
    op.execute("CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()")
    op.drop_column('outbox', 'eager_until')
