"""Content-addressed artifacts: large tool outputs (logs, diffs) live outside events and rows.

Upload first, then register: the bytes are written (atomically, under their SHA-256)
before the transaction that references them commits, so a committed reference never
points at nothing. A failed transaction leaves an unregistered file behind; the
orphan sweep removes such files once they are older than a grace period. The
filesystem store is the default; an S3-compatible store implements the same protocol. The
references live in PostgreSQL (``longrun.db.artifacts``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Protocol

INLINE_LIMIT = 4096
"""Receipts larger than this (as JSON) are stored as an artifact and referenced by hash."""


class ArtifactStore(Protocol):
    async def put(self, data: bytes) -> str:
        """Store ``data``; return its SHA-256 hex. Idempotent."""

    async def get(self, content_hash: str) -> bytes: ...

    async def location(self, content_hash: str) -> str: ...

    async def stored_before(self, epoch: float) -> list[str]:
        """Hashes of objects written before ``epoch`` (orphan sweep candidates)."""

    async def delete(self, content_hash: str) -> None: ...


class FilesystemArtifactStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, content_hash: str) -> Path:
        return self.root / content_hash[:2] / content_hash[2:4] / content_hash

    async def put(self, data: bytes) -> str:
        content_hash = hashlib.sha256(data).hexdigest()
        await asyncio.to_thread(self._write, content_hash, data)
        return content_hash

    def _write(self, content_hash: str, data: bytes) -> None:
        path = self._path(content_hash)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{content_hash}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    async def get(self, content_hash: str) -> bytes:
        return await asyncio.to_thread(self._path(content_hash).read_bytes)

    async def location(self, content_hash: str) -> str:
        return self._path(content_hash).as_uri()

    async def stored_before(self, epoch: float) -> list[str]:
        def scan() -> list[str]:
            if not self.root.exists():
                return []
            return [p.name for p in self.root.glob("*/*/*") if not p.name.startswith(".")
                    and p.stat().st_mtime < epoch]

        return await asyncio.to_thread(scan)

    async def delete(self, content_hash: str) -> None:
        await asyncio.to_thread(self._path(content_hash).unlink, missing_ok=True)
