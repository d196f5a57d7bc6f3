"""Web console sessions are kept server-side: the cookie holds a random id, never a bearer token, and
signing out ends the session for every copy of the cookie.

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'console_sessions',
        sa.Column('id_sha256', sa.Text(), nullable=False),
        sa.Column('principal', JSONB(), nullable=False),
        sa.Column('token_id', sa.BigInteger(), nullable=True),
        sa.Column('bootstrap_sha256', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint('token_id IS NULL OR bootstrap_sha256 IS NULL',
                           name=op.f('ck_console_sessions_one_credential')),
        sa.ForeignKeyConstraint(['token_id'], ['operator_tokens.id'],
                                name=op.f('fk_console_sessions_token_id_operator_tokens')),
        sa.PrimaryKeyConstraint('id_sha256', name=op.f('pk_console_sessions')),
    )
    op.create_index('ix_console_sessions_expires_at', 'console_sessions', ['expires_at'])


def downgrade() -> None:
    op.drop_table('console_sessions')
