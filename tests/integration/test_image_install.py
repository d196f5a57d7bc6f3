"""The production image's install, replayed without a Docker engine: the Dockerfile's builder stage (its
COPYs into a build context of its own, the build-wheels.sh commands whose wheels the runtime target
mounts) and the runtime target's install step (infra/image/install.sh with the hashed lock) run as the
Dockerfile writes them, paths inside the image mapped to a temporary directory. From that environment
alone, outside the checkout and with PYTHONPATH unset: no example code is there, every console script
prints the release, the migration builds a fresh database and a service comes up ready."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import longrun
from longrun.db import migrate
from tests.fixtures import DELIVERY_LIMIT, PARTITIONS
from tests.infra import Infra
from tests.ports import free_port
from tests.unit.infra.dockerfile import ROOT, Run, stages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SCRIPTS = ("longrun-scheduler", "longrun-worker", "longrun-timer", "longrun-reconciler", "longrun-outbox-relay",
           "longrun-gateway", "longrunctl")
"""The runtime's console scripts (pyproject.toml [project.scripts]) and the client's."""
# What .dockerignore keeps out of the build context, for the copies the builder stage makes.
CONTEXT_IGNORES = shutil.ignore_patterns("__pycache__", "*.py[co]", "*.egg-info", "build")


@dataclass(frozen=True)
class Image:
    root: Path
    """Where the image's absolute paths land (``/opt/longrun`` is ``root/opt/longrun``)."""
    venv: Path
    elsewhere: Path
    """A working directory outside the checkout."""

    def env(self, **extra: str) -> dict[str, str]:
        """The machine's environment less anything pointing into the checkout or another environment."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("LONGRUN_")}
        return {**env, **extra}

    def run(self, *argv: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, cwd=self.elsewhere, env=self.env(**env),
                              timeout=timeout)


def in_image(root: Path, path: str) -> str:
    return str(root / path.lstrip("/")) if path.startswith("/") else path


def replay(run: Run, *, root: Path, cwd: Path, only_making: str | None = None) -> None:
    """Run a RUN instruction's commands in ``cwd``, each mount and absolute path mapped under ``root``;
    ``only_making``: just the commands that name that path (the wheels another stage mounts)."""
    mounts = {m.target: str(ROOT / m.source) if m.stage is None else in_image(root, m.source) for m in run.mounts}
    for command in run.commands:
        if only_making is not None and only_making not in command:
            continue
        argv = [mounts.get(word) or in_image(root, word) for word in command]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=540,
                              env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                                   "PYTHON": sys.executable})
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """The runtime target's environment, built once per module the way the Dockerfile builds it."""
    found = stages()
    root, context = tmp_path_factory.mktemp("image"), tmp_path_factory.mktemp("build")
    (install,) = [run for run in found["runtime"].runs() if run.mounts]
    wheels = next(m.source for m in install.mounts if m.stage == "builder")
    # Given the builder stage: its copies of the build context, then the builds of the wheels the runtime mounts
    for sources, destination in found["builder"].copies():
        for source in sources:
            origin, target = ROOT / source, context / destination
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=CONTEXT_IGNORES, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target / origin.name)
    for run in found["builder"].runs():
        replay(run, root=root, cwd=context, only_making=wheels)
    # When the runtime target's install step runs on them
    replay(install, root=root, cwd=root)
    venv = root / "opt/longrun"
    assert (venv / "bin/python").exists(), "the install step made no environment at /opt/longrun"
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    return Image(root, venv, elsewhere)


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
    probe = image.run(str(image.venv / "bin/python"), "-c", PROBE)
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
        done = image.run(str(image.venv / "bin" / script), "--version", timeout=60)
        assert (done.returncode, done.stdout) == (0, f"{script} {longrun.__version__}\n"), done.stderr


@pytest.fixture
def fresh_database(infra: Infra) -> Iterator[str]:
    """The URL of a database that does not exist yet; dropped after the test."""
    url = make_url(infra.database_url).set(database=f"lrt_image_{uuid.uuid4().hex[:10]}")
    yield url.render_as_string(hide_password=False)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


def test_the_image_migrates_a_fresh_database_and_a_service_from_it_comes_up_ready(
        image: Image, infra: Infra, fresh_database: str) -> None:
    settings = {"LONGRUN_DATABASE_URL": fresh_database, "LONGRUN_AMQP_URL": infra.amqp_url,
                "LONGRUN_PARTITIONS": str(PARTITIONS), "LONGRUN_DELIVERY_LIMIT": str(DELIVERY_LIMIT)}
    # When the image's migration runs against a database that does not exist yet
    migrated = image.run(str(image.venv / "bin/python"), "-m", "longrun.db.migrate", "upgrade", **settings)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    # Then it creates it and brings it to the checkout's head revision
    assert migrate.current_revision(fresh_database) == migrate.current_revision(infra.database_url) is not None
    # When the scheduler starts from the image's console script against it
    port = free_port()
    log = image.elsewhere / "scheduler.log"
    with log.open("wb") as out:
        scheduler = subprocess.Popen([str(image.venv / "bin/longrun-scheduler")], cwd=image.elsewhere,
                                     env=image.env(**settings, LONGRUN_HEALTH_PORT=str(port),
                                                   LONGRUN_INSTANCE_ID="image-scheduler"),
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Then it answers ready (the database and the broker reached), and stops cleanly on SIGTERM
        assert ready(f"http://127.0.0.1:{port}/readyz", scheduler, timeout=60), log.read_text(errors="replace")
        scheduler.send_signal(signal.SIGTERM)
        assert scheduler.wait(timeout=30) == 0, log.read_text(errors="replace")
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait(timeout=10)


def ready(url: str, process: subprocess.Popen[bytes], *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
