"""infra/local/ensure-services.sh, which `make run`, `make test` and CI start with: it looks where
LONGRUN_DATABASE_URL and LONGRUN_AMQP_URL point, and leaves both to testcontainers (`make test` only)
when neither answers but a Docker engine does. Run with a PATH of only what the script needs, so the
machine's own servers and tools do not decide the outcome; this machine has no Docker engine, so the
engine's answer comes from a `docker` command that answers `docker info` as an engine's CLI does."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "infra" / "local" / "ensure-services.sh"
NOWHERE_DB = "postgresql://postgres@127.0.0.2:1/longrun"
NOWHERE_MQ = "amqp://guest:guest@127.0.0.2:1/"


@pytest.fixture
def bare_path(tmp_path: Path) -> Path:
    """A PATH directory with the script's tools and none of the servers' commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    for tool in ("bash", "seq", "sleep", "ls", "head"):
        (bin_dir / tool).symlink_to(os.path.realpath(shutil.which(tool)))  # type: ignore[arg-type]
    return bin_dir


def _engine(bin_dir: Path, answers: bool) -> None:
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\n[ \"$1\" = info ] && exit {0 if answers else 1}\nexit 2\n")
    docker.chmod(0o755)


def _ensure(bin_dir: Path, *args: str, **urls: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
    env.update(urls, PATH=str(bin_dir))
    return subprocess.run(["/bin/bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """Two ports something accepts connections on, standing for a database and a broker elsewhere."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        yield tuple(s.getsockname()[1] for s in sockets)  # type: ignore[misc]
    finally:
        for s in sockets:
            s.close()


def test_it_checks_the_servers_the_urls_name_and_starts_nothing(bare_path: Path,
                                                                listeners: tuple[int, int]) -> None:
    db, mq = listeners
    done = _ensure(bare_path, LONGRUN_DATABASE_URL=f"postgresql://u@127.0.0.1:{db}/x",
                   LONGRUN_AMQP_URL=f"amqp://u:p@127.0.0.1:{mq}/")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_database_it_cannot_reach_nor_start_is_named_with_its_variable(bare_path: Path,
                                                                         listeners: tuple[int, int]) -> None:
    done = _ensure(bare_path, LONGRUN_DATABASE_URL=NOWHERE_DB, LONGRUN_AMQP_URL=f"amqp://127.0.0.1:{listeners[1]}/")
    assert done.returncode == 1
    assert "PostgreSQL does not answer on 127.0.0.2:1 (LONGRUN_DATABASE_URL)" in done.stderr
    assert "testcontainers" not in done.stderr  # without --or-containers they are no way out


def test_the_tests_leave_both_to_testcontainers_when_only_a_docker_engine_answers(bare_path: Path) -> None:
    _engine(bare_path, answers=True)
    done = _ensure(bare_path, "--or-containers", LONGRUN_DATABASE_URL=NOWHERE_DB, LONGRUN_AMQP_URL=NOWHERE_MQ)
    assert done.returncode == 0, done.stderr
    assert "the tests start both with testcontainers" in done.stdout


def test_make_run_does_not_settle_for_containers(bare_path: Path) -> None:
    _engine(bare_path, answers=True)
    done = _ensure(bare_path, LONGRUN_DATABASE_URL=NOWHERE_DB, LONGRUN_AMQP_URL=NOWHERE_MQ)
    assert done.returncode == 1 and "PostgreSQL does not answer" in done.stderr


def test_an_engine_that_does_not_answer_is_no_way_out(bare_path: Path) -> None:
    _engine(bare_path, answers=False)
    done = _ensure(bare_path, "--or-containers", LONGRUN_DATABASE_URL=NOWHERE_DB, LONGRUN_AMQP_URL=NOWHERE_MQ)
    assert done.returncode == 1
    assert "or run a Docker engine for testcontainers" in done.stderr
