"""The artifacts table (which stored objects the database references) and the uploads table (which
objects are being uploaded): upload first, then register, and sweep what was never registered.

An upload's row is written, and committed, before its bytes (``RecordedUploads.put``); the
transaction that registers the object deletes the row (``register``). A row that outlives the orphan
grace period therefore names an object whose transaction never committed: ``sweep_orphans``
deletes that object, holding the row's lock meanwhile so that a new upload of the same bytes waits
for the sweep and then writes them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.artifacts import ArtifactStore, content_hash_of
from longrun.db.schema import artifact_uploads, artifacts


class RecordedUploads:
    """An ``ArtifactStore`` whose uploads are on record before their bytes are written."""

    def __init__(self, engine: AsyncEngine, store: ArtifactStore) -> None:
        self.engine = engine
        self.store = store

    async def put(self, tenant_id: str, data: bytes) -> str:
        content_hash = content_hash_of(data)
        async with self.engine.begin() as conn:
            # A repeated upload of the same bytes restarts the grace period of the row.
            row = insert(artifact_uploads).values(tenant_id=tenant_id, content_hash=content_hash)
            await conn.execute(row.on_conflict_do_update(
                index_elements=[artifact_uploads.c.tenant_id, artifact_uploads.c.content_hash],
                set_={"started_at": func.now()}))
        stored = await self.store.put(tenant_id, data)
        assert stored == content_hash, "a store names an object by the SHA-256 of its bytes"
        return content_hash

    async def get(self, tenant_id: str, content_hash: str) -> bytes:
        return await self.store.get(tenant_id, content_hash)

    async def location(self, tenant_id: str, content_hash: str) -> str:
        return await self.store.location(tenant_id, content_hash)

    async def delete(self, tenant_id: str, content_hash: str) -> None:
        await self.store.delete(tenant_id, content_hash)


async def register(conn: AsyncConnection, store: ArtifactStore, content_hash: str, *, tenant_id: str, size: int,
                   media_type: str, run_id: str | None) -> None:
    """Reference an uploaded object from the database, in the caller's transaction; its upload is
    no longer in flight once that transaction commits."""
    await conn.execute(insert(artifacts).values(
        tenant_id=tenant_id, content_hash=content_hash, size_bytes=size, media_type=media_type,
        location=await store.location(tenant_id, content_hash), run_id=run_id).on_conflict_do_nothing())
    await conn.execute(delete(artifact_uploads).where(
        artifact_uploads.c.tenant_id == tenant_id, artifact_uploads.c.content_hash == content_hash))


async def media_type(conn: AsyncConnection, tenant_id: str, content_hash: str) -> str | None:
    """The media type an artifact of the tenant was stored with, or None when it has none by that hash."""
    return (await conn.execute(select(artifacts.c.media_type).where(
        artifacts.c.tenant_id == tenant_id, artifacts.c.content_hash == content_hash))).scalar()


async def sweep_orphans(engine: AsyncEngine, store: ArtifactStore, *, grace_seconds: float,
                        batch: int = 100) -> list[tuple[str, str]]:
    """Delete the objects of uploads older than the grace period that were never registered; return
    them as (tenant, hash). An old upload whose bytes another upload registered meanwhile only
    loses its row."""
    swept: list[tuple[str, str]] = []
    while True:
        async with engine.begin() as conn:
            stale = (await conn.execute(
                select(artifact_uploads.c.tenant_id, artifact_uploads.c.content_hash)
                .where(artifact_uploads.c.started_at < func.now() - timedelta(seconds=grace_seconds))
                .order_by(artifact_uploads.c.started_at).limit(batch)
                .with_for_update(skip_locked=True))).all()
            if not stale:
                return swept
            keys = [(row.tenant_id, row.content_hash) for row in stale]
            registered = await _registered_among(conn, keys)
            for tenant_id, content_hash in keys:
                if (tenant_id, content_hash) not in registered:
                    await store.delete(tenant_id, content_hash)
                    swept.append((tenant_id, content_hash))
            await conn.execute(delete(artifact_uploads).where(
                tuple_(artifact_uploads.c.tenant_id, artifact_uploads.c.content_hash).in_(keys)))
        if len(stale) < batch:
            return swept


async def _registered_among(conn: AsyncConnection, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    rows = await conn.execute(select(artifacts.c.tenant_id, artifacts.c.content_hash).where(
        tuple_(artifacts.c.tenant_id, artifacts.c.content_hash).in_(keys)))
    return {(row.tenant_id, row.content_hash) for row in rows}
