"""A run whose kind's ``decide`` raises, through the real services: each failure is in its history with the
error's type, the steps are tried again on the timer service's durable timers after the kind's backoff
(not when the worker's lease expires), the third failure leaves it NEEDS_ATTENTION showing the error
(``GET /runs/{id}``, ``longrunctl run show``, the console), and an operator's ``longrunctl run retry``
once the fixed kind is deployed completes it.

The kind is ``tests/integration/poison_kinds.py``: ``counting`` cannot read ``{"steps": "abc"}`` until
it is deployed again with ``POISON_FIXED=1``.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures import eventually
from tests.integration import identities
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of
from tests.integration.poison_kinds import STEP_RETRY

pytestmark = pytest.mark.integration

KINDS = {"LONGRUN_RUN_KINDS": "tests.integration.poison_kinds:kinds"}
LONGRUNCTL = Path(sys.executable).parent / "longrunctl"
LEASE_TTL = 5.0  # the ensemble's LONGRUN_RUN_LEASE_TTL: a retry at lease expiry would come this late


@pytest.mark.long
async def test_a_run_whose_decide_raises_backs_off_then_needs_attention_and_a_retry_after_the_fix_completes(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("gateway", "scheduler", "relay", "timer", **KINDS)
    broken = ensemble.start("worker", "longrun.services.worker", **KINDS)
    # When a producer creates a run with an input its kind's decide cannot read
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_={"steps": "abc"}, workflow="counting")
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    await eventually(lambda: _is(engine, run_id, "NEEDS_ATTENTION"), timeout=30, what="NEEDS_ATTENTION")

    # Then each failure is on record with its error, counted, and the last gives up (no retry)
    failures = [data for kind, data in await event_types(engine, run_id) if kind == "run.step_failed"]
    assert [(f["phase"], f["error_type"], f["attempt"], f["retry"] is None) for f in failures] == [
        ("decide", "ValueError", 1, False), ("decide", "ValueError", 2, False), ("decide", "ValueError", 3, True)]
    assert "invalid literal for int()" in failures[0]["message"]
    # spaced by the kind's backoff (0.5 s, then 1 s), well before a lease would have expired
    gaps = [later["at"] - earlier["at"] for earlier, later in zip(failures, failures[1:], strict=False)]
    assert STEP_RETRY.initial_interval <= gaps[0] < LEASE_TTL, gaps
    assert STEP_RETRY.initial_interval * STEP_RETRY.backoff_coefficient <= gaps[1] < LEASE_TTL, gaps
    assert [f["retry"]["wake_at"] - f["at"] for f in failures[:2]] == pytest.approx([0.5, 1.0], abs=0.05)

    # and the operator API, longrunctl and the console show the error and offer the retry
    operator = await identities.token(engine, "ana", "operator", tenants=("acme",))
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10,
                                 headers={"authorization": f"Bearer {operator}"}) as api:
        shown = (await api.get(f"/runs/{run_id}")).json()
        assert shown["snapshot"]["failure"]["error_type"] == "ValueError"
        assert shown["snapshot"]["failure"]["attempt"] == 3 and "retry" in shown["allowed_operations"]
    show = await _longrunctl(ensemble, operator, "-o", "table", "run", "show", run_id)
    assert re.search(r"failing\s+decide raised ValueError: invalid literal for int\(\)", show.stdout), show.stdout
    page = await _console_page(ensemble, operator, run_id)
    assert 'id="failure"' in page and "ValueError" in page and 'id="retry-run"' in page

    # When the fixed kind is deployed (the same version) and an operator retries the run
    broken.terminate()
    ensemble.start("worker", "longrun.services.worker", POISON_FIXED="1", **KINDS)
    retried = await _longrunctl(ensemble, operator, "run", "retry", run_id, "--reason", "int() fixed in 1.0.1")
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["status"] == "READY"

    # Then it completes, with the failures still in its history, and a second retry is refused
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    history = [kind for kind, _ in await event_types(engine, run_id)]
    assert history.count("run.step_failed") == 3 and history[-2:] == ["run.completed", "run.summary"]
    again = await _longrunctl(ensemble, operator, "run", "retry", run_id, "--reason", "once more")
    assert again.returncode != 0 and "is COMPLETED, not NEEDS_ATTENTION" in again.stderr, again.stderr


async def _is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status


async def _longrunctl(ensemble: Ensemble, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    output = [] if "-o" in args else ["-o", "json"]
    argv = [str(LONGRUNCTL), "--url", ensemble.gateway_url, "--token", token, *output, *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


async def _console_page(ensemble: Ensemble, token: str, run_id: str) -> str:
    """The run's console page, signed in with ``token``."""
    async with httpx.AsyncClient(base_url=f"{ensemble.gateway_url}/console", timeout=10) as console:
        sign_in = await console.get("/sign-in")
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', sign_in.text)
        assert csrf, sign_in.text
        signed = await console.post("/sign-in", data={"token": token, "csrf": csrf.group(1)})
        assert signed.status_code == 303, signed.text
        page = await console.get(f"/runs/{run_id}")
        assert page.status_code == 200, page.text
        return page.text
