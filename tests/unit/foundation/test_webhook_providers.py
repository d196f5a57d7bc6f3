"""Webhook providers come from configuration (``LONGRUN_WEBHOOK_PROVIDERS``) and installed entry
points; a bad reference stops the process naming where it came from, the reference and why; the
gateway refuses a provider it was not given, naming it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import webhook_providers
from longrun.app.webhooks import Translated
from longrun.bus.connection import Bus
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun_dependency_upgrade.webhooks import forge_event
from services.gateway.http import create_app

HOOKS_MODULE = '''
from longrun.app.webhooks import Translated

def tracker(payload):
    return Translated(str(payload["id"]), f"issue/{payload['issue']}", "issue_closed", {"by": payload["by"]})

NOT_A_PROVIDER = 42
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
    assert providers["forge"] is forge_event  # the installed example's entry point
    assert providers["tracker"]({"id": 7, "issue": 12, "by": "ana"}) == Translated(
        "7", "issue/12", "issue_closed", {"by": "ana"})


@pytest.mark.parametrize(("reference", "why"), [
    ("tracker=acme_missing:tracker", "'acme_missing:tracker': cannot import acme_missing: ModuleNotFoundError"),
    ("tracker=acme_hooks:nothing", "acme_hooks has no attribute 'nothing'"),
    ("tracker=acme_hooks:NOT_A_PROVIDER", "'acme_hooks:NOT_A_PROVIDER' is not a provider"),
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
    app = create_app(cast(AsyncEngine, None), cast(Bus, None), settings(""))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        response = await http.post("/webhooks/tracker", content=b"{}")
    assert (response.status_code, response.json()) == (404, {"error": "unknown provider 'tracker'"})
