"""Where artifacts are stored: a directory (the default) or an S3-compatible bucket."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, setting

STORES = ("filesystem", "s3")
ENCRYPTIONS = ("", "AES256", "aws:kms")


def _store(raw: str) -> str:
    if raw.strip() not in STORES:
        raise ValueError
    return raw.strip()


def _encryption(raw: str) -> str:
    if raw.strip() not in ENCRYPTIONS:
        raise ValueError
    return raw.strip()


@dataclass(frozen=True)
class ArtifactSettings(Concern):
    """Artifacts: the filesystem or an S3-compatible bucket"""

    artifact_store: str = setting("LONGRUN_ARTIFACT_STORE", _store, "filesystem or s3", "filesystem")
    """Where artifacts (large receipts, attachments, archives) are kept: ``filesystem`` (under
    ``LONGRUN_ARTIFACT_DIR``, a volume every worker, reconciler and gateway mounts) or ``s3`` (a bucket
    of any S3-compatible service, ``LONGRUN_S3_*``; needs the ``longrun-runtime[s3]`` extra)."""
    s3_bucket: str = setting("LONGRUN_S3_BUCKET", str, "a bucket name", "")
    """The bucket artifacts are stored in; required with ``LONGRUN_ARTIFACT_STORE=s3``."""
    s3_endpoint: str = setting("LONGRUN_S3_ENDPOINT", parse.optional_url, "an http(s) URL, or empty", "")
    """The S3 API's URL for a service other than AWS (MinIO, SeaweedFS, Ceph, ...), addressed
    path-style; empty: AWS S3 in ``LONGRUN_S3_REGION``."""
    s3_region: str = setting("LONGRUN_S3_REGION", parse.word, "a region name", "us-east-1")
    """The bucket's region (signed into every request)."""
    s3_access_key_id: str = setting("LONGRUN_S3_ACCESS_KEY_ID", str, "an access key id, or empty", "",
                                    secret=True)
    """Access key id; empty, with an empty secret key: the environment's credentials (instance
    profile, web identity of the pod's service account)."""
    s3_secret_access_key: str = setting("LONGRUN_S3_SECRET_ACCESS_KEY", str, "a secret access key, or empty", "",
                                        secret=True)
    """The access key's secret; set with ``LONGRUN_S3_ACCESS_KEY_ID`` or not at all."""
    s3_prefix: str = setting("LONGRUN_S3_PREFIX", str, "a key prefix, or empty", "")
    """A key prefix for every object (several deployments sharing a bucket); each tenant's objects
    are under ``<prefix>/tenants/<tenant>/``."""
    s3_encryption: str = setting("LONGRUN_S3_ENCRYPTION", _encryption, "empty, AES256 or aws:kms", "")
    """Server-side encryption asked for on every put: ``AES256`` (SSE-S3), ``aws:kms`` (SSE-KMS with
    ``LONGRUN_S3_KMS_KEY_ID``), or empty (the bucket's default)."""
    s3_kms_key_id: str = setting("LONGRUN_S3_KMS_KEY_ID", str, "a KMS key id or ARN, or empty", "")
    """The KMS key objects are encrypted with; required with ``LONGRUN_S3_ENCRYPTION=aws:kms``."""

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Problem]:
        problems: list[Problem] = []
        if values["artifact_store"] == "s3" and not values["s3_bucket"].strip():
            problems.append(("LONGRUN_S3_BUCKET", "missing; expected a bucket name with LONGRUN_ARTIFACT_STORE=s3"))
        if bool(values["s3_access_key_id"]) != bool(values["s3_secret_access_key"]):
            problems.append(("LONGRUN_S3_SECRET_ACCESS_KEY", "expected it set exactly when LONGRUN_S3_ACCESS_KEY_ID "
                                                             "is (or both empty: the environment's credentials)"))
        kms = values["s3_encryption"] == "aws:kms"
        if kms != bool(values["s3_kms_key_id"].strip()):
            problems.append(("LONGRUN_S3_KMS_KEY_ID", "expected a KMS key id exactly when LONGRUN_S3_ENCRYPTION "
                                                      f"is aws:kms (it is {values['s3_encryption'] or 'empty'})"))
        return problems
