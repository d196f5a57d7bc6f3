"""longrun used from its wheels alone, as an author and a producer outside this repository use it.

A fresh environment gets the lock's wheelhouse (downloaded, every file against its hash) and then our
wheels (the ones the image installs) and an author's project: acme_echo, a package of its own whose
pyproject.toml registers its run kind by a ``longrun.run_kinds`` entry point. Outside the checkout, with
PYTHONPATH unset, the kind runs in the testing kit and then on the services started from that
environment's console scripts, for a producer in a second environment that holds the client alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import longrun_client
from tests.infra import Infra
from tests.integration.image import Image, outside_env, ready, settings, start, stop
from tests.unit.infra.dockerfile import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.packaging, pytest.mark.timeout(600)]

AUTHOR_PROJECT = ROOT / "tests/integration/fixtures/acme_echo"
WORDS = ["hello", "world"]


@dataclass(frozen=True)
class Outside:
    runtime: Path
    """The author's environment: the locked dependencies, the runtime, the client and acme_echo."""
    client: Path
    """A producer's environment: the client and its dependencies, nothing else of ours."""


def pip(python: Path | str, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=540,
                          env=outside_env())
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def outside(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Outside:
    work = tmp_path_factory.mktemp("outside")
    lock = ROOT / "requirements/runtime.txt"
    # Given the lock's wheelhouse, every file checked against its hash
    wheelhouse = work / "wheelhouse"
    pip(sys.executable, "download", "--quiet", "--require-hashes", "--only-binary=:all:", "-d", str(wheelhouse),
        "-r", str(lock))
    # and the author's project built into a wheel of its own, from a copy (a build writes beside its sources)
    source = work / "acme_echo"
    shutil.copytree(AUTHOR_PROJECT, source)
    pip(sys.executable, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(work / "author"), str(source))
    # When the author's environment is made from the wheelhouse alone, then our wheels and theirs
    runtime, client = work / "runtime", work / "client"
    for venv in (runtime, client):
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=outside_env())
    pip(runtime / "bin/python", "install", "--quiet", "--no-index", "--find-links", str(wheelhouse),
        "--require-hashes", "-r", str(lock))
    pip(runtime / "bin/python", "install", "--quiet", "--no-index", "--no-deps",
        *map(str, image.wheels.glob("*.whl")), *map(str, (work / "author").glob("*.whl")))
    pip(runtime / "bin/python", "check")
    # and a producer's environment gets the client and what it needs from the same wheelhouse
    (client_wheel,) = image.wheels.glob("longrun_client-*.whl")
    pip(client / "bin/python", "install", "--quiet", "--no-index", "--find-links", str(wheelhouse), str(client_wheel))
    return Outside(runtime, client)


KIT = """
import json, longrun, acme_echo
from longrun.run_kinds import installed_entry_points
from longrun.testing.kit import Kit
(kind,) = acme_echo.KINDS
with Kit(kind) as kit:
    run_id = kit.start({"words": %r})
    kit.settle()
    print(json.dumps({
        "status": kit.status(run_id).value,
        "problems": kit.check(),
        "said": kit.executions("acme.say"),
        "registered": [i.name for i in installed_entry_points("longrun.run_kinds")],
        "longrun": longrun.__file__,
        "kind": acme_echo.__file__,
    }))
""" % WORDS


def test_the_authors_kind_runs_in_the_testing_kit_of_the_installed_runtime(image: Image, outside: Outside) -> None:
    done = image.run("python", "-c", KIT, venv=outside.runtime)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # Then longrun and the author's package come from the environment, never from the checkout
    assert Path(found["longrun"]).is_relative_to(outside.runtime), found["longrun"]
    assert Path(found["kind"]).is_relative_to(outside.runtime), found["kind"]
    # and the kind, registered by its entry point, runs to COMPLETED with each word said once
    assert found["registered"] == ["acme_echo"]
    assert (found["status"], found["problems"], found["said"]) == ("COMPLETED", [], len(WORDS))


PRODUCER = """
import asyncio, json, sys
from longrun_client import Client

async def main(url, key):
    async with await Client.connect(url, producer="acme-shop") as client:
        request = await client.create_run("acme", "acme_echo", {"words": %r}, idempotency_key=key)
        outcome = await client.wait(request, timeout=120)
    try:
        import longrun
        runtime = longrun.__file__
    except ImportError:
        runtime = None
    print(json.dumps({"status": outcome.status, "runtime": runtime,
                      "receipts": [[r.logical_action, r.tool] for r in outcome.receipts]}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
""" % WORDS


def test_the_authors_kind_runs_on_the_installed_services_for_a_producer_with_the_client_alone(
        image: Image, outside: Outside, infra: Infra, fresh_database: str) -> None:
    env = settings(infra, fresh_database)
    # Given a fresh database migrated by the author's environment, and its scheduler, relay and worker
    migrated = image.run("python", "-m", "longrun.db.migrate", "upgrade", venv=outside.runtime, **env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    started = [start(outside.runtime, script, cwd=image.elsewhere, env=env)
               for script in ("longrun-scheduler", "longrun-outbox-relay", "longrun-worker")]
    try:
        not_ready = [s.name for s in started if not ready(s)]
        assert not not_ready, "\n".join(f"== {s.name}\n{s.output()[-3000:]}" for s in started)
        # When the operator's command line and a producer run from the client's environment
        version = image.run("longrunctl", "--version", venv=outside.client, timeout=60)
        produced = image.run("python", "-c", PRODUCER, infra.amqp_url, f"outside-{uuid.uuid4().hex[:10]}",
                             venv=outside.client, timeout=180)
    finally:
        stopped = {s.name: stop(s) for s in started}
    assert version.stdout == f"longrunctl {longrun_client.__version__}\n", version.stderr
    assert produced.returncode == 0, produced.stderr + "\n".join(s.output()[-3000:] for s in started)
    found = json.loads(produced.stdout)
    # Then the run completes with each word said once through the ledger, and the runtime was never there
    assert found["status"] == "COMPLETED"
    assert found["receipts"] == [[f"say:{i}", "acme.say"] for i in range(len(WORDS))]
    assert found["runtime"] is None
    assert stopped == {s.name: 0 for s in started}, "\n".join(s.output()[-3000:] for s in started)
