"""Artifacts belong to a tenant, and uploads are on record before their bytes are written.

An artifact is keyed by its tenant and its content hash, so identical bytes of two tenants are two
objects under two prefixes, and deleting one tenant's objects never touches another's. Archives of
finished runs (which hold several tenants' runs) belong to the runtime: the empty tenant id, which
no tenant can have.

``artifact_uploads`` holds one row per object being uploaded: written before the bytes, deleted by
the transaction that registers them. The orphan sweep deletes the objects of rows older than the
grace period (their transaction never committed), so it never lists the store.

Objects a filesystem store wrote before this revision sit outside any tenant's prefix: their
recorded locations are rewritten to the new layout, and the files are moved there as
docs/artifacts.md shows, before the services start again.

Revision ID: 0033
Revises: 0032
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0033'
down_revision = '0032'
branch_labels = None
depends_on = None


MOVED_FILE_LOCATIONS = r"""
    UPDATE artifacts SET location = regexp_replace(
        location, '/[0-9a-f]{2}/[0-9a-f]{2}/' || content_hash || '$',
        CASE WHEN tenant_id = '' THEN '/runtime/' ELSE '/tenants/' || tenant_id || '/' END
        || substr(content_hash, 1, 2) || '/' || content_hash)
    WHERE location LIKE 'file:%'
"""


def upgrade() -> None:
    op.add_column('artifacts', sa.Column('tenant_id', sa.Text(), nullable=True))
    op.execute("UPDATE artifacts a SET tenant_id = r.tenant_id FROM runs r WHERE a.run_id = r.run_id")
    op.execute("UPDATE artifacts SET tenant_id = '' WHERE tenant_id IS NULL")
    # A filesystem store's files move under their tenant's directory (docs/artifacts.md): their
    # recorded locations say where they will be.
    op.execute(MOVED_FILE_LOCATIONS)
    op.alter_column('artifacts', 'tenant_id', nullable=False)
    op.drop_constraint('pk_artifacts', 'artifacts', type_='primary')
    op.create_primary_key('pk_artifacts', 'artifacts', ['tenant_id', 'content_hash'])
    op.create_table(
        'artifact_uploads',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('content_hash', sa.Text(), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("content_hash ~ '^[0-9a-f]{64}$'", name=op.f('ck_artifact_uploads_sha256')),
        sa.PrimaryKeyConstraint('tenant_id', 'content_hash', name=op.f('pk_artifact_uploads')),
    )
    op.create_index('ix_artifact_uploads_started_at', 'artifact_uploads', ['started_at'])


def downgrade() -> None:
    op.drop_table('artifact_uploads')
    op.drop_constraint('pk_artifacts', 'artifacts', type_='primary')
    op.execute("DELETE FROM artifacts a USING artifacts b WHERE a.content_hash = b.content_hash "
               "AND a.tenant_id > b.tenant_id")
    op.create_primary_key('pk_artifacts', 'artifacts', ['content_hash'])
    op.drop_column('artifacts', 'tenant_id')
