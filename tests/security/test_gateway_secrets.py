"""The gateway refuses to start without random secrets of its own, naming each variable and never
printing a value; the secrets a provider issues are refused only when empty or a known string; every
other service, and the migration, needs none."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.fixtures import eventually
from tests.harness import SECRETS
from tests.integration.ensemble import SERVICES, Ensemble, new_key, publish_create, run_id_for, status_of
from tests.integration.identities import token

pytestmark = pytest.mark.integration

EXAMPLE_YAML = {"LONGRUN_WEBHOOK_SECRET": "CHANGE-ME", "LONGRUN_OPERATOR_TOKENS": "CHANGE-ME-1,CHANGE-ME-2",
                "LONGRUN_CONSOLE_SECRET": "CHANGE-ME"}
"""The values of infra/k8s/base/secret.example.yaml."""


def gateway_exit(services, **env: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    base = {k: v for k, v in services.env().items() if k not in SECRETS}
    done = subprocess.run([sys.executable, "-m", "longrun.services.gateway"], env={**base, **env}, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("env", [
    {},
    {"LONGRUN_OPERATOR_TOKENS": "dev-operator-token", "LONGRUN_WEBHOOK_SECRET": "dev-webhook-secret",
     "LONGRUN_CONSOLE_SECRET": "dev-console-secret"},
    EXAMPLE_YAML,
    {"LONGRUN_OPERATOR_TOKENS": "x" * 31, "LONGRUN_WEBHOOK_SECRET": "y" * 31, "LONGRUN_CONSOLE_SECRET": "z" * 31},
], ids=["none", "development", "secret.example.yaml", "31 bytes"])
def test_the_gateway_refuses_to_start_naming_each_secret_and_printing_none(services, env: dict[str, str]) -> None:
    status, output = gateway_exit(services, **env)
    assert status != 0
    for variable in ("LONGRUN_OPERATOR_TOKENS", "LONGRUN_WEBHOOK_SECRET", "LONGRUN_CONSOLE_SECRET"):
        assert variable in output
    for value in {v for given in env.values() for v in given.split(",")}:
        assert value not in output


def test_one_weak_bootstrap_token_among_good_ones_is_refused_naming_which(services) -> None:
    status, output = gateway_exit(services, **{**SECRETS, "LONGRUN_OPERATOR_TOKENS":
                                               f"{SECRETS['LONGRUN_OPERATOR_TOKENS']},test-rotation"})
    assert status != 0 and "LONGRUN_OPERATOR_TOKENS (token 2 of 2)" in output and "test-rotation" not in output
    assert SECRETS["LONGRUN_OPERATOR_TOKENS"] not in output


def test_a_provider_issued_secret_is_refused_only_when_a_known_string(services) -> None:
    status, output = gateway_exit(services, **SECRETS, LONGRUN_WEBHOOK_SECRETS="forge=CHANGE-ME")
    assert status != 0 and "the secret of provider 'forge'" in output and "CHANGE-ME" not in output


async def test_the_bootstrap_tokens_go_off_once_a_named_token_exists(clean, engine, services, tmp_path) -> None:
    status, output = gateway_exit(services, **{**SECRETS, "LONGRUN_OPERATOR_TOKENS": "off"})
    assert status != 0 and "LONGRUN_OPERATOR_TOKENS is off, yet no named token is live" in output
    secret = await token(engine, "ops-admin", "admin")
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_OPERATOR_TOKENS="off")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as http:
        assert (await http.get("/me", headers={"authorization": f"Bearer {secret}"})).status_code == 200
        assert (await http.get("/me", headers={"authorization": f"Bearer {SECRETS['LONGRUN_OPERATOR_TOKENS']}"})).status_code == 401


async def test_every_other_service_and_the_migration_run_a_job_with_no_secret_set(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the migration and every service but the gateway, started with none of the gateway's secrets
    migrated = subprocess.run([sys.executable, "-m", "longrun.db.migrate", "upgrade"],
                              env=services.env(with_secrets=False), capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    ensemble = Ensemble(services, tmp_path)
    started = [services.start(name, SERVICES[name], with_secrets=False, **ensemble.env)
               for name in ("scheduler", "worker", "relay", "timer", "reconciler")]
    # When a producer creates a run
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_={"steps": 2}, workflow="steps")
    # Then it completes, and every service is still running
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), timeout=30, what="the run created")

    async def completed() -> bool:
        return await status_of(engine, run_id) == "COMPLETED"
    await eventually(completed, timeout=60, what="the run completed")
    assert [p.name for p in started if not p.alive()] == []
