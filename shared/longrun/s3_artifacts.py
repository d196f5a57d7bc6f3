"""Artifacts on any S3-compatible service (AWS S3, MinIO, SeaweedFS, Ceph RGW, ...), through obstore.

Objects are keyed as the filesystem store's files are (``longrun.artifacts.object_key``: per tenant,
by SHA-256) under an optional key prefix. Server-side encryption, when configured, is asked for on
every put (SSE-S3 ``AES256``, or SSE-KMS ``aws:kms`` with a key id). Requires the ``s3`` extra
(``longrun-runtime[s3]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import obstore
from obstore.store import S3Store

from longrun.artifacts import content_hash_of, object_key


@dataclass(frozen=True, slots=True)
class S3Location:
    """Where and how the objects are kept; see ``longrun.config.artifacts`` for each field."""

    bucket: str
    region: str
    endpoint: str = ""
    """Empty: AWS S3 of the region."""
    access_key_id: str = ""
    """Empty (with the secret): the environment's credentials (instance role, web identity)."""
    secret_access_key: str = ""
    prefix: str = ""
    encryption: str = ""
    """Empty, ``AES256`` or ``aws:kms``."""
    kms_key_id: str = ""


def client_config(where: S3Location) -> dict[str, Any]:
    """obstore's ``S3Config`` for ``where``."""
    config: dict[str, Any] = {"region": where.region}
    if where.endpoint:
        # Self-hosted services answer at the endpoint's path (http://host:port/bucket/key).
        config |= {"endpoint": where.endpoint, "virtual_hosted_style_request": False}
    if where.access_key_id:
        config |= {"access_key_id": where.access_key_id, "secret_access_key": where.secret_access_key}
    if where.encryption:
        config["server_side_encryption"] = where.encryption
    if where.kms_key_id:
        config["sse_kms_key_id"] = where.kms_key_id
    return config


class S3ArtifactStore:
    def __init__(self, where: S3Location) -> None:
        self.where = where
        self._store = S3Store(where.bucket, prefix=where.prefix.strip("/") or None, config=client_config(where),
                              client_options={"allow_http": where.endpoint.startswith("http://")})

    async def put(self, tenant_id: str, data: bytes) -> str:
        content_hash = content_hash_of(data)
        # Content-addressed: writing the same key again writes the same bytes.
        await obstore.put_async(self._store, object_key(tenant_id, content_hash), data)
        return content_hash

    async def get(self, tenant_id: str, content_hash: str) -> bytes:
        # obstore raises FileNotFoundError for a missing key, as the protocol says.
        result = await obstore.get_async(self._store, object_key(tenant_id, content_hash))
        return bytes(await result.bytes_async())

    async def location(self, tenant_id: str, content_hash: str) -> str:
        prefix = self.where.prefix.strip("/")
        key = object_key(tenant_id, content_hash)
        return f"s3://{self.where.bucket}/{prefix}/{key}" if prefix else f"s3://{self.where.bucket}/{key}"

    async def delete(self, tenant_id: str, content_hash: str) -> None:
        await obstore.delete_async(self._store, object_key(tenant_id, content_hash))
