"""longrun-client installs on its own: a fresh environment with only clients/python imports it
without a database driver or the runtime, builds and reads back a run.create, and runs longrunctl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import longrun_client

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import json, sys
import longrun_client
import longrun_client.ctl
from longrun_client import decode, encode, make
request = make("run.create", {"workflow": "steps", "idempotency_key": "k-1", "input": {"steps": 2}},
               producer="probe", tenant_id="acme")
try:
    import longrun
    runtime = longrun.__file__
except ImportError:
    runtime = None
print(json.dumps({
    "loaded": sorted({name.split(".")[0] for name in sys.modules} & {"sqlalchemy", "psycopg", "asyncpg"}),
    "runtime": runtime,
    "round_trip": decode(encode(request)) == request,
    "file": longrun_client.__file__,
}))
"""


@pytest.mark.packaging
@pytest.mark.timeout(600)
def test_the_client_installs_alone_and_imports_no_database_driver(tmp_path: Path) -> None:
    # Given a fresh virtual environment and a copy of clients/python (built outside the work tree)
    source = tmp_path / "client"
    shutil.copytree(ROOT / "clients/python", source,
                    ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "env")], check=True)
    python = tmp_path / "env/bin/python"
    # When only the client is installed there
    installed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(source)],
                               capture_output=True, text=True, timeout=540)
    assert installed.returncode == 0, f"pip install clients/python failed:\n{installed.stdout}\n{installed.stderr}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env,
                           timeout=60)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    # Then importing it loads no database driver, the runtime is not there, and an envelope round-trips
    assert found["loaded"] == []
    assert found["runtime"] is None
    assert found["round_trip"] is True
    assert found["file"].startswith(str(tmp_path / "env"))
    # and the operator's command line is there, of the same release
    version = subprocess.run([str(tmp_path / "env/bin/longrunctl"), "--version"], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=60)
    assert version.stdout == f"longrunctl {longrun_client.__version__}\n", version.stderr
