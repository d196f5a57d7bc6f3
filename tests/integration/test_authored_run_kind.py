"""An author's run kind, from a package of its own: installed, named by configuration, and run to
COMPLETED through the real services (scheduler, relay, worker) without editing longrun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import eventually
from tests.harness import ROOT
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).parent / "fixtures" / "acme_echo"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``acme_echo`` installed by pip into a directory of its own, as a deployment would install it."""
    source, site = tmp_path_factory.mktemp("source") / "acme_echo", tmp_path_factory.mktemp("site")
    shutil.copytree(PACKAGE, source)  # the build writes beside its sources: not into the repository
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(source)], check=True, capture_output=True)
    return site


async def test_a_run_kind_from_its_own_package_runs_to_completion(clean, engine, bus, services, tmp_path,
                                                                  installed: Path) -> None:  # type: ignore[no-untyped-def]
    # Given the services pointed at the author's package by configuration (and nothing else of it)
    path = os.pathsep.join([str(ROOT), str(ROOT / "shared"), str(installed)])
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "relay", "worker", LONGRUN_RUN_KINDS="acme_echo:KINDS", PYTHONPATH=path)
    # When a producer asks for a run of that kind
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_={"words": ["hello", "world"]}, workflow="acme_echo")
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    # Then the author's workflow and tool carry it to COMPLETED, each word said once through the ledger
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    recorded = [data for kind, data in await event_types(engine, run_id) if kind == "action.recorded"]
    assert [(r["logical_action"], r["tool"]) for r in recorded] == [("say:0", "acme.say"), ("say:1", "acme.say")]


async def _is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status
