"""Per-tenant limits as data, and each tenant's budget use in its current period.

``tenant_limits``: one row per tenant whose run slots, token or cost budget per period, or tool
concurrency differ from the platform's defaults (a null column is the default).
``tenant_budget_use``: what a tenant with a budget used in its current period, and whether it is spent.

Revision ID: 0034
Revises: 0033
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0034'
down_revision = '0033'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tenant_limits',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('run_slots', sa.Integer(), nullable=True),
        sa.Column('token_budget', sa.BigInteger(), nullable=True),
        sa.Column('cost_budget', sa.Float(), nullable=True),
        sa.Column('tool_concurrency', postgresql.JSONB(astext_type=sa.Text()),
                  server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column('updated_by', sa.Text(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint('version >= 1', name=op.f('ck_tenant_limits_version_positive')),
        sa.CheckConstraint('run_slots >= 0', name=op.f('ck_tenant_limits_run_slots_not_negative')),
        sa.CheckConstraint('token_budget >= 0', name=op.f('ck_tenant_limits_token_budget_not_negative')),
        sa.CheckConstraint('cost_budget >= 0', name=op.f('ck_tenant_limits_cost_budget_not_negative')),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_tenant_limits')),
    )
    op.create_table(
        'tenant_budget_use',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('period_end', sa.DateTime(timezone=True), nullable=False),
        sa.Column('tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost', sa.Float(), nullable=False),
        sa.Column('spent', sa.Boolean(), nullable=False),
        sa.CheckConstraint('period_end > period_start', name=op.f('ck_tenant_budget_use_period_ordered')),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_tenant_budget_use')),
    )


def downgrade() -> None:
    op.drop_table('tenant_budget_use')
    op.drop_table('tenant_limits')
