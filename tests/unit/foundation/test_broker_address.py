"""A cluster's nodes in one AMQP address: each node gets the credentials, vhost and options."""

from __future__ import annotations

import pytest

from longrun.bus.connection import node_urls


def test_a_clusters_nodes_share_credentials_vhost_and_options() -> None:
    assert node_urls("amqp://u:p%2Cw@mq-a:5672,mq-b:5673, mq-c/prod?heartbeat=10") == [
        "amqp://u:p%2Cw@mq-a:5672/prod?heartbeat=10", "amqp://u:p%2Cw@mq-b:5673/prod?heartbeat=10",
        "amqp://u:p%2Cw@mq-c/prod?heartbeat=10"]


def test_a_single_node_is_itself() -> None:
    assert node_urls("amqps://guest:guest@127.0.0.1:5671/") == ["amqps://guest:guest@127.0.0.1:5671/"]


@pytest.mark.parametrize("url", ["http://x", "amqp://u@a,,b/v", "amqp://u@/v"])
def test_a_malformed_address_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match="amqp"):
        node_urls(url)
