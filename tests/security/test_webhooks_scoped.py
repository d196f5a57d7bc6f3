"""Webhooks through the real gateway: an event matches only a wait of its provider (kept or not), an
unmatched kept event expires with the retention pass, and a delivery of a provider that signs the
body alone is still a repeat once the inbox has forgotten it."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time

import httpx
import pytest

from longrun.app.gateway import webhooks
from longrun.artifacts import FilesystemArtifactStore
from longrun.config import Settings
from longrun.db import runs
from longrun.db.transaction import PgTransaction
from longrun_dependency_upgrade.forge import sign_payload
from longrun.services.reconciler import retention
from longrun.services.reconciler.sweeps import horizons
from tests.integration.ensemble import WEBHOOK_SECRET, Ensemble
from tests.integration.runs_factory import waiting_for_event
from tests.integration.test_gateway import ci_event, count

pytestmark = pytest.mark.integration

ACME_SECRET = "acme-own-secret-for-scoping"
SHORT = {"LONGRUN_RETAIN_INBOX": "2s", "LONGRUN_QUARANTINE_REPLAY_WINDOW": "1s", "LONGRUN_RETAIN_WEBHOOK_EVENTS": "1s",
         "LONGRUN_RETAIN_UNMATCHED_WEBHOOK_EVENTS": "1s"}


@pytest.fixture
async def gateway(services, tmp_path):  # type: ignore[no-untyped-def]
    """A gateway taking the forge (signs the body) and acme (signs the time too), each with its own secret."""
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_WEBHOOK_PROVIDERS="acme=tests.integration.stamped_hooks:acme",
                   LONGRUN_WEBHOOK_SECRETS=f"forge={WEBHOOK_SECRET},acme={ACME_SECRET}")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        yield http


async def forge(http: httpx.AsyncClient, body: bytes) -> httpx.Response:
    return await http.post("/webhooks/forge", content=body, headers={"x-forge-signature": sign_payload(WEBHOOK_SECRET,
                                                                                                       body)})


async def acme(http: httpx.AsyncClient, body: bytes) -> httpx.Response:
    stamp = f"{time.time():.0f}"
    digest = hmac.new(ACME_SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return await http.post("/webhooks/acme", content=body, headers={"x-acme-signature": f"sha256={digest}",
                                                                    "x-acme-timestamp": stamp})


async def status(engine, run_id: str) -> str:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None
    return stored.snapshot.status.value


async def wait_starts(engine, stored):  # type: ignore[no-untyped-def]
    """What a worker does when the wait starts: match an event kept for it."""
    async with engine.begin() as conn:
        return await webhooks.match_kept(PgTransaction(conn), stored)


async def test_an_event_ends_only_a_wait_of_its_provider_kept_or_not(clean, engine, gateway) -> None:
    # Given a run waiting on the forge's CI run 41
    waiting = await waiting_for_event(engine, "ci/acme/payments/41", provider="forge")
    # When acme delivers an event with the same correlation key
    other = await acme(gateway, ci_event("acme-41", 41))
    # Then it ends nothing, and is kept for a wait of acme's
    assert other.status_code == 202 and other.json()["matched_run_id"] is None, other.text
    assert await status(engine, waiting.snapshot.run_id) == "WAITING_EVENT"
    # And the forge's own event ends the wait
    own = await forge(gateway, ci_event("forge-41", 41))
    assert own.json()["matched_run_id"] == waiting.snapshot.run_id
    # And a forge wait that starts on the key later does not take acme's kept event; an acme wait does
    late_forge = await waiting_for_event(engine, "ci/acme/payments/41", provider="forge")
    assert (await wait_starts(engine, late_forge)).snapshot.status.value == "WAITING_EVENT"
    late_acme = await waiting_for_event(engine, "ci/acme/payments/41", provider="acme")
    matched = await wait_starts(engine, late_acme)
    assert matched.snapshot.status.value == "READY"
    fact = matched.snapshot.fact("ci_result:41")
    assert fact is not None and fact.source == "webhook:acme"


async def test_unmatched_events_expire_and_a_body_signed_delivery_stays_a_repeat_after_the_inbox_forgot_it(
        clean, engine, gateway, tmp_path) -> None:
    # Given a forge event no wait matched, and one that ended a wait
    kept = await forge(gateway, ci_event("forge-kept-51", 51))
    assert kept.json()["matched_run_id"] is None
    done = await waiting_for_event(engine, "ci/acme/payments/52", provider="forge")
    matched = await forge(gateway, ci_event("forge-done-52", 52))
    assert matched.json()["matched_run_id"] == done.snapshot.run_id
    # When the reconciler's retention pass runs past every horizon (the inbox's included)
    await asyncio.sleep(2.5)
    settings = Settings.from_env(SHORT)
    await retention.run_pass(engine, FilesystemArtifactStore(tmp_path / "artifacts"), horizons(settings), batch=100,
                             archive_batch=100, orphan_grace=settings.artifact_orphan_grace)
    # Then the unmatched event has expired: a wait starting on its key now is not ended by it
    assert await count(engine, "SELECT count(*) FROM webhook_events") == 0
    assert await count(engine, "SELECT count(*) FROM inbox_gateway") == 0
    late = await waiting_for_event(engine, "ci/acme/payments/51", provider="forge")
    assert (await wait_starts(engine, late)).snapshot.status.value == "WAITING_EVENT"
    # And both deliveries, sent again now that the inbox forgot them, are answered as repeats and
    # end nothing (a captured body-signed delivery cannot be replayed)
    again = await waiting_for_event(engine, "ci/acme/payments/52", provider="forge")
    for body, run_id in ((ci_event("forge-kept-51", 51), late.snapshot.run_id),
                         (ci_event("forge-done-52", 52), again.snapshot.run_id)):
        replayed = await forge(gateway, body)
        assert replayed.status_code == 202 and replayed.json()["duplicate"] is True, replayed.text
        assert replayed.json()["matched_run_id"] is None
        assert await status(engine, run_id) == "WAITING_EVENT"
    assert await count(engine, "SELECT count(*) FROM webhook_events") == 0
    # while a new delivery still ends its wait
    fresh = await forge(gateway, ci_event("forge-new-51", 51))
    assert fresh.json()["matched_run_id"] == late.snapshot.run_id
