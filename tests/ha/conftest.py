"""The replicated rows (``make test-ha``): infrastructure of their own, a PostgreSQL primary with a
synchronous standby (``postgres/``) and a three-node RabbitMQ cluster (``rabbitmq/``), each test
on a fresh one, since a failover leaves it changed."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/ha/" in str(item.fspath).replace("\\", "/") and item.get_closest_marker("ha") is None:
            raise pytest.UsageError(f"{item.nodeid}: every replicated row is marked pytest.mark.ha")
