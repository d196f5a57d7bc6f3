"""Environments installed the way the production image installs them, and services started from them,
for the tests that run longrun from outside the checkout (test_image_install.py, test_outside_the_tree.py).

``image`` replays the Dockerfile without a Docker engine: the builder stage (its COPYs into a build
context of its own, the build-wheels.sh commands whose wheels the runtime target mounts) and the runtime
target's install step (infra/image/install.sh with the hashed lock) run as the Dockerfile writes them,
paths inside the image mapped to a temporary directory; once per session, since building wheels is slow.
Whatever runs from these environments runs outside the checkout with PYTHONPATH unset.
"""

from __future__ import annotations

import os
import shutil
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

from tests.fixtures import DELIVERY_LIMIT, PARTITIONS
from tests.infra import Infra
from tests.ports import free_port
from tests.unit.infra.dockerfile import ROOT, Run, stages

# What .dockerignore keeps out of the build context, for the copies the builder stage makes.
CONTEXT_IGNORES = shutil.ignore_patterns("__pycache__", "*.py[co]", "*.egg-info", "build")


def outside_env(**extra: str) -> dict[str, str]:
    """The machine's environment less anything pointing into the checkout, another environment or a
    deployment's settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("LONGRUN_")}
    return {**env, **extra}


@dataclass(frozen=True)
class Image:
    root: Path
    """Where the image's absolute paths land (``/opt/longrun`` is ``root/opt/longrun``)."""
    venv: Path
    wheels: Path
    """The wheels the runtime target installed: the runtime's and the client's."""
    elsewhere: Path
    """A working directory outside the checkout."""

    def run(self, *argv: str, venv: Path | None = None, timeout: float = 120,
            **env: str) -> subprocess.CompletedProcess[str]:
        """``argv[0]`` from the bin directory of ``venv`` (the image's by default), outside the checkout."""
        program = str((venv or self.venv) / "bin" / argv[0])
        return subprocess.run([program, *argv[1:]], capture_output=True, text=True, cwd=self.elsewhere,
                              env=outside_env(**env), timeout=timeout)


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
                              env=outside_env(PYTHON=sys.executable))
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """The runtime target's environment, built the way the Dockerfile builds it."""
    found = stages()
    root, context = tmp_path_factory.mktemp("image"), tmp_path_factory.mktemp("build")
    (install,) = [run for run in found["runtime"].runs() if run.mounts]
    wheels = next(m.source for m in install.mounts if m.stage == "builder")
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
    replay(install, root=root, cwd=root)
    venv = root / "opt/longrun"
    assert (venv / "bin/python").exists(), "the install step made no environment at /opt/longrun"
    return Image(root, venv, Path(in_image(root, wheels)), tmp_path_factory.mktemp("elsewhere"))


@pytest.fixture
def fresh_database(infra: Infra) -> Iterator[str]:
    """The URL of a database that does not exist yet; dropped after the test."""
    url = make_url(infra.database_url).set(database=f"lrt_image_{uuid.uuid4().hex[:10]}")
    yield url.render_as_string(hide_password=False)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


def settings(infra: Infra, database_url: str) -> dict[str, str]:
    """A service's settings: the given database, the session's broker vhost and its topology."""
    return {"LONGRUN_DATABASE_URL": database_url, "LONGRUN_AMQP_URL": infra.amqp_url,
            "LONGRUN_RABBITMQ_MANAGEMENT_URL": infra.management_url,
            "LONGRUN_PARTITIONS": str(PARTITIONS), "LONGRUN_DELIVERY_LIMIT": str(DELIVERY_LIMIT)}


@dataclass
class Started:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ready_url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start(venv: Path, script: str, *, cwd: Path, env: dict[str, str]) -> Started:
    """``script`` from ``venv``'s bin directory, outside the checkout, with a health port of its own."""
    port = free_port()
    log = cwd / f"{script}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(venv / "bin" / script)], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                   env=outside_env(**env, LONGRUN_HEALTH_PORT=str(port),
                                                   LONGRUN_INSTANCE_ID=f"outside-{script}"),
                                   start_new_session=True)
    return Started(script, process, log, f"http://127.0.0.1:{port}/readyz")


def ready(started: Started, *, timeout: float = 60) -> bool:
    """Whether ``started`` answers ready before ``timeout`` (False at once if it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and started.process.poll() is None:
        try:
            if httpx.get(started.ready_url, timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def stop(started: Started, timeout: float = 30) -> int:
    """SIGTERM, then SIGKILL after ``timeout``; the return code (0: it stopped cleanly)."""
    if started.process.poll() is None:
        started.process.terminate()
        try:
            return started.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            started.process.kill()
    return started.process.wait(timeout=10)
