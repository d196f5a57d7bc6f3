"""A service that cannot reach its infrastructure stops and says what to start and how."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("variable", "url", "says"), [
    ("LONGRUN_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/longrun", "pg_ctlcluster"),
    ("LONGRUN_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/", "rabbitmq-server -detached"),
])
def test_an_unreachable_dependency_stops_the_service_with_what_to_start(infra, variable: str, url: str,
                                                                         says: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LONGRUN_DATABASE_URL": infra.database_url,
           "LONGRUN_AMQP_URL": infra.amqp_url, "LONGRUN_STARTUP_PATIENCE": "1", variable: url}
    done = subprocess.run([sys.executable, "-m", "longrun.services.outbox_relay"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 3, done.stderr
    assert "cannot start" in done.stderr and says in done.stderr and "127.0.0.1:1" in done.stderr


def test_a_bad_setting_stops_the_service_naming_the_variable() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LONGRUN_PARTITIONS": "eight",
           "LONGRUN_PREFETCH": "0"}
    done = subprocess.run([sys.executable, "-m", "longrun.services.worker"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert "LONGRUN_PARTITIONS: got 'eight'; expected an integer >= 1" in done.stderr
    assert "LONGRUN_PREFETCH: got '0'; expected an integer >= 1" in done.stderr
