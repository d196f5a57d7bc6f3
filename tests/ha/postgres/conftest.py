"""Fixtures of the database failover rows: each test gets its own PostgreSQL pair.

A failover leaves the old primary dead and the standby promoted, so nothing is shared between
tests: ``infra`` here is a fresh pair with this session's database on it (migrated), and the
machine's own broker with a vhost of its own.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.ha.pg_pair import PgPair, available
from tests.infra import Infra, find_infra


@pytest.fixture
def pg_pair() -> Iterator[PgPair]:
    why = available()
    if why:
        pytest.skip(why)
    # Not under pytest's directories: they are private to root, and the servers run as postgres.
    pair = PgPair(Path(tempfile.mkdtemp(prefix="longrun-pg-pair-")))
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def infra(pg_pair: PgPair) -> Iterator[Infra]:
    found = find_infra()
    if isinstance(found, str):
        pytest.exit(found, returncode=3)
    on_pair = replace(found, database_url=pg_pair.url(), pg_ctlcluster=False)
    with on_pair.session(f"lrha_{uuid.uuid4().hex[:10]}") as ready:
        yield ready
