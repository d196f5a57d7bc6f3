"""Generated artefacts match their source: JSON Schemas and the RabbitMQ definitions."""

from __future__ import annotations

import json
from pathlib import Path

from longrun.bus import topology
from longrun.config.bus import BusSettings
from longrun.config.declaration import declared_variable
from longrun.envelope.export import render

ROOT = Path(__file__).resolve().parents[3]


def test_schemas_match_the_models() -> None:
    expected = render()
    on_disk = {p.name: p.read_text() for p in (ROOT / "schemas").glob("*.schema.json")}
    assert sorted(on_disk) == sorted(expected), "run `make schemas`"
    drifted = [name for name, text in expected.items() if on_disk[name] != text]
    assert drifted == [], f"schemas drifted from the models: {drifted}; run `make schemas`"


def test_rabbitmq_definitions_match_the_declared_topology() -> None:
    on_disk = (ROOT / "infra/rabbitmq/definitions.json").read_text()
    expected = topology.render_definitions(partitions=8, delivery_limit=5, **_INGRESS_BOUND)
    assert on_disk == expected, "run `make topology`"


_INGRESS_BOUND = {"ingress_max_length": int(declared_variable(BusSettings, "ingress_max_length").default or 0),
                  "ingress_max_bytes": int(declared_variable(BusSettings, "ingress_max_bytes").default or 0)}


def test_the_definitions_bound_the_ingress_queue_by_a_policy_of_the_default_bound() -> None:
    definitions = json.loads((ROOT / "infra/rabbitmq/definitions.json").read_text())
    assert definitions["policies"] == [{
        "name": "longrun-ingress-bound", "vhost": "/", "pattern": "^longrun\\.scheduler\\.ingress$",
        "apply-to": "queues", "priority": 10,
        "definition": {"max-length": _INGRESS_BOUND["ingress_max_length"],
                       "max-length-bytes": _INGRESS_BOUND["ingress_max_bytes"], "overflow": "reject-publish"}}]
    # the queue keeps the arguments it was always declared with: none of them is a bound
    ingress = next(q for q in definitions["queues"] if q["name"] == "longrun.scheduler.ingress")
    assert not {"x-max-length", "x-max-length-bytes"} & set(ingress["arguments"])


def test_every_partition_queue_is_a_quorum_queue_with_sac_a_delivery_limit_and_quarantine() -> None:
    definitions = json.loads((ROOT / "infra/rabbitmq/definitions.json").read_text())
    partition_queues = [q for q in definitions["queues"] if ".p" in q["name"]]
    assert [q["name"] for q in partition_queues] == [f"longrun.worker.p{k}" for k in range(8)]
    for queue in partition_queues:
        assert queue["arguments"] == {
            "x-queue-type": "quorum", "x-single-active-consumer": True, "x-delivery-limit": 5,
            "x-dead-letter-exchange": "longrun.quarantine", "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish"}


def test_partitioning_is_stable_and_spreads_runs() -> None:
    assert topology.partition_of("run-1", 8) == topology.partition_of("run-1", 8)
    # Pinned: a change here reroutes every existing run, which needs a migration.
    assert [topology.partition_of(f"run-{i}", 8) for i in range(8)] == _PINNED
    counts = [0] * 8
    for i in range(8000):
        counts[topology.partition_of(f"run-{i}", 8)] += 1
    assert min(counts) > 800


_PINNED = [3, 7, 4, 1, 0, 0, 3, 4]
