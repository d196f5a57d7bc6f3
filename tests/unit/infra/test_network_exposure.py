"""What the compose file publishes (on this machine only) and what the rendered Kubernetes overlays
expose: the Ingress (TLS, webhooks to the gateway's webhook port, the rest to its API port), the
NetworkPolicies (everything denied but what each pod needs; a policy that allows all is caught) and
the gateway's disruption budget, asserted on the manifests' content."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.infra.test_deployment_files import OVERLAYS, compose, of_kind, pod_env, rendered

WITH_INGRESS = ("prod", "autoscale", "monitoring")
INFRASTRUCTURE_PORTS = {("UDP", 53), ("TCP", 53), ("TCP", 5432), ("TCP", 5672)}
MANAGEMENT_API = ("TCP", 15672)
"""RabbitMQ's management API: the scheduler sets the ingress queue's bound through it."""


def _ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule.get("ports", [])}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _namespaces(rule: dict[str, Any], direction: str) -> set[str]:
    peers = rule.get(direction, [])
    return {peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in peers}


def policy_problems(docs: tuple[dict[str, Any], ...]) -> list[str]:
    """Why the policies of ``docs`` do not hold every longrun pod to what it needs; empty when they do."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in docs if d["kind"] in ("Deployment", "Job")}
    problems = []
    deny = [p for p in policies if set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
            and not p["spec"].get("ingress") and not p["spec"].get("egress")]
    problems += [f"{name}: no policy denies its traffic by default" for name, labels in pods.items()
                 if not any(_selects(p["spec"]["podSelector"], labels) for p in deny)]
    for policy in policies:
        name = policy["metadata"]["name"]
        if not policy["spec"]["podSelector"]:
            problems.append(f"{name} selects every pod of the namespace")
        for rule in policy["spec"].get("ingress", []):
            if not rule.get("from") or not rule.get("ports"):
                problems.append(f"{name} lets any peer in, or on any port: {rule}")
        for rule in policy["spec"].get("egress", []):
            if not rule.get("ports"):
                problems.append(f"{name} lets its pods out on any port: {rule}")
            elif not rule.get("to") and not _ports(rule) <= INFRASTRUCTURE_PORTS | {("TCP", 443), MANAGEMENT_API}:
                problems.append(f"{name} lets its pods out to anywhere on {sorted(_ports(rule))}")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_denied_all_traffic_but_what_a_policy_opens(overlay: str) -> None:
    assert policy_problems(rendered(overlay)) == []


@pytest.mark.parametrize("allow_all", [
    {"ingress": [{}]},
    {"ingress": [{"from": [{"namespaceSelector": {}}]}]},
    {"egress": [{}]},
    {"egress": [{"ports": [{"protocol": "TCP", "port": 22}]}]},
])
def test_a_policy_that_lets_everything_through_is_caught(allow_all: dict[str, Any]) -> None:
    docs = copy.deepcopy(rendered("prod"))
    opened = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "open"},
              "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "longrun"}},
                       "policyTypes": ["Ingress", "Egress"], **allow_all}}
    assert policy_problems((*docs, opened)) != []
    assert policy_problems(tuple(d for d in docs if d["metadata"]["name"] != "longrun-default-deny")) != []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_ingress_controller_reaches_the_gateway_and_only_monitoring_the_health_ports(overlay: str) -> None:
    policies = of_kind(overlay, "NetworkPolicy")
    deployments = of_kind(overlay, "Deployment")
    reached: dict[tuple[str, int], set[str]] = {}
    for name, labels in ((n, d["spec"]["template"]["metadata"]["labels"]) for n, d in deployments.items()):
        for policy in policies.values():
            if _selects(policy["spec"]["podSelector"], labels):
                for rule in policy["spec"].get("ingress", []):
                    for port in _ports(rule):
                        reached.setdefault((name, port[1]), set()).update(_namespaces(rule, "from"))
    gateway = deployments["longrun-gateway"]["spec"]["template"]["spec"]
    env = pod_env(overlay, gateway, gateway["containers"][0])
    api, hooks = int(env["LONGRUN_GATEWAY_PORT"]), int(env["LONGRUN_WEBHOOK_PORT"])
    assert reached.pop(("longrun-gateway", api)) == reached.pop(("longrun-gateway", hooks)) == {"ingress-nginx"}
    assert reached == {(name, int(env["LONGRUN_HEALTH_PORT"])): {"monitoring"} for name in deployments}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_services_that_call_far_sides_go_out_over_https(overlay: str) -> None:
    policies = of_kind(overlay, "NetworkPolicy").values()
    out: dict[str, set[tuple[str, int]]] = {}
    for name, deployment in of_kind(overlay, "Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        out[name] = {port for p in policies if _selects(p["spec"]["podSelector"], labels)
                     for rule in p["spec"].get("egress", []) for port in _ports(rule)}
    https = {name for name, ports in out.items() if ("TCP", 443) in ports}
    assert https == {"longrun-worker", "longrun-reconciler", "longrun-gateway"}
    # and only the scheduler reaches the broker's management API
    assert {name for name, ports in out.items() if MANAGEMENT_API in ports} == {"longrun-scheduler"}
    assert all(ports - {("TCP", 443), MANAGEMENT_API} == INFRASTRUCTURE_PORTS for ports in out.values())


@pytest.mark.parametrize("overlay", WITH_INGRESS)
def test_the_ingress_ends_tls_and_routes_webhooks_to_their_own_port(overlay: str) -> None:
    (ingress,) = of_kind(overlay, "Ingress").values()
    (rule,) = ingress["spec"]["rules"]
    assert [rule["host"]] == ingress["spec"]["tls"][0]["hosts"] and ingress["spec"]["tls"][0]["secretName"]
    routes = {p["path"]: p["backend"]["service"] for p in rule["http"]["paths"]}
    assert routes == {"/webhooks/": {"name": "longrun-gateway", "port": {"name": "webhooks"}},
                      "/": {"name": "longrun-gateway", "port": {"name": "http"}}}
    service = of_kind(overlay, "Service")["longrun-gateway"]
    gateway = of_kind(overlay, "Deployment")["longrun-gateway"]["spec"]["template"]["spec"]
    container = {p["name"]: p["containerPort"] for p in gateway["containers"][0]["ports"]}
    env = pod_env(overlay, gateway, gateway["containers"][0])
    targets = {p["name"]: container[p["targetPort"]] for p in service["spec"]["ports"]}
    assert targets == {"http": int(env["LONGRUN_GATEWAY_PORT"]), "webhooks": int(env["LONGRUN_WEBHOOK_PORT"])}


def test_the_dev_overlay_has_no_ingress() -> None:
    assert of_kind("dev", "Ingress") == {}


def test_compose_publishes_the_broker_and_the_gateway_on_this_machine_only() -> None:
    published = {name: service.get("ports", []) for name, service in compose()["services"].items()}
    assert "127.0.0.1:5672:5672" in published["rabbitmq"]
    assert all(port.startswith("127.0.0.1:") for ports in published.values() for port in ports), published
