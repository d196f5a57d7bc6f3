"""Fixtures of the broker cluster rows: each test gets its own three-node RabbitMQ cluster (its
default vhost is the test's alone) and this session's database on the machine's PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ha.rabbit_cluster import RabbitCluster, available
from tests.ha.servers import of_the_test, session_on
from tests.infra import Infra


@pytest.fixture
def cluster() -> Iterator[RabbitCluster]:
    with of_the_test(RabbitCluster, available=available, prefix="longrun-rabbit-cluster-") as cluster:
        yield cluster


@pytest.fixture
def infra(cluster: RabbitCluster) -> Iterator[Infra]:
    with session_on(amqp_url=cluster.url(), rabbitmqctl=False, management_url=cluster.management_url()) as ready:
        yield ready
