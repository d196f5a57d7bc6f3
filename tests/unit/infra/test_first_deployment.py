"""docs/deployment.md's first deployment, step by step, as a user would follow it: its overlay of one's
own renders on top of this tree's prod overlay and validates, carries the user's image, settings and
host, and keeps everything prod holds; its commands name files and permissions that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.unit.infra.test_deployment_files import K8S_VERSION, rendered

ROOT = Path(__file__).resolve().parents[3]
WALK = (ROOT / "docs" / "deployment.md").read_text().split("## A first deployment, step by step", 1)[1] \
    .split("\n## ", 1)[0]
FENCED = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in FENCED.findall(WALK) if lang == language]


@pytest.fixture(scope="module")
def mine(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], ...]:
    (overlay,) = _blocks("yaml")
    kustomization = yaml.safe_load(overlay)
    assert kustomization["resources"] == ["../../../longrun/infra/k8s/overlays/prod"]
    # The user's repository holds longrun's tree beside deploy/: here, this checkout.
    here = tmp_path_factory.mktemp("yours") / "deploy" / "overlays" / "mine"
    here.mkdir(parents=True)
    kustomization["resources"] = [os.path.relpath(ROOT / "infra/k8s/overlays/prod", here)]
    (here / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed, so `kubectl kustomize` cannot render the overlay")
    done = subprocess.run([kubectl, "kustomize", str(here)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def test_the_overlay_of_ones_own_renders_and_validates(mine: tuple[dict[str, Any], ...]) -> None:
    for doc in mine:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # Nothing of prod is lost on the way (the ConfigMap's name carries a hash of its changed content).
    assert _names(mine) == _names(rendered("prod"))


def _names(docs: tuple[dict[str, Any], ...]) -> list[tuple[str, str]]:
    return sorted((d["kind"], re.sub(r"^(longrun-config)-[a-z0-9]+$", r"\1", d["metadata"]["name"])) for d in docs)


def test_it_carries_the_users_image_settings_and_host(mine: tuple[dict[str, Any], ...]) -> None:
    pods = [d["spec"]["template"]["spec"] for d in mine if d["kind"] in ("Deployment", "Job")]
    assert {c["image"] for pod in pods for c in pod["containers"]} == {"registry.example.com/platform/longrun:0.1.0"}
    (config,) = [d["data"] for d in mine if d["kind"] == "ConfigMap"]
    assert config["LONGRUN_FORWARDED_ALLOW_IPS"] == "10.244.0.0/16"
    assert config["LONGRUN_PRODUCER_TENANTS"] == "acme=acme"
    assert config["LONGRUN_PARTITIONS"] == "8"  # merged into prod's settings, not replacing them
    (ingress,) = [d for d in mine if d["kind"] == "Ingress"]
    assert ingress["spec"]["tls"][0]["hosts"] == ["longrun.mycompany.example"]
    assert [r["host"] for r in ingress["spec"]["rules"]] == ["longrun.mycompany.example"]


def test_its_commands_name_files_and_permissions_that_exist() -> None:
    commands = [line for block in _blocks("sh") for line in block.splitlines()]
    for line in commands:
        for path in re.findall(r"kubectl apply -f (\S+)", line):
            assert (ROOT / path).is_file(), line
    # A producer's permissions are the ones the bus page explains and tests/security checks.
    bus = (ROOT / "docs" / "bus.md").read_text()
    granted = [line for line in commands if line.startswith("rabbitmqctl set_") and " acme " in line]
    assert len(granted) == 3 and all(line in bus for line in granted)
