"""Fixtures of the broker cluster rows: each test gets its own three-node RabbitMQ cluster (its
default vhost is the test's alone) and this session's database on the machine's PostgreSQL."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.ha.rabbit_cluster import RabbitCluster, available
from tests.infra import Infra, find_infra


@pytest.fixture
def cluster() -> Iterator[RabbitCluster]:
    why = available()
    if why:
        pytest.skip(why)
    cluster = RabbitCluster(Path(tempfile.mkdtemp(prefix="longrun-rabbit-cluster-")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def infra(cluster: RabbitCluster) -> Iterator[Infra]:
    found = find_infra()
    if isinstance(found, str):
        pytest.exit(found, returncode=3)
    on_cluster = replace(found, amqp_url=cluster.url(), rabbitmqctl=False)
    with on_cluster.session(f"lrha_{uuid.uuid4().hex[:10]}") as ready:
        yield ready
