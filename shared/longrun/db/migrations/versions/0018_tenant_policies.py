"""Tenant policies: what each tenant lets its runs do (tools, resources), versioned per change.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tenant_policies',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('tools', JSONB(), nullable=False),
        sa.Column('resources', JSONB(), nullable=False),
        sa.Column('updated_by', sa.Text(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint('version >= 1', name=op.f('ck_tenant_policies_version_positive')),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_tenant_policies')),
    )


def downgrade() -> None:
    op.drop_table('tenant_policies')
