"""Tenant ceilings: how far each tenant's own admins may set its settings, set by an admin of every
tenant. Each tenant policy in force now becomes its tenant's ceiling (version 1), so a tenant's admin
can narrow the policy it was given and never widen it past what it held when ceilings came in.

Revision ID: 0029
Revises: 0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tenant_ceilings',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('limits', JSONB(), nullable=False),
        sa.Column('updated_by', sa.Text(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint('version >= 1', name=op.f('ck_tenant_ceilings_version_positive')),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_tenant_ceilings')),
    )
    op.execute("INSERT INTO tenant_ceilings (tenant_id, version, limits, updated_by) "
               "SELECT tenant_id, 1, jsonb_build_object('tools', tools, 'resources', resources), "
               "'migration 0029: the policy in force' FROM tenant_policies")


def downgrade() -> None:
    op.drop_table('tenant_ceilings')
