"""The deployment files are correct by construction: no Docker engine or cluster needed.

docker-compose.yml and the kustomize tree are parsed and checked against the project itself
(Settings, pyproject.toml, the generated RabbitMQ definitions; the Dockerfile in test_dockerfile.py); every
rendered Kubernetes overlay is validated offline against the bundled Kubernetes 1.30 schemas, and the
Prometheus Operator's kinds (PrometheusRule, PodMonitor) against their CRDs' schemas (``schemas/``).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import longrun
from longrun import monitoring
from longrun.config import Settings
from longrun_dependency_upgrade import FORGE_URL
from tests.unit.infra.dockerfile import stages

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "infra/k8s"
OVERLAYS = ("dev", "prod", "prod-s3", "autoscale", "monitoring")
DEFAULTS = Settings.from_env({})
STOP_MARGIN = 5
"""Seconds a worker needs after its stop grace (handing its runs on, acking, leaving) before it is killed."""
K8S_VERSION = "1.30.0"
IMAGE = "ghcr.io/longrun/longrun"
EXAMPLE_IMAGE = "ghcr.io/longrun/longrun-example"
"""The Dockerfile's example target: the runtime image and the example agent, which compose runs."""
# compose / Deployment name -> Python package under services/
SERVICES = {"scheduler": "scheduler", "worker": "worker", "timer": "timer",
            "reconciler": "reconciler", "outbox-relay": "outbox_relay", "gateway": "gateway"}
CRD_KINDS = {"ScaledObject", "TriggerAuthentication"}  # KEDA: no bundled schema, only warned
OPERATOR_SCHEMAS = {kind: json.loads((Path(__file__).parent / "schemas" / f"{kind.lower()}.json").read_text())
                    for kind in ("PrometheusRule", "PodMonitor")}
"""The Prometheus Operator's kinds: checked against their CRDs' schemas."""
KNOWN = {*Settings.variables(), FORGE_URL}
"""Every setting of the core, and the example agent's forge (the example image installs it)."""
LONGRUN_NAME = re.compile(r"\bLONGRUN_[A-Z0-9_]+\b")


# --- helpers -------------------------------------------------------------------------------

@functools.cache
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # resolves anchors and <<


@functools.cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def partitions_in_definitions() -> tuple[int, int]:
    """(P, delivery limit) the broker definitions were generated with."""
    queues = json.loads((ROOT / "infra/rabbitmq/definitions.json").read_text())["queues"]
    worker = [q for q in queues if re.fullmatch(r"longrun\.worker\.p\d+", q["name"])]
    return len(worker), worker[0]["arguments"]["x-delivery-limit"]


def runnable(command: list[str]) -> str | None:
    """Why ``command`` would not start (None when it names a real module or console script).

    ``python -m longrun.services.x`` needs ``services/x/__main__.py`` (the package ``longrun.services``
    is the folder services/) and a ``longrun.services.x.main:main`` console script beside it.
    """
    scripts = pyproject()["project"]["scripts"]
    if command[:2] != ["python", "-m"]:
        return None if command[0] in scripts else f"{command[0]!r} is no console script"
    module = command[2]
    if module.startswith("longrun.services."):
        package = ROOT / "services" / module.removeprefix("longrun.services.").replace(".", "/")
        if not (package / "__main__.py").is_file():
            return f"{package} has no __main__.py"
        targets = {v.split(":")[0] for v in scripts.values()}
        return None if f"{module}.main" in targets else f"{module}.main is no console script's target"
    # The core, and the example distributions the example image installs beside it.
    for root in (ROOT / "shared", *(ROOT / "examples").iterdir()):
        path = root / module.replace(".", "/")
        if path.with_suffix(".py").is_file() or (path / "__main__.py").is_file():
            return None
    return f"no module {module}"


def longrun_services() -> dict[str, dict[str, Any]]:
    return {name: compose()["services"][name] for name in SERVICES}


# --- docker-compose.yml --------------------------------------------------------------------

