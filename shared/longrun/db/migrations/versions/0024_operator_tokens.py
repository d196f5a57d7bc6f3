"""Named API tokens of operators, stored hashed (``longrun.identity``; ``longrunctl token``).

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'operator_tokens',
        sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('secret_sha256', sa.Text(), nullable=False),
        sa.Column('roles', JSONB(), nullable=False),
        sa.Column('tenants', JSONB(), nullable=True),
        sa.Column('created_by', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_operator_tokens')),
        sa.UniqueConstraint('secret_sha256', name=op.f('uq_operator_tokens_secret_sha256')),
    )


def downgrade() -> None:
    op.drop_table('operator_tokens')
