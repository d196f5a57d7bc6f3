"""Outbox NOTIFY from a statement trigger: one notification per INSERT, no extra round trip per row.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOTIFY is delivered at commit and only wakes the relays, which rescan their partitions.
    op.execute("""
        CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('longrun_outbox', '');
            RETURN NULL;
        END $$;
    """)
    op.execute("CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
               "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()")


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("DROP FUNCTION outbox_notify()")
