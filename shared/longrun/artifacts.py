"""Content-addressed artifacts: large tool outputs (logs, diffs, receipts) live outside events and rows.

Every object belongs to a tenant and is stored under that tenant's prefix, named by its SHA-256
(``object_key``): identical bytes of two tenants are stored twice, so one tenant's objects can be
listed, exported or deleted without touching another's. Archives of finished runs hold several
tenants' runs and belong to the runtime (``RUNTIME``).

Upload first, then register: the bytes are written before the transaction that references them
commits, so a committed reference never points at nothing. Every upload is put on record
(``longrun.db.artifacts.RecordedUploads``) before its bytes are written; the registering
transaction removes that record, so a record older than a grace period names an object whose
transaction never committed, and the orphan sweep deletes it. Two stores implement the protocol:
the filesystem (the default) and any S3-compatible service (``longrun.s3_artifacts``). The
references live in PostgreSQL (``longrun.db.artifacts``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from pathlib import Path
from typing import Protocol

INLINE_LIMIT = 4096
"""Receipts larger than this (as JSON) are stored as an artifact and referenced by hash."""

RUNTIME = ""
"""The owner of the runtime's own objects (archives of finished runs): no tenant id is empty."""

_TENANT = re.compile(r"[A-Za-z0-9_-]{1,100}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def content_hash_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def object_key(tenant_id: str, content_hash: str) -> str:
    """Where an object lives in a store: ``tenants/<tenant>/<hh>/<hash>``, or ``runtime/<hh>/<hash>``.

    Raises:
        ValueError: the tenant id or the hash could escape its prefix (a tenant id matches the
            envelope's pattern; a hash is 64 lowercase hex digits).
    """
    if not _SHA256.fullmatch(content_hash):
        raise ValueError(f"an artifact is named by a SHA-256 of 64 lowercase hex digits, got {content_hash!r}")
    if tenant_id == RUNTIME:
        return f"runtime/{content_hash[:2]}/{content_hash}"
    if not _TENANT.fullmatch(tenant_id):
        raise ValueError(f"a tenant id is 1-100 of A-Z a-z 0-9 _ -, got {tenant_id!r}")
    return f"tenants/{tenant_id}/{content_hash[:2]}/{content_hash}"


class ArtifactStore(Protocol):
    async def put(self, tenant_id: str, data: bytes) -> str:
        """Store ``data`` under the tenant's prefix; return its SHA-256 hex. Idempotent."""

    async def get(self, tenant_id: str, content_hash: str) -> bytes:
        """The stored bytes; raises FileNotFoundError when the tenant has no such object."""

    async def location(self, tenant_id: str, content_hash: str) -> str:
        """A URI naming the object, recorded with its registration for operators."""

    async def delete(self, tenant_id: str, content_hash: str) -> None:
        """Remove the object; nothing happens when it is already gone."""


class FilesystemArtifactStore:
    """Objects as files under ``root``, each written to a temporary name, synced and renamed."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, tenant_id: str, content_hash: str) -> Path:
        return self.root / object_key(tenant_id, content_hash)

    async def put(self, tenant_id: str, data: bytes) -> str:
        content_hash = content_hash_of(data)
        await asyncio.to_thread(self._write, self._path(tenant_id, content_hash), data)
        return content_hash

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    async def get(self, tenant_id: str, content_hash: str) -> bytes:
        return await asyncio.to_thread(self._path(tenant_id, content_hash).read_bytes)

    async def location(self, tenant_id: str, content_hash: str) -> str:
        return self._path(tenant_id, content_hash).absolute().as_uri()

    async def delete(self, tenant_id: str, content_hash: str) -> None:
        await asyncio.to_thread(self._path(tenant_id, content_hash).unlink, missing_ok=True)