def test_compose_lists_the_infrastructure_the_migration_the_demo_forge_and_the_six_services() -> None:
    assert set(compose()["services"]) == {"postgres", "rabbitmq", "migrate", "forge", *SERVICES}


def test_compose_services_start_after_the_migration_and_a_healthy_broker() -> None:
    services = compose()["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["restart"] == "no"
    assert services["postgres"]["healthcheck"]["test"][1] == "pg_isready"
    assert services["rabbitmq"]["healthcheck"]["test"][1:] == ["rabbitmq-diagnostics", "-q", "ping"]
    for name, svc in longrun_services().items():
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert svc["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name
        assert svc["restart"] == "unless-stopped", name
        assert svc["stop_grace_period"], name


def test_compose_images_match_the_required_versions() -> None:
    services = compose()["services"]
    assert services["postgres"]["image"] == "postgres:15"
    assert services["rabbitmq"]["image"] in ("rabbitmq:3.10", "rabbitmq:3.10-management")
    for name in ("migrate", "forge", *SERVICES):
        assert services[name]["image"].startswith(EXAMPLE_IMAGE + ":"), name
        assert services[name]["build"] == {"context": ".", "target": "example"}, name


def test_compose_broker_keeps_a_user_the_services_can_log_in_with() -> None:
    """Definitions loaded at boot replace the default user unless they bring their own users."""
    rabbit = compose()["services"]["rabbitmq"]
    mounts = " ".join(rabbit.get("volumes", [])) + json.dumps(rabbit.get("environment", {}))
    if "definitions" in mounts:
        assert "users" in json.loads((ROOT / "infra/rabbitmq/definitions.json").read_text())
    user, password = rabbit["environment"]["RABBITMQ_DEFAULT_USER"], rabbit["environment"]["RABBITMQ_DEFAULT_PASS"]
    for name, svc in longrun_services().items():
        assert f"amqp://{user}:{password}@rabbitmq:5672/" in svc["environment"]["LONGRUN_AMQP_URL"], name


def test_compose_worker_runs_two_replicas_with_a_longer_grace_and_reaches_the_forge() -> None:
    services = compose()["services"]
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == 2
    assert "container_name" not in worker and "hostname" not in worker  # replicas need distinct names
    forge_port = services["forge"]["command"][services["forge"]["command"].index("--port") + 1]
    assert worker["environment"]["LONGRUN_FORGE_URL"] == f"http://forge:{forge_port}"
    assert "--host" in services["forge"]["command"] and "0.0.0.0" in services["forge"]["command"]
    grace = float(worker["environment"].get("LONGRUN_WORKER_STOP_GRACE", DEFAULTS.worker_stop_grace))
    assert _seconds(worker["stop_grace_period"]) >= grace + STOP_MARGIN
    assert "127.0.0.1:8080:8080" in services["gateway"]["ports"]


def test_every_compose_command_names_a_real_module_or_console_script() -> None:
    services = compose()["services"]
    for name, package in SERVICES.items():
        assert services[name]["command"] == ["python", "-m", f"longrun.services.{package}"], name
    for name in ("migrate", "forge", *SERVICES):
        assert runnable(services[name]["command"]) is None, name
    assert services["migrate"]["command"][-1] == "upgrade"


def test_compose_uses_only_declared_longrun_variables_and_never_crash_points() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert set(LONGRUN_NAME.findall(text)) <= KNOWN, set(LONGRUN_NAME.findall(text)) - KNOWN
    for name, svc in compose()["services"].items():
        assert set(LONGRUN_NAME.findall(json.dumps(svc))) <= KNOWN, name
    assert "LONGRUN_CRASH_POINTS" not in text
    assert "LONGRUN_PROTECTIONS_OFF" not in text


def test_each_compose_environment_is_complete_and_valid_for_settings() -> None:
    parsed = {}
    for name, svc in longrun_services().items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        assert {"LONGRUN_DATABASE_URL", "LONGRUN_AMQP_URL"} <= set(env), name
        parsed[name] = Settings.from_env(env)  # raises ConfigError naming every bad variable
        assert parsed[name].health_port == 8081, f"{name}: the image HEALTHCHECK probes 8081"
        assert parsed[name].crash_points == (), name
    migrate_env = {k: str(v) for k, v in compose()["services"]["migrate"]["environment"].items()}
    assert Settings.from_env(migrate_env).database_url == parsed["scheduler"].database_url
    p, limit = partitions_in_definitions()
    assert {s.partitions for s in parsed.values()} == {p}, "P differs between services or the broker"
    assert {s.delivery_limit for s in parsed.values()} == {limit}
    gateway = parsed["gateway"]
    # Published on this machine only, and started only with secrets the environment gives (none built in)
    assert compose()["services"]["gateway"]["ports"] == [f"127.0.0.1:{gateway.gateway_port}:{gateway.gateway_port}"]
    for secret in ("LONGRUN_WEBHOOK_SECRET", "LONGRUN_OPERATOR_TOKENS", "LONGRUN_CONSOLE_SECRET"):
        assert compose()["services"]["gateway"]["environment"][secret].startswith(f"${{{secret}:?"), secret


# --- Kubernetes ----------------------------------------------------------------------------

@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed, so `kubectl kustomize` cannot render the overlays")
    done = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in rendered(overlay) if d["kind"] == kind}


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in OPERATOR_SCHEMAS:
        jsonschema.validate(doc, OPERATOR_SCHEMAS[doc["kind"]])
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def secret_example() -> dict[str, dict[str, str]]:
    docs = yaml.safe_load_all((K8S / "base/secret.example.yaml").read_text())
    return {d["metadata"]["name"]: d["stringData"] for d in docs}


def pod_env(overlay: str, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The environment a container would see, with the example Secret's values."""
    configmaps, secrets = of_kind(overlay, "ConfigMap"), secret_example()
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, "secrets are mounted key by key, never in bulk"
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in ref:
            found = secrets[ref["secretKeyRef"]["name"]].get(ref["secretKeyRef"]["key"])
            assert found is not None or ref["secretKeyRef"].get("optional"), var
            if found is not None:
                env[var["name"]] = found
        else:
            assert ref["fieldRef"]["fieldPath"] == "metadata.name", var
            env[var["name"]] = "longrun-pod-abc12"
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    unknown = set()
    for doc in rendered(overlay):
        try:
            validate(doc)
        except kubernetes_validate.SchemaNotFoundError:
            unknown.add(doc["kind"])
    # Only KEDA's CRDs may go unchecked: a typo in a core kind must not slip through as "unknown".
    assert unknown <= CRD_KINDS, unknown
    assert (unknown == CRD_KINDS) == (overlay == "autoscale")


def test_the_documented_cli_validation_passes_on_a_rendered_overlay(tmp_path: Path) -> None:
    cli = Path(sys.executable).parent / "kubernetes-validate"
    if not cli.exists():
        pytest.skip(f"{cli} is not installed")
    manifest = tmp_path / "autoscale.yaml"
    manifest.write_text(yaml.safe_dump_all(rendered("autoscale")))
    done = subprocess.run([str(cli), "--strict", "-k", K8S_VERSION, "--quiet", str(manifest)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARN" in done.stdout and "ScaledObject" in done.stdout  # CRDs warn, they do not fail


def test_a_broken_manifest_is_rejected_by_the_same_validator(tmp_path: Path) -> None:
    deployment = of_kind("prod", "Deployment")["longrun-worker"]
    validate(deployment)
    broken_replicas = copy.deepcopy(deployment)
    broken_replicas["spec"]["replicas"] = "two"
    misspelled = copy.deepcopy(deployment)
    misspelled["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    for broken in (broken_replicas, misspelled):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(broken)
    cli = Path(sys.executable).parent / "kubernetes-validate"
    if cli.exists():
        manifest = tmp_path / "broken.yaml"
        manifest.write_text(yaml.safe_dump(broken_replicas))
        done = subprocess.run([str(cli), "--strict", "-k", K8S_VERSION, str(manifest)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "replicas" in done.stdout, done.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_six_deployments_run_the_right_commands_with_probes_resources_and_hardening(overlay: str) -> None:
    deployments = of_kind(overlay, "Deployment")
    assert set(deployments) == {f"longrun-{name}" for name in SERVICES}
    for name, package in SERVICES.items():
        deployment = deployments[f"longrun-{name}"]
        pod = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        (container,) = pod["containers"]
        assert container["name"] == name
        assert container["command"] == ["python", "-m", f"longrun.services.{package}"], name
        assert runnable(container["command"]) is None, name
        assert container["image"].startswith(IMAGE + ":") and not container["image"].endswith(":latest")

        env = pod_env(overlay, pod, container)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["health"] == int(env["LONGRUN_HEALTH_PORT"]) == 8081, name
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                            ("readinessProbe", "/readyz")):
            assert container[probe]["httpGet"] == {"path": path, "port": "health"}, (name, probe)
        assert container["livenessProbe"]["periodSeconds"] >= 5
        assert container["livenessProbe"]["failureThreshold"] * container["livenessProbe"]["periodSeconds"] >= 20
        startup = container["startupProbe"]
        assert startup["failureThreshold"] * startup["periodSeconds"] >= 30, name

        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], name

        assert pod["securityContext"]["runAsNonRoot"] is True
        assert str(pod["securityContext"]["runAsUser"]) == _image_uid(), "must match the image's USER"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        volumes = {v["name"]: v for v in pod["volumes"]}
        tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
        assert "emptyDir" in volumes[tmp["name"]], name
        assert pod["automountServiceAccountToken"] is False
        assert 30 <= pod["terminationGracePeriodSeconds"] <= 120, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_gets_the_settings_it_needs_and_they_parse(overlay: str) -> None:
    p, limit = partitions_in_definitions()
    for name in SERVICES:
        pod = of_kind(overlay, "Deployment")[f"longrun-{name}"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = pod_env(overlay, pod, container)
        assert {"LONGRUN_DATABASE_URL", "LONGRUN_AMQP_URL", "LONGRUN_INSTANCE_ID"} <= set(env), name
        by_name = {v["name"]: v for v in container["env"]}
        assert by_name["LONGRUN_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        for secret in ("LONGRUN_DATABASE_URL", "LONGRUN_AMQP_URL"):
            assert by_name[secret]["valueFrom"]["secretKeyRef"]["name"] == "longrun", (name, secret)
        settings = Settings.from_env(env)
        if name == "worker":
            assert pod["terminationGracePeriodSeconds"] >= settings.worker_stop_grace + STOP_MARGIN
        assert settings.instance_id == "longrun-pod-abc12"
        assert (settings.partitions, settings.delivery_limit) == (p, limit), "P / limit differ from the broker"
        assert settings.crash_points == ()
        if settings.artifact_store == "filesystem" and settings.artifact_dir.startswith("/data/"):
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert name not in ("worker", "reconciler", "gateway") or settings.artifact_dir in mounts, name
    gateway = of_kind(overlay, "Deployment")["longrun-gateway"]["spec"]["template"]["spec"]
    gateway_env = {v["name"] for v in gateway["containers"][0]["env"]}
    # Without these the gateway would run on the dev defaults of Settings.
    assert {"LONGRUN_WEBHOOK_SECRET", "LONGRUN_OPERATOR_TOKENS", "LONGRUN_CONSOLE_SECRET"} <= gateway_env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_use_only_declared_longrun_variables_and_never_crash_points(overlay: str) -> None:
    text = yaml.safe_dump_all(rendered(overlay)) + (K8S / "base/secret.example.yaml").read_text()
    names = set(LONGRUN_NAME.findall(text))
    assert names <= KNOWN, names - KNOWN
    assert "LONGRUN_CRASH_POINTS" not in names
    assert "LONGRUN_PROTECTIONS_OFF" not in names
    assert set(secret_example()["longrun"]) == {"LONGRUN_DATABASE_URL", "LONGRUN_AMQP_URL", "LONGRUN_WEBHOOK_SECRET",
                                                "LONGRUN_OPERATOR_TOKENS", "LONGRUN_CONSOLE_SECRET",
                                                "LONGRUN_MODEL_API_KEY"}


def test_the_secret_template_is_valid_but_not_part_of_any_overlay() -> None:
    for doc in yaml.safe_load_all((K8S / "base/secret.example.yaml").read_text()):
        validate(doc)
    assert "secret.example.yaml" not in yaml.safe_load((K8S / "base/kustomization.yaml").read_text())["resources"]
    for overlay in OVERLAYS:
        assert of_kind(overlay, "Secret") == {}, "real secrets are created out of band"
        assert {d["metadata"].get("namespace") for d in rendered(overlay) if d["kind"] != "Namespace"} \
            == {"longrun"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_migration_job_runs_once_with_retries_and_cleans_up(overlay: str) -> None:
    (job,) = of_kind(overlay, "Job").values()
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["backoffLimit"] >= 1 and spec["ttlSecondsAfterFinished"] > 0
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "longrun.db.migrate", "upgrade"]
    assert runnable(container["command"]) is None
    assert Settings.from_env(pod_env(overlay, pod, container)).database_url.startswith("postgresql+psycopg://")
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The README applies it first with this selector (which must pick nothing else), then waits.
    selected = [d["kind"] for d in rendered(overlay)
                if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "migrate"]
    assert selected == ["Job"]
    images = {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in of_kind(overlay, "Deployment").values()}
    assert images == {container["image"]}, "the migration and the services must ship together"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_and_the_gateway_service_select_their_pods(overlay: str) -> None:
    deployments = of_kind(overlay, "Deployment")
    pdbs = of_kind(overlay, "PodDisruptionBudget")
    assert set(pdbs) == {"longrun-worker", "longrun-scheduler", "longrun-outbox-relay", "longrun-gateway"}
    for name, pdb in pdbs.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        assert pdb["spec"].get("maxUnavailable") == 1, "minAvailable would block draining one replica"
    service = of_kind(overlay, "Service")["longrun-gateway"]
    gateway = deployments["longrun-gateway"]["spec"]["template"]
    assert service["spec"]["selector"].items() <= gateway["metadata"]["labels"].items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in gateway["spec"]["containers"][0]["ports"]}
    env = pod_env(overlay, gateway["spec"], gateway["spec"]["containers"][0])
    assert container_ports[ports["http"]["targetPort"]] == int(env["LONGRUN_GATEWAY_PORT"]) == 8080


def test_with_artifacts_in_s3_no_pod_needs_a_shared_volume() -> None:
    # Given prod with the s3-artifacts component: no claim at all, no pod mounts one
    assert of_kind("prod-s3", "PersistentVolumeClaim") == {}
    assert "ReadWriteMany" not in yaml.safe_dump_all(rendered("prod-s3"))
    for name, deployment in of_kind("prod-s3", "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert not [v for v in pod.get("volumes", []) if "persistentVolumeClaim" in v], name
        # and each service reads the bucket's settings; credentials only from the Secret, if at all
        settings = Settings.from_env(pod_env("prod-s3", pod, pod["containers"][0]))
        assert (settings.artifact_store, settings.s3_bucket, settings.s3_encryption) == (
            "s3", "longrun-artifacts-prod", "AES256"), name
    worker = of_kind("prod-s3", "Deployment")["longrun-worker"]["spec"]["template"]["spec"]["containers"][0]
    credentials = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in worker["env"] if v["name"].startswith("LONGRUN_S3")}
    assert credentials == {k: {"name": "longrun", "key": k, "optional": True}
                           for k in ("LONGRUN_S3_ACCESS_KEY_ID", "LONGRUN_S3_SECRET_ACCESS_KEY")}


def test_overlays_set_image_tags_replicas_and_resources() -> None:
    tags = {o: {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in of_kind(o, "Deployment").values()}
            for o in OVERLAYS}
    assert tags["dev"] == {f"{IMAGE}:dev"}
    assert tags["prod"] == tags["prod-s3"] == tags["autoscale"] == tags["monitoring"] == {
        f"{IMAGE}:{longrun.__version__}"}
    replicas = {o: {n: d["spec"].get("replicas") for n, d in of_kind(o, "Deployment").items()} for o in OVERLAYS}
    p, _ = partitions_in_definitions()
    assert replicas["dev"]["longrun-worker"] == 2
    assert 1 < replicas["prod"]["longrun-worker"] <= p
    assert replicas["prod"]["longrun-scheduler"] >= 2 and replicas["prod"]["longrun-outbox-relay"] >= 2
    dev_worker = of_kind("dev", "Deployment")["longrun-worker"]["spec"]["template"]["spec"]["containers"][0]
    prod_worker = of_kind("prod", "Deployment")["longrun-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert dev_worker["resources"] != prod_worker["resources"]
    assert of_kind("dev", "PersistentVolumeClaim")["longrun-artifacts"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert of_kind("prod", "PersistentVolumeClaim")["longrun-artifacts"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert of_kind("dev", "ConfigMap") and all(
        cm["data"]["LONGRUN_PARTITIONS"] == str(p) for o in OVERLAYS for cm in of_kind(o, "ConfigMap").values())


def test_autoscaling_caps_workers_at_the_partition_count() -> None:
    (scaled,) = of_kind("autoscale", "ScaledObject").values()
    (config,) = of_kind("autoscale", "ConfigMap").values()
    p = int(config["data"]["LONGRUN_PARTITIONS"])
    assert scaled["spec"]["scaleTargetRef"]["name"] == "longrun-worker"
    assert scaled["spec"]["maxReplicaCount"] == p, "replicas beyond P are standby only"
    assert 1 <= scaled["spec"]["minReplicaCount"] <= p
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq" and trigger["metadata"]["protocol"] == "http"
    pattern = re.compile(trigger["metadata"]["queueName"])
    assert all(pattern.fullmatch(f"longrun.worker.p{k}") for k in range(p))
    assert not pattern.fullmatch("longrun.scheduler.p0")
    (auth,) = of_kind("autoscale", "TriggerAuthentication").values()
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    ref = auth["spec"]["secretTargetRef"][0]
    assert ref["key"] in secret_example()[ref["name"]]
    # The HPA KEDA creates owns the count; a fixed spec.replicas would fight it on every apply.
    assert "replicas" not in of_kind("autoscale", "Deployment")["longrun-worker"]["spec"]


def test_the_monitoring_overlay_scrapes_every_service_and_carries_the_generated_rules() -> None:
    (monitor,) = of_kind("monitoring", "PodMonitor").values()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    for name, deployment in of_kind("monitoring", "Deployment").items():
        pod = deployment["spec"]["template"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), name
        assert endpoint["port"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}, name
    (rule,) = of_kind("monitoring", "PrometheusRule").values()
    assert rule["spec"] == yaml.safe_load((ROOT / monitoring.RULES_FILE).read_text())
    assert of_kind("prod", "PrometheusRule") == {}, "the CRD may be missing: only the monitoring overlay needs it"


def test_a_broken_prometheus_rule_is_rejected_by_its_schema() -> None:
    (rule,) = of_kind("monitoring", "PrometheusRule").values()
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["expresion"] = broken["spec"]["groups"][0]["rules"][0].pop("expr")
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


def test_the_docs_name_the_commands_the_manifests_rely_on() -> None:
    readme = (ROOT / "infra/README.md").read_text()
    for needle in ("docker compose up", "kubernetes-validate", "drain"):
        assert needle in readme, needle
    walk = (ROOT / "docs/deployment.md").read_text()
    for needle in ("app.kubernetes.io/component=migrate", "kubectl -n longrun create secret generic longrun",
                   "kubectl -n longrun create secret tls longrun-tls", "kubectl apply -k deploy/overlays/mine"):
        assert needle in walk, needle


def _image_uid() -> str:
    return stages()["runtime"].args("USER")[-1].split(":")[0]


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return int(match.group(1))
