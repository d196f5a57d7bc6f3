"""The artifacts table: which stored objects the database references (upload first, then register)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.artifacts import ArtifactStore
from longrun.db.schema import artifacts


async def register(conn: AsyncConnection, store: ArtifactStore, content_hash: str, *, size: int, media_type: str,
                   run_id: str | None) -> None:
    """Reference an uploaded object from the database, in the caller's transaction."""
    await conn.execute(insert(artifacts).values(
        content_hash=content_hash, size_bytes=size, media_type=media_type,
        location=await store.location(content_hash), run_id=run_id).on_conflict_do_nothing())


async def registered_among(conn: AsyncConnection, content_hashes: Sequence[str]) -> set[str]:
    """Those of ``content_hashes`` a row references."""
    return set((await conn.execute(
        select(artifacts.c.content_hash).where(artifacts.c.content_hash.in_(content_hashes)))).scalars())


async def media_type(conn: AsyncConnection, content_hash: str) -> str | None:
    """The media type an artifact was stored with, or None when no artifact has that hash."""
    return (await conn.execute(select(artifacts.c.media_type).where(
        artifacts.c.content_hash == content_hash))).scalar()
