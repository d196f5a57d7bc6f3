"""Artifacts: content-addressed per tenant, uploaded before they are referenced, orphans swept from the
table of uploads after a grace period. Every contract test runs against both stores: the filesystem,
and a real S3-compatible server (``tests/integration/s3_server.py``)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.artifacts import RUNTIME, ArtifactStore, FilesystemArtifactStore
from longrun.db.artifacts import RecordedUploads, register, sweep_orphans
from longrun.s3_artifacts import S3ArtifactStore
from tests.integration.s3_server import S3Server, new_prefix

pytestmark = pytest.mark.integration


@pytest.fixture(params=["filesystem", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[ArtifactStore]:  # type: ignore[no-untyped-def]
    if request.param == "filesystem":
        yield FilesystemArtifactStore(tmp_path / "artifacts")
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        yield S3ArtifactStore(server.location(new_prefix()))


async def test_the_same_bytes_are_stored_once_per_tenant_under_their_hash(store: ArtifactStore) -> None:
    data = b"ci log line\n" * 1000
    first, second = await store.put("acme", data), await store.put("acme", data)
    assert first == second == hashlib.sha256(data).hexdigest()
    assert await store.get("acme", first) == data
    assert (await store.location("acme", first)).endswith(f"/tenants/acme/{first[:2]}/{first}")


async def test_identical_bytes_of_two_tenants_are_two_objects(store: ArtifactStore) -> None:
    # Given the same bytes uploaded by two tenants
    data = b"the same diff, twice"
    content_hash = await store.put("acme", data)
    assert await store.put("globex", data) == content_hash
    # When one tenant's object is deleted
    await store.delete("acme", content_hash)
    # Then the other's is still there, and the first tenant has none by that hash
    assert await store.get("globex", content_hash) == data
    with pytest.raises(FileNotFoundError):
        await store.get("acme", content_hash)


async def test_a_tenant_never_reads_another_tenants_object(store: ArtifactStore) -> None:
    content_hash = await store.put("acme", b"acme's private log")
    with pytest.raises(FileNotFoundError):
        await store.get("globex", content_hash)


async def test_deleting_what_is_gone_is_no_error(store: ArtifactStore) -> None:
    content_hash = hashlib.sha256(b"never stored").hexdigest()
    await store.delete("acme", content_hash)
    with pytest.raises(FileNotFoundError):
        await store.get("acme", content_hash)


async def test_the_runtimes_archives_are_apart_from_every_tenant(store: ArtifactStore) -> None:
    content_hash = await store.put(RUNTIME, b'{"run_id": "r1"}\n')
    assert (await store.location(RUNTIME, content_hash)).endswith(f"/runtime/{content_hash[:2]}/{content_hash}")
    with pytest.raises(FileNotFoundError):
        await store.get("runtime", content_hash)


async def _age(engine: AsyncEngine, tenant_id: str, content_hash: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE artifact_uploads SET started_at = now() - interval '1 hour' "
                                "WHERE tenant_id = :t AND content_hash = :h"), {"t": tenant_id, "h": content_hash})


async def _uploads(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        return {(r.tenant_id, r.content_hash) for r in await conn.execute(
            text("SELECT tenant_id, content_hash FROM artifact_uploads"))}


async def test_uploads_never_registered_are_swept_after_the_grace_period_and_nothing_else(
        clean, engine: AsyncEngine, store: ArtifactStore) -> None:
    # Given a registered upload, an old one whose transaction rolled back, the same bytes of another
    # tenant registered, and a fresh unregistered upload (its transaction may still commit)
    uploads = RecordedUploads(engine, store)
    kept = await uploads.put("acme", b"referenced")
    async with engine.begin() as conn:
        await register(conn, uploads, kept, tenant_id="acme", size=10, media_type="text/plain", run_id=None)
    orphan = await uploads.put("acme", b"upload whose transaction rolled back")
    assert await uploads.put("globex", b"upload whose transaction rolled back") == orphan
    async with engine.begin() as conn:
        await register(conn, uploads, orphan, tenant_id="globex", size=36, media_type="text/plain", run_id=None)
    fresh = await uploads.put("acme", b"upload whose transaction may still commit")
    assert await _uploads(engine) == {("acme", orphan), ("acme", fresh)}
    await _age(engine, "acme", orphan)
    # When the sweep runs with a 10-minute grace period
    swept = await sweep_orphans(engine, store, grace_seconds=600)
    # Then only acme's old orphan is gone: globex's identical bytes and the fresh upload stay
    assert swept == [("acme", orphan)]
    with pytest.raises(FileNotFoundError):
        await store.get("acme", orphan)
    assert await store.get("globex", orphan) == b"upload whose transaction rolled back"
    assert await store.get("acme", kept) == b"referenced"
    assert await store.get("acme", fresh) == b"upload whose transaction may still commit"
    assert await _uploads(engine) == {("acme", fresh)}
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM artifacts"))).scalar() == 2


async def test_an_old_upload_whose_bytes_were_registered_meanwhile_only_loses_its_row(
        clean, engine: AsyncEngine, store: ArtifactStore) -> None:
    # Given an upload on record for an hour whose bytes a later upload of the tenant registered...
    uploads = RecordedUploads(engine, store)
    content_hash = await uploads.put("acme", b"uploaded twice")
    await _age(engine, "acme", content_hash)
    async with engine.begin() as conn:
        await register(conn, uploads, content_hash, tenant_id="acme", size=14, media_type="text/plain",
                       run_id=None)
    # ...which removed the row: nothing is swept
    assert await sweep_orphans(engine, store, grace_seconds=600) == []
    assert await store.get("acme", content_hash) == b"uploaded twice"
