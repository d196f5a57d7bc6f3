"""schemas/asyncapi.yaml: generated from the models, public only, resolvable, and valid for the reference parser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from longrun.bus import asyncapi, topology
from longrun.domain import TERMINAL, RunStatus
from longrun.envelope import LATEST, PAYLOADS, make

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = ROOT / "schemas" / "asyncapi.yaml"
CONTRACT = ROOT / "tests" / "contract"
VALIDATOR = CONTRACT / "validate-asyncapi.mjs"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(asyncapi.render())


def test_the_committed_document_matches_the_models() -> None:
    assert DOCUMENT.exists(), "schemas/asyncapi.yaml is missing; run `make schemas`"
    assert DOCUMENT.read_text() == asyncapi.render(), (
        "schemas/asyncapi.yaml drifted from the envelope models, run statuses or topology; run `make schemas`")


def test_rendering_is_deterministic() -> None:
    assert asyncapi.render() == asyncapi.render()


def test_only_the_public_channels_are_described(doc: dict[str, Any]) -> None:
    text = asyncapi.render()
    assert "longrun.work" not in text and "run.wakeup" not in text and "RunWakeup" not in text
    assert {name: channel["address"] for name, channel in doc["channels"].items()} == {
        "ingress": "run.create",
        "ingressSignal": "run.signal",
        "runAccepted": "{tenant}.run.accepted",
        "runRejected": "{tenant}.run.rejected",
        "runStatus": "{tenant}.run.status.{status}",
        "runNotice": "{tenant}.run.notice.{wait_kind}.{notice}",
        "eventsLog": topology.EVENTS_LOG_QUEUE,
    }
    exchanges = {name: c["bindings"]["amqp"].get("exchange", {}).get("name") for name, c in doc["channels"].items()}
    assert exchanges == {"ingress": topology.INGRESS_EXCHANGE, "ingressSignal": topology.INGRESS_EXCHANGE,
                         "runAccepted": topology.EVENTS_EXCHANGE,
                         "runRejected": topology.EVENTS_EXCHANGE, "runStatus": topology.EVENTS_EXCHANGE,
                         "runNotice": topology.EVENTS_EXCHANGE, "eventsLog": None}
    for channel in doc["channels"].values():
        amqp = channel["bindings"]["amqp"]
        if amqp["is"] == "routingKey":
            assert amqp["exchange"]["type"] == "topic" and amqp["exchange"]["durable"] is True
        else:
            assert amqp["queue"] == {"name": topology.EVENTS_LOG_QUEUE, "durable": True, "exclusive": False,
                                     "autoDelete": False, "vhost": "/"}


def test_every_version_of_run_create_and_run_signal_is_accepted_and_the_newest_events_are_sent(doc: dict[str, Any]) -> None:
    def titles(channel: str) -> set[str]:
        return {doc["components"]["messages"][ref["$ref"].rsplit("/", 1)[1]]["title"]
                for ref in doc["channels"][channel]["messages"].values()}

    assert titles("ingress") == {f"run.create v{v}" for t, v in PAYLOADS if t == "run.create"} \
        == {"run.create v1", "run.create v2", "run.create v3", "run.create v4"}
    assert titles("ingressSignal") == {"run.signal v1"}
    assert titles("runAccepted") == {f"run.accepted v{LATEST['run.accepted']}"} == {"run.accepted v2"}
    assert titles("runRejected") == {f"run.rejected v{LATEST['run.rejected']}"} == {"run.rejected v3"}
    assert titles("runStatus") == {f"run.event v{LATEST['run.event']}"} == {"run.event v3"}
    assert titles("runNotice") == {f"run.notice v{LATEST['run.notice']}"} == {"run.notice v1"}
    assert titles("eventsLog") == {"run.accepted v2", "run.rejected v3", "run.event v3", "run.notice v1"}
    actions = {name: (op["action"], op["channel"]["$ref"]) for name, op in doc["operations"].items()}
    assert actions == {"receiveRunCreate": ("receive", "#/channels/ingress"),
                       "receiveRunSignal": ("receive", "#/channels/ingressSignal"),
                       "sendRunAccepted": ("send", "#/channels/runAccepted"),
                       "sendRunRejected": ("send", "#/channels/runRejected"),
                       "sendRunStatus": ("send", "#/channels/runStatus"),
                       "sendRunNotice": ("send", "#/channels/runNotice")}
    assert all(op["bindings"]["amqp"]["deliveryMode"] == 2 for op in doc["operations"].values())


def test_the_status_parameter_lists_every_status_in_lower_case(doc: dict[str, Any]) -> None:
    status = doc["components"]["parameters"]["status"]
    assert status["enum"] == [s.value.lower() for s in RunStatus]
    assert set(status["x-terminal"]) == {s.value.lower() for s in TERMINAL}
    template = doc["channels"]["runStatus"]["address"]
    for s in RunStatus:  # the routing key the code publishes fills the documented address
        assert topology.status_key("acme", s.value) == template.format(tenant="acme", status=s.value.lower())


def test_sent_messages_declare_the_cloudevents_headers(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    event = schemas["RunEventV3Headers"]
    assert {"cloudEvents:specversion", "cloudEvents:id", "cloudEvents:type", "cloudEvents:source",
            "cloudEvents:time", "schema_version", "tenant_id"} <= set(event["required"])
    assert set(event["properties"]) == {"cloudEvents:specversion", "cloudEvents:id", "cloudEvents:type",
                                        "cloudEvents:source", "cloudEvents:subject", "cloudEvents:time",
                                        "schema_version", "tenant_id", "traceparent", "longrun-run-trace"}
    assert event["properties"]["cloudEvents:type"]["const"] == "run.event"
    assert event["properties"]["schema_version"]["const"] == 3
    assert "required" not in schemas["RunCreateV2Headers"]  # a producer's headers are optional


def test_every_reference_resolves(doc: dict[str, Any]) -> None:
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs and not any("$defs" in ref for ref in refs)
    for ref in refs:
        assert ref.startswith("#/"), ref
        target: Any = doc
        for part in ref[2:].split("/"):
            assert part in target, f"{ref} does not resolve"
            target = target[part]


def test_a_real_run_event_validates_against_the_documented_schema(doc: dict[str, Any]) -> None:
    envelope = make("run.event", {
        "seq": 7, "event_type": "run.status_changed", "status": "COMPLETED",
        "data": {"from": "RUNNING", "stage": "done", "reason": "ok"}, "labels": {"team": "a"},
        "outcome": {"status": "COMPLETED", "terminal_reason": "done",
                    "acceptance": {"evidence": {"tests": "green"}, "unmet": []},
                    "receipts": [{"logical_action": "open_pr", "tool": "forge", "external_id": "42",
                                  "fields": {"url": "http://forge/pr/42"}}],
                    "summary": {"status": "COMPLETED", "terminal_reason": "done",
                                "done": [{"logical_action": "open_pr", "tool": "forge", "status": "CONFIRMED",
                                          "external_id": "42"}],
                                "used": {"model_calls": 3, "tool_calls": 2, "cost": 0.25},
                                "duration_seconds": 93.5}}},
        producer="scheduler", tenant_id="acme", run_id="run-1", correlation_id="key-1")
    body = json.loads(envelope.model_dump_json())
    validator = jsonschema.Draft202012Validator({"$ref": "#/components/schemas/RunEventV3Envelope",
                                                 "components": doc["components"]})
    validator.validate(body)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**body, "schema_version": 1})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**body, "tenant_id": "a.b"})


# -- the reference parser (@asyncapi/parser, tests/contract) -------------------------------------------

def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: the AsyncAPI document is checked with @asyncapi/parser")
    if not (CONTRACT / "node_modules" / "@asyncapi" / "parser").is_dir():
        pytest.fail("tests/contract/node_modules is missing: run `make node-deps` (npm ci in tests/contract)")
    return subprocess.run([node, str(VALIDATOR), str(path)], check=False, capture_output=True, text=True,
                          timeout=60)


def test_the_reference_parser_accepts_the_document() -> None:
    result = _validate(DOCUMENT)
    assert result.returncode == 0, f"@asyncapi/parser refused schemas/asyncapi.yaml:\n{result.stdout}{result.stderr}"
    assert "VALID" in result.stdout


def test_the_reference_parser_refuses_a_broken_document(tmp_path: Path) -> None:
    text = DOCUMENT.read_text()
    assert "#/components/schemas/RunEventV3Envelope" in text
    broken = tmp_path / "asyncapi.yaml"
    broken.write_text(text.replace("#/components/schemas/RunEventV3Envelope", "#/components/schemas/NoSuchSchema"))
    result = _validate(broken)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error invalid-ref" in result.stdout and "NoSuchSchema" in result.stdout
