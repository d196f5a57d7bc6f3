"""Artifacts: content-addressed, uploaded before they are referenced, orphans swept after a grace period."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from sqlalchemy import text

from longrun.artifacts import FilesystemArtifactStore
from longrun.db.artifacts import register
from longrun.services.reconciler.retention import sweep_orphans

pytestmark = pytest.mark.integration


async def test_the_same_bytes_are_stored_once_under_their_hash(tmp_path) -> None:
    store = FilesystemArtifactStore(tmp_path)
    data = b"ci log line\n" * 1000
    first, second = await store.put(data), await store.put(data)
    assert first == second == hashlib.sha256(data).hexdigest()
    assert await store.get(first) == data
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [first]


async def test_orphans_older_than_the_grace_period_are_swept_and_referenced_ones_kept(clean, engine, tmp_path) -> None:
    # Given an uploaded and registered object, an old unregistered one, and a fresh unregistered one
    store = FilesystemArtifactStore(tmp_path)
    kept = await store.put(b"referenced")
    async with engine.begin() as conn:
        await register(conn, store, kept, size=10, media_type="text/plain", run_id=None)
    orphan = await store.put(b"upload whose transaction rolled back")
    fresh = await store.put(b"upload whose transaction may still commit")
    hour_ago = time.time() - 3600
    for content_hash in (kept, orphan):
        os.utime(store._path(content_hash), (hour_ago, hour_ago))
    # When the sweep runs with a 10-minute grace period
    swept = await sweep_orphans(engine, store, grace_seconds=600)
    # Then only the old orphan is gone
    assert swept == [orphan]
    assert await store.get(kept) == b"referenced"
    assert await store.get(fresh) == b"upload whose transaction may still commit"
    with pytest.raises(FileNotFoundError):
        await store.get(orphan)
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM artifacts"))).scalar() == 1
