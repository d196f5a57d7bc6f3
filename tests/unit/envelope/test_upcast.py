"""Upcasters are pure and pinned by golden files: v1 on the wire decodes as the newest version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longrun.envelope import LATEST, decode
from longrun.envelope.upcast import UPCASTERS, upcast_run_create_v1_v2, upcast_run_rejected_v1_v2

GOLDEN = Path(__file__).parent.parent / "golden"


def test_run_create_v1_upcasts_to_v2_exactly_as_recorded() -> None:
    v1 = json.loads((GOLDEN / "run.create.v1.json").read_text())
    expected = json.loads((GOLDEN / "run.create.v1-as-v2.json").read_text())
    decoded = decode(json.dumps(v1).encode())
    assert decoded.schema_version == LATEST["run.create"] == 2
    assert decoded.model_dump(mode="json") == expected


def test_upcasters_do_not_mutate_their_input() -> None:
    payload = {"workflow": "w", "idempotency_key": "k", "budget_usd": 3.5}
    before = dict(payload)
    assert upcast_run_create_v1_v2(payload)["budget"] == {"cost_usd": 3.5}
    assert payload == before


@pytest.mark.parametrize("key", sorted(UPCASTERS))
def test_every_upcaster_has_a_golden_file(key: tuple[str, int]) -> None:
    type_, version = key
    assert (GOLDEN / f"{type_}.v{version}.json").exists()


@pytest.mark.parametrize(("type_", "old", "latest"),
                         [("run.event", 1, 3), ("run.event", 2, 3), ("run.rejected", 1, 2)])
def test_older_broadcasts_upcast_to_the_newest_exactly_as_recorded(type_: str, old: int, latest: int) -> None:
    recorded = json.loads((GOLDEN / f"{type_}.v{old}.json").read_text())
    expected = json.loads((GOLDEN / f"{type_}.v{old}-as-v{latest}.json").read_text())
    decoded = decode(json.dumps(recorded).encode())
    assert decoded.schema_version == LATEST[type_] == latest
    assert decoded.model_dump(mode="json") == expected


def test_a_v1_refusal_gets_the_code_its_hashes_tell() -> None:
    reused = upcast_run_rejected_v1_v2({"idempotency_key": "k", "reason": "r", "recorded_input_hash": "a",
                                        "offered_input_hash": "b", "existing_run_id": "run-1"})
    unknown = upcast_run_rejected_v1_v2({"idempotency_key": "k", "reason": "unknown run kind 'x'"})
    assert (reused["code"], unknown["code"]) == ("idempotency_key_reused", "unknown_workflow")
