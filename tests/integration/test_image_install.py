"""The production image's install, replayed without a Docker engine (``image``, tests/integration/image.py:
the Dockerfile's builder and runtime steps as it writes them). From that environment alone, outside the
checkout and with PYTHONPATH unset: no example code is there, every console script prints the release,
the migration builds a fresh database and a service comes up ready."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import longrun
from longrun.db import migrate
from tests.infra import Infra
from tests.integration.image import Image, ready, settings, start, stop

pytestmark = [pytest.mark.integration, pytest.mark.packaging, pytest.mark.timeout(600)]

SCRIPTS = ("longrun-scheduler", "longrun-worker", "longrun-timer", "longrun-reconciler", "longrun-outbox-relay",
           "longrun-gateway", "longrunctl")
"""The runtime's console scripts (pyproject.toml [project.scripts]) and the client's."""

PROBE = """
import importlib.metadata, importlib.util, json, longrun, longrun_client
print(json.dumps({
    "longrun": longrun.__file__,
    "client": longrun_client.__file__,
    "example": importlib.util.find_spec("longrun_dependency_upgrade") is not None,
    "ours": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                   if d.metadata["Name"].startswith("longrun")),
}))
"""


def test_the_runtime_target_holds_the_runtime_and_client_and_nothing_of_the_example(image: Image) -> None:
    # Then the runtime and the client are imported from the environment, not from the checkout
    probe = image.run("python", "-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["longrun"]).is_relative_to(image.venv), found["longrun"]
    assert Path(found["client"]).is_relative_to(image.venv), found["client"]
    # and neither the example agent nor its demo forge is there, as a package or as any file
    assert found["ours"] == ["longrun-client", "longrun-runtime"]
    assert found["example"] is False
    assert not [p for p in image.venv.rglob("*") if "dependency_upgrade" in p.name or "forge" in p.name]


def test_every_console_script_of_the_image_prints_the_release(image: Image) -> None:
    for script in SCRIPTS:
        done = image.run(script, "--version", timeout=60)
        assert (done.returncode, done.stdout) == (0, f"{script} {longrun.__version__}\n"), done.stderr


def test_the_image_migrates_a_fresh_database_and_a_service_from_it_comes_up_ready(
        image: Image, infra: Infra, fresh_database: str) -> None:
    env = settings(infra, fresh_database)
    # When the image's migration runs against a database that does not exist yet
    migrated = image.run("python", "-m", "longrun.db.migrate", "upgrade", **env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    # Then it creates it and brings it to the checkout's head revision
    assert migrate.current_revision(fresh_database) == migrate.current_revision(infra.database_url) is not None
    # When the scheduler starts from the image's console script against it
    scheduler = start(image.venv, "longrun-scheduler", cwd=image.elsewhere, env=env)
    try:
        up = ready(scheduler)
    finally:
        stopped = stop(scheduler)
    # Then it answers ready (the database and the broker reached), and stops cleanly on SIGTERM
    assert up, scheduler.output()
    assert stopped == 0, scheduler.output()
