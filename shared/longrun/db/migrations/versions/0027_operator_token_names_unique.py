"""A live token's name belongs to one holder: an approval owned by a name is decided only by that
name's token, so no principal, an admin included, may mint a second live token under a name in use.
An upgrade over live tokens that share a name stops, naming them, rather than choose between them.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    shared = op.get_bind().execute(sa.text(
        "SELECT name, string_agg(id::text, ', ' ORDER BY id) AS ids FROM operator_tokens "
        "WHERE revoked_at IS NULL GROUP BY name HAVING count(*) > 1 ORDER BY name")).all()
    if shared:
        named = "; ".join(f"{row.name!r} (tokens {row.ids})" for row in shared)
        raise RuntimeError(f"live operator tokens share a name: {named}. Revoke all but one token of each name "
                           "(longrunctl token revoke <id>) and upgrade again")
    op.create_index('ux_operator_tokens_live_name', 'operator_tokens', ['name'], unique=True,
                    postgresql_where=sa.text('revoked_at IS NULL'))


def downgrade() -> None:
    op.drop_index('ux_operator_tokens_live_name', table_name='operator_tokens')
