"""Webhook providers come from configuration (``LONGRUN_WEBHOOK_PROVIDERS``) and installed entry
points; a bad reference stops the process naming where it came from, the reference and why; the
gateway refuses a provider it was not given, naming it. Each provider's signature scheme decides
what is genuine, and a timestamped one what is fresh."""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
from starlette.datastructures import Headers
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import webhook_providers
from longrun.app.gateway.webhooks import refusal
from longrun.bus.connection import Bus
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.ports.webhooks import Signature, Translated
from longrun_dependency_upgrade.webhooks import forge
from longrun.services.gateway.http import create_app

HOOKS_MODULE = '''
from longrun.ports.webhooks import Provider, Signature, Translated

def closed(payload):
    return Translated(str(payload["id"]), f"issue/{payload['issue']}", "issue_closed", {"by": payload["by"]})

tracker = Provider(closed, Signature("x-tracker-signature", timestamp_header="x-tracker-timestamp"))
NOT_A_PROVIDER = closed
'''


@pytest.fixture
def author(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "acme_hooks.py").write_text(HOOKS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "acme_hooks"
    sys.modules.pop("acme_hooks", None)


def settings(providers: str) -> Settings:
    return Settings.from_env({"LONGRUN_WEBHOOK_PROVIDERS": providers})


def test_a_named_reference_and_an_installed_entry_point_are_both_providers(author: str) -> None:
    providers = webhook_providers.load(settings(f"tracker={author}:tracker"))
    assert providers["forge"] is forge  # the installed example's entry point
    assert providers["tracker"].translate({"id": 7, "issue": 12, "by": "ana"}) == Translated(
        "7", "issue/12", "issue_closed", {"by": "ana"})


@pytest.mark.parametrize(("reference", "why"), [
    ("tracker=acme_missing:tracker", "'acme_missing:tracker': cannot import acme_missing: ModuleNotFoundError"),
    ("tracker=acme_hooks:nothing", "acme_hooks has no attribute 'nothing'"),
    ("tracker=acme_hooks:NOT_A_PROVIDER", "'acme_hooks:NOT_A_PROVIDER' is not a provider (a "
     "longrun.ports.webhooks.Provider): got function"),
    ("forge=acme_hooks:tracker", "provider 'forge' is named twice"),
])
def test_a_bad_reference_names_where_it_came_from_the_reference_and_why(author: str, reference: str,
                                                                        why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        webhook_providers.load(settings(reference))
    assert why in str(raised.value)


def test_a_malformed_setting_names_the_variable_and_what_is_expected() -> None:
    with pytest.raises(ConfigError) as raised:
        settings("acme_hooks:tracker")
    assert "LONGRUN_WEBHOOK_PROVIDERS" in str(raised.value) and "name=package.module:attribute" in str(raised.value)


def test_an_installed_distribution_brings_its_providers_by_entry_point(author: str, tmp_path: Path) -> None:
    info = tmp_path / "acme_hooks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-hooks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{webhook_providers.ENTRY_POINT_GROUP}]\ntracker = acme_hooks:tracker\n"
                                           "broken = acme_hooks:nothing\n")
    with pytest.raises(ConfigError) as raised:
        webhook_providers.load(settings(""))
    assert "entry point broken (longrun.webhook_providers) of acme-hooks" in str(raised.value)
    assert "'acme_hooks:nothing' cannot be loaded" in str(raised.value)
    (info / "entry_points.txt").write_text(f"[{webhook_providers.ENTRY_POINT_GROUP}]\ntracker = acme_hooks:tracker\n")
    assert set(webhook_providers.load(settings(""))) == {"forge", "tracker"}


async def test_the_gateway_refuses_a_provider_it_was_not_given_naming_it() -> None:
    # Refused before the signature is checked or anything stored: no database or broker needed.
    app = create_app(cast(AsyncEngine, None), cast(Bus, None),
                     Settings.from_env({"LONGRUN_WEBHOOK_SECRET": "forge-own-secret"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        response = await http.post("/webhooks/tracker", content=b"{}")
    assert (response.status_code, response.json()) == (404, {"error": "unknown provider 'tracker'"})


SECRET = "s3cret"
STAMPED = Signature("x-acme-signature", timestamp_header="x-acme-timestamp")
BODY = b'{"id": 1}'


def signed(signature: Signature, body: bytes, *, sent_at: float | None = None, secret: str = SECRET) -> Headers:
    stamp = None if sent_at is None else f"{sent_at:.0f}"
    message = body if stamp is None else stamp.encode() + b"." + body
    headers = {signature.header: "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()}
    if stamp is not None:
        assert signature.timestamp_header is not None
        headers[signature.timestamp_header] = stamp
    return Headers(headers)


def refused(signature: Signature, headers: Headers, body: bytes = BODY, *, now: float = 1_000_000.0) -> str | None:
    return refusal(signature, SECRET, headers, body, now=now, replay_window=300)


def test_a_body_signature_is_checked_and_a_timestamp_is_not_asked_for() -> None:
    body_only = forge.signature
    assert refused(body_only, signed(body_only, BODY)) is None
    assert refused(body_only, signed(body_only, BODY, secret="other")) == "bad or missing signature"
    assert refused(body_only, signed(body_only, BODY), body=b'{"id": 2}') == "bad or missing signature"
    assert refused(body_only, Headers({})) == "bad or missing signature"


def test_a_timestamped_signature_covers_the_time_and_is_refused_outside_the_window() -> None:
    now = 1_000_000.0
    assert refused(STAMPED, signed(STAMPED, BODY, sent_at=now - 299), now=now) is None
    assert refused(STAMPED, signed(STAMPED, BODY, sent_at=now - 301), now=now) == (
        "sent 301s ago, outside the 300s replay window")
    assert refused(STAMPED, signed(STAMPED, BODY, sent_at=now + 400), now=now) == (
        "stamped 400s ahead of the gateway's clock, outside the 300s replay window")
    # The time is part of what is signed: moving it forward breaks the signature.
    moved = Headers({**signed(STAMPED, BODY, sent_at=now - 3600), "x-acme-timestamp": f"{now:.0f}"})
    assert refused(STAMPED, moved, now=now) == "bad or missing signature"
    assert refused(STAMPED, Headers({"x-acme-signature": "sha256=00"}), now=now) == "missing x-acme-timestamp header"
    assert refused(STAMPED, Headers({"x-acme-signature": "sha256=00", "x-acme-timestamp": "yesterday"}),
                   now=now) == "x-acme-timestamp is not Unix seconds: 'yesterday'"


def test_no_secret_is_shared_across_providers(author: str) -> None:
    both = f"tracker={author}:tracker"
    # a lone provider may take LONGRUN_WEBHOOK_SECRET; by default there is none, and the gateway stops
    assert webhook_providers.secrets(Settings.from_env({"LONGRUN_WEBHOOK_SECRET": "s-forge"}),
                                     {"forge": forge}) == {"forge": "s-forge"}
    with pytest.raises(ConfigError, match="no secret for provider 'forge'"):
        webhook_providers.secrets(Settings.from_env({}), {"forge": forge})
    # with two, LONGRUN_WEBHOOK_SECRET serves neither: each needs its own, and no two the same
    two = Settings.from_env({"LONGRUN_WEBHOOK_PROVIDERS": both, "LONGRUN_WEBHOOK_SECRET": "the-one-secret"})
    with pytest.raises(ConfigError, match="no secret for provider 'forge', 'tracker'") as missing:
        webhook_providers.secrets(two, webhook_providers.load(two))
    assert "the-one-secret" not in str(missing.value)
    shared = Settings.from_env({"LONGRUN_WEBHOOK_PROVIDERS": both, "LONGRUN_WEBHOOK_SECRETS": "forge=s1,tracker=s1"})
    with pytest.raises(ConfigError, match="providers 'forge', 'tracker' share a secret; each needs its own") as same:
        webhook_providers.secrets(shared, webhook_providers.load(shared))
    assert "s1" not in str(same.value).replace("LONGRUN_WEBHOOK_SECRETS", "")
    own = Settings.from_env({"LONGRUN_WEBHOOK_PROVIDERS": both, "LONGRUN_WEBHOOK_SECRETS": "forge=s1,tracker=s2"})
    assert webhook_providers.secrets(own, webhook_providers.load(own)) == {"forge": "s1", "tracker": "s2"}
