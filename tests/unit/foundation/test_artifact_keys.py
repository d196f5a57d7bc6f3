"""Where an artifact lives in a store: under its tenant's prefix (or the runtime's), named by its SHA-256."""

from __future__ import annotations

import hashlib

import pytest

from longrun.artifacts import RUNTIME, object_key


def test_an_object_key_cannot_escape_its_tenants_prefix() -> None:
    content_hash = hashlib.sha256(b"x").hexdigest()
    assert object_key("acme", content_hash) == f"tenants/acme/{content_hash[:2]}/{content_hash}"
    assert object_key(RUNTIME, content_hash) == f"runtime/{content_hash[:2]}/{content_hash}"
    for tenant, named in (("../globex", content_hash), ("a/b", content_hash), ("acme", "../" + content_hash[3:]),
                          ("acme", content_hash.upper())):
        with pytest.raises(ValueError, match="tenant id|SHA-256"):
            object_key(tenant, named)
