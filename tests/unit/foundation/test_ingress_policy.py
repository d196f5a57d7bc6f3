"""The ingress bound's policy, where the scheduler finds the management API, and which policies displace it."""

from __future__ import annotations

import os
import re

import pytest

from bench.common import Knobs
from bench.ensemble import create_message
from bench.recovery import RECOVERY_RUNS
from longrun.bus import topology
from longrun.bus.management import PolicyNotApplied, displacing, management_urls, vhost_of
from longrun.config import Settings

BOUND = topology.ingress_policy(max_length=100, max_bytes=4096)


def test_the_policy_bounds_the_ingress_queue_only_and_nacks_past_the_bound() -> None:
    assert re.search(BOUND.pattern, topology.SCHEDULER_INGRESS_QUEUE)
    assert not any(re.search(BOUND.pattern, q.name) for q in topology.build(partitions=2, delivery_limit=5).queues
                   if q.name != topology.SCHEDULER_INGRESS_QUEUE)
    assert not re.search(BOUND.pattern, "longrun.scheduler.ingress.old")
    assert BOUND.definition == {"max-length": 100, "max-length-bytes": 4096, "overflow": "reject-publish"}


def test_the_management_api_is_each_amqp_node_on_15672_unless_one_is_configured() -> None:
    cluster = "amqp://longrun:p%40ss@mq-0:5672,mq-1/prod"
    assert management_urls("", cluster) == ["http://longrun:p%40ss@mq-0:15672", "http://longrun:p%40ss@mq-1:15672"]
    assert management_urls("", "amqp://127.0.0.1/") == ["http://127.0.0.1:15672"]
    assert management_urls("", "amqps://u:p@mq.example:5671/") == ["https://u:p@mq.example:15671"]
    assert management_urls("https://admin:s@mq-0:443,mq-1:443/rabbit/", cluster) == [
        "https://admin:s@mq-0:443/rabbit", "https://admin:s@mq-1:443/rabbit"]
    assert (vhost_of(cluster), vhost_of("amqp://h/"), vhost_of("amqp://h/a%2Fb")) == ("prod", "/", "a/b")


def test_an_amqp_port_that_says_nothing_of_the_api_asks_for_its_url() -> None:
    with pytest.raises(PolicyNotApplied, match="set LONGRUN_RABBITMQ_MANAGEMENT_URL"):
        management_urls("", "amqp://guest:guest@127.0.0.1:5681,127.0.0.1:5682/")


def test_a_matching_policy_of_equal_or_higher_priority_displaces_the_bound_and_no_other_does() -> None:
    policies = [
        {"name": BOUND.name, "pattern": BOUND.pattern, "apply-to": "queues", "priority": BOUND.priority},
        {"name": "ha-everything", "pattern": ".*", "apply-to": "all", "priority": 0},
        {"name": "exchanges", "pattern": ".*", "apply-to": "exchanges", "priority": 99},
        {"name": "workers", "pattern": r"^longrun\.worker\.", "apply-to": "queues", "priority": 50},
        {"name": "tie", "pattern": "ingress", "apply-to": "queues", "priority": BOUND.priority},
        {"name": "over", "pattern": "^longrun\\.", "priority": 20},
    ]
    assert displacing(BOUND, topology.SCHEDULER_INGRESS_QUEUE, policies) == ["tie", "over"]
    assert displacing(BOUND, topology.SCHEDULER_INGRESS_QUEUE, policies[:4]) == []


def test_the_default_bound_is_far_above_the_benchs_largest_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("BENCH_")]:
        monkeypatch.delenv(name)
    burst = max(Knobs.from_env().runs, RECOVERY_RUNS)
    size = len(create_message(f"sat-abcdef-{burst:06d}", Knobs.from_env().steps, user="bench").body)
    defaults = Settings.from_env({})
    assert burst == 1000 and size < 1024
    assert burst * 10 <= defaults.ingress_max_length and burst * size * 10 <= defaults.ingress_max_bytes
