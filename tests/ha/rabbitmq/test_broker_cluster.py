"""Rows: a node of a three-node RabbitMQ cluster is SIGKILLed, or cut off from the other two,
under a steady load of runs.

The partition queues are quorum queues with a member on every node, so the two nodes left elect
new leaders and keep every message. Every service holds the whole cluster's address
(``amqp://…@node-a,node-b,node-c/``): a service whose node died or paused (``pause_minority``
closes a minority node's listeners) reconnects to another node, rebuilds its consumers and goes on,
with no restart. Each protected row ends in the invariant checker: every run completes, no external
effect twice, per-run event order intact, every create the producer saw confirmed has its run.

Every service starts on the failing node (it is first in their address). With a protection
switched off the row fails, so it depends on the protection, not on luck: given the failing node's
address alone, the runs do not complete while that node is away; with publisher confirms switched
off (``LONGRUN_PROTECTIONS_OFF``), what the cut-off node took before it paused is lost and runs never
complete. (A SIGKILLed node loses only what was in its socket at that instant: the kill row does not
show what confirms protect, the cut-off row does.)

A cut-off node that is still paused a minute after the heal is restarted, as a liveness probe would
restart it: this RabbitMQ (3.10) sometimes leaves a paused node paused after its partition healed.
What the rows prove is the services' part, and that holds either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from tests.fault.scenario import EVERYTHING, Scenario
from tests.ha.load import NOMINAL, all_completed, steady
from tests.ha.rabbit_cluster import Node, RabbitCluster

pytestmark = [pytest.mark.ha, pytest.mark.fault, pytest.mark.integration]

AWAY = 25.0
"""Seconds the node stays away: longer than the net tick (10 s), so a cut-off node pauses."""
RESUME = 60.0
"""Seconds a paused node has to resume by itself once the cut is healed."""
logger = logging.getLogger(__name__)
PROTECTED, ONE_ADDRESS, NO_CONFIRMS = "every node's address", "the failing node's address alone", "publisher confirms off"
PROTECTIONS = pytest.mark.parametrize("protection", [PROTECTED, ONE_ADDRESS])
WITH_CONFIRMS = pytest.mark.parametrize("protection", [PROTECTED, ONE_ADDRESS, NO_CONFIRMS])


def _busiest(cluster: RabbitCluster) -> Node:
    """The node leading most of the quorum queues."""
    led = Counter(cluster.leaders("/").values())
    name = led.most_common(1)[0][0]
    return next(node for node in cluster.nodes if node.name == name)


def _environment(cluster: RabbitCluster, victim: Node, protection: str) -> dict[str, str]:
    """Every service starts on the failing node (it is first in their address), so what it had not
    yet handed on when it went away is at stake."""
    if protection == ONE_ADDRESS:
        return {"LONGRUN_AMQP_URL": cluster.url(nodes=[victim])}
    address = {"LONGRUN_AMQP_URL": cluster.url(nodes=[victim, *(n for n in cluster.nodes if n is not victim)])}
    if protection == NO_CONFIRMS:
        return {**address, "LONGRUN_PROTECTIONS_OFF": "publisher-confirms"}
    return address


async def _node_away(scenario: Scenario, cluster: RabbitCluster, protection: str,
                     away: Callable[[Node], None], back: Callable[[Node], Awaitable[None]]) -> None:
    # Given the whole ensemble on the cluster, every partition queue with a member on each node
    victim = _busiest(cluster)
    await scenario.up(*EVERYTHING, ci_delay=0.5, **_environment(cluster, victim, protection))
    for queue in cluster.leaders("/"):
        assert sorted(cluster.members("/", queue)) == sorted(n.name for n in cluster.nodes), queue
    keys: list[str] = []
    await steady(scenario, 4, keys)
    # When the node leading most queues goes away under the load, and runs keep coming
    away(victim)
    await steady(scenario, 6, keys)
    completed, statuses = await all_completed(scenario, keys, timeout=AWAY)
    if protection == ONE_ADDRESS:
        # Then, with that node's address alone, nothing completes while it is away
        assert not completed, "the load completed with the failing node's address alone: this row proves nothing"
        await back(victim)
        return
    if protection == NO_CONFIRMS:
        # Then, without confirms, what the node took before it went away is lost for good
        await back(victim)
        completed, statuses = await all_completed(scenario, keys, timeout=60)
        assert not completed, "every run completed without publisher confirms: this row proves nothing"
        logger.info("without publisher confirms, runs stopped: %s", Counter(statuses.values()))
        return
    # Then, with no service restarted, every run completes while it is away
    assert completed, statuses
    assert all(p.alive() for p in scenario.services.started), [p.name for p in scenario.services.started
                                                              if not p.alive()]
    # and when it is back, it rejoins, and the checker finds one effect per intent and nothing else
    await back(victim)
    await steady(scenario, 2, keys)
    completed, statuses = await all_completed(scenario, keys, timeout=60)
    assert completed, statuses
    assert dict(await scenario.forge_counts()) == {kind: n * len(keys) for kind, n in NOMINAL.items()}
    await scenario.finish()


@PROTECTIONS
async def test_the_node_leading_most_queues_killed_and_restarted_loses_nothing(
        scenario: Scenario, cluster: RabbitCluster, protection: str) -> None:
    async def restarted(node: Node) -> None:
        await asyncio.to_thread(cluster.start_node, node)
        await asyncio.to_thread(cluster.wait_node, node)

    await _node_away(scenario, cluster, protection, cluster.kill, restarted)


@WITH_CONFIRMS
@pytest.mark.timeout(420)
async def test_a_node_cut_off_from_the_other_two_pauses_and_rejoins_losing_nothing(
        scenario: Scenario, cluster: RabbitCluster, protection: str) -> None:
    async def healed(node: Node) -> None:
        cluster.heal()
        try:
            await scenario.poll(lambda: asyncio.to_thread(cluster.node_running, node), timeout=RESUME,
                                what=f"{node.name} running again after the heal")
        except AssertionError:
            # A paused node of this RabbitMQ sometimes stays paused after the heal: restarted, as a
            # liveness probe would, it rejoins the cluster like any node coming back.
            logger.warning("%s did not resume within %ss of the heal; restarted. Its log:\n%s", node.name,
                           RESUME, cluster.log_tail(node))
            await asyncio.to_thread(cluster.restart, node)

    await _node_away(scenario, cluster, protection, cluster.cut_off, healed)
