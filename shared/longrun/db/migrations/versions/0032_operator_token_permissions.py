"""A named token may carry permissions beside its roles (``create_runs``: a producer's grant); the
tokens made before hold none.

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0032'
down_revision = '0031'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('operator_tokens', sa.Column('permissions', JSONB, nullable=False,
                                               server_default=sa.text("'[]'::jsonb")))


def downgrade() -> None:
    op.drop_column('operator_tokens', 'permissions')
