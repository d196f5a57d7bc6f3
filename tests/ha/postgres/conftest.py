"""Fixtures of the database failover rows: each test gets its own PostgreSQL pair.

A failover leaves the old primary dead and the standby promoted, so nothing is shared between
tests: ``infra`` here is a fresh pair with this session's database on it (migrated), and the
machine's own broker with a vhost of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ha.pg_pair import PgPair, available
from tests.ha.servers import of_the_test, session_on
from tests.infra import Infra


@pytest.fixture
def pg_pair() -> Iterator[PgPair]:
    with of_the_test(PgPair, available=available, prefix="longrun-pg-pair-") as pair:
        yield pair


@pytest.fixture
def infra(pg_pair: PgPair) -> Iterator[Infra]:
    with session_on(database_url=pg_pair.url(), pg_ctlcluster=False) as ready:
        yield ready
