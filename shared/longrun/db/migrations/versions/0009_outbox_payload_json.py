"""The outbox keeps each envelope as the JSON text it was written as (``json``, not ``jsonb``).

Nothing queries into a stored envelope: the relay reads it whole and publishes it. ``jsonb``
parsed every envelope into its binary form on the way in; ``json`` only checks the text
(docs/cost-model.md, fix 36). A ``jsonb`` value still goes in as it is (assignment cast).

Changing the type rewrites the table under an exclusive lock (writers of outbox rows wait for
it): on a large outbox, run it when traffic is low.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE outbox ALTER COLUMN payload TYPE json USING CAST(payload AS json)")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox ALTER COLUMN payload TYPE jsonb USING CAST(payload AS jsonb)")
