"""The issuer's signing keys and discovery document, as the gateway keeps them: keys run out after
``LONGRUN_OIDC_CACHE_TTL``, a token naming an unknown key id fetches the JWKS again at most once per
``LONGRUN_OIDC_REFRESH_INTERVAL``, and the discovery document is cached and refused when it names
another issuer. Against the tests' local identity provider."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration import oidc_provider
from tests.integration.ensemble import Ensemble

TTL = 3.0
ADMIN = {"sub": "root", "roles": ["admin"], "tenants": "*"}


async def _gateway(services, tmp_path, provider: oidc_provider.Provider, **env: str) -> str:  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", **provider.gateway_env(), **env)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble.gateway_url


@pytest.mark.long
async def test_keys_run_out_a_rotated_key_is_fetched_and_unknown_key_ids_do_not_hammer_the_issuer(
        clean, services, tmp_path) -> None:
    async with oidc_provider.serving(client_id="c", client_secret="s", audience="longrun-api", user=ADMIN) as idp:
        url = await _gateway(services, tmp_path, idp, LONGRUN_OIDC_CACHE_TTL=f"{TTL:g}s",
                             LONGRUN_OIDC_REFRESH_INTERVAL="60s")
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            async def status(token: str) -> int:
                return (await http.get("/me", headers={"authorization": f"Bearer {token}"})).status_code

            # Given a token of the issuer's key, taken once its JWKS is fetched
            old = idp.sign(ADMIN)
            assert await status(old) == 200
            assert idp.fetches["jwks"] == 1
            # When the issuer rotates its keys, the old key still verifies while the cache is in date
            idp.rotate()
            assert await status(old) == 200
            # Then once the cache has run out it no longer does
            await asyncio.sleep(TTL + 0.5)
            assert await status(old) == 401
            assert idp.fetches["jwks"] == 2
            # And a token of the new key is taken without another fetch
            assert await status(idp.sign(ADMIN)) == 200
            assert idp.fetches["jwks"] == 2
            # And a stream of tokens naming made-up key ids is refused without fetching the JWKS again
            # (the last fetch is under the refresh interval old)
            for n in range(20):
                assert await status(idp.sign(ADMIN, kid=f"made-up-{n}")) == 401
            assert idp.fetches["jwks"] == 2


async def test_a_key_id_seen_for_the_first_time_is_fetched_at_once(clean, services, tmp_path) -> None:
    async with oidc_provider.serving(client_id="c", client_secret="s", audience="longrun-api", user=ADMIN) as idp:
        url = await _gateway(services, tmp_path, idp, LONGRUN_OIDC_CACHE_TTL="1h", LONGRUN_OIDC_REFRESH_INTERVAL="1s")
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.get("/me", headers={"authorization": f"Bearer {idp.sign(ADMIN)}"})).status_code == 200
            idp.rotate()
            await asyncio.sleep(1.2)
            rotated = await http.get("/me", headers={"authorization": f"Bearer {idp.sign(ADMIN)}"})
            assert rotated.status_code == 200, rotated.text
            assert idp.fetches["jwks"] == 2


async def test_the_discovery_document_is_cached_and_refused_when_it_names_another_issuer(
        clean, services, tmp_path) -> None:
    async with oidc_provider.serving(client_id="longrun-console", client_secret="console-secret",
                                     audience="longrun-api", user=ADMIN) as idp:
        url = await _gateway(services, tmp_path, idp)
        async with httpx.AsyncClient(base_url=f"{url}/console", timeout=10) as console:
            # Given an issuer whose discovery document is its own: sign-ins leave for it, asking it once
            for _ in range(3):
                leaving = await console.get("/oidc/start")
                assert leaving.status_code == 303 and leaving.headers["location"].startswith(f"{idp.url}/authorize")
            assert idp.fetches["discovery"] == 1
        # When a document names another issuer (an impostor at the configured address)
        idp.claimed_issuer = "https://impostor.example.test"
        (tmp_path / "second").mkdir()
        other = await _gateway(services, tmp_path / "second", idp)
        async with httpx.AsyncClient(base_url=f"{other}/console", timeout=10) as console:
            refused = await console.get("/oidc/start")
        # Then no sign-in leaves for it
        assert refused.status_code == 502 and "impostor.example.test" in refused.text
        assert "location" not in refused.headers
