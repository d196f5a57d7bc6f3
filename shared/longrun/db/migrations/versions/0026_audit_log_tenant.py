"""Each audit entry names the tenant it concerns (null: none, or every tenant), so a tenant's viewer
is shown its entries by that column rather than by matching targets against tenant names: a tenant
named like a webhook provider or a quarantine entry saw those entries. Existing entries get the
tenant of the run they name, and a policy change that of its tenant.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

# The actions written up to this revision whose target is not a run; every other one's target is.
_NOT_ON_RUNS = ("webhook.refused", "quarantine.replay", "retention.pass", "token.create", "token.revoke",
                "tenant_policy.set")


def upgrade() -> None:
    op.add_column('audit_log', sa.Column('tenant_id', sa.Text(), nullable=True))
    op.execute(sa.text("UPDATE audit_log AS a SET tenant_id = r.tenant_id FROM runs AS r "
                       "WHERE r.run_id = a.target AND a.action NOT IN :not_on_runs").bindparams(
        sa.bindparam("not_on_runs", _NOT_ON_RUNS, expanding=True)))
    op.execute("UPDATE audit_log SET tenant_id = target WHERE action = 'tenant_policy.set'")
    op.create_index('ix_audit_log_tenant', 'audit_log', ['tenant_id', 'at'],
                    postgresql_where=sa.text('tenant_id IS NOT NULL'))


def downgrade() -> None:
    op.drop_index('ix_audit_log_tenant', table_name='audit_log')
    op.drop_column('audit_log', 'tenant_id')
