"""The gateway's start check refuses the secrets this repository ships as examples."""

from __future__ import annotations

import secrets

import pytest
import yaml

from longrun.config import Settings
from longrun.services.gateway import secrets_check
from tests.harness import ROOT

OWNED = ("LONGRUN_OPERATOR_TOKENS", "LONGRUN_WEBHOOK_SECRET", "LONGRUN_CONSOLE_SECRET")


def refused(env: dict[str, str], **kwargs: object) -> list[str]:
    options = {"shared_webhook_secret_used": True, "provider_secrets": (), **kwargs}
    return secrets_check.refusals(Settings.from_env(env), **options)  # type: ignore[arg-type]


def test_the_values_of_the_kubernetes_secret_template_are_refused() -> None:
    documents = yaml.safe_load_all((ROOT / "infra/k8s/base/secret.example.yaml").read_text())
    example = next(d for d in documents if d["metadata"]["name"] == "longrun")["stringData"]
    problems = refused(example)
    assert [p.split()[0] for p in problems] == ["LONGRUN_CONSOLE_SECRET", "LONGRUN_OPERATOR_TOKENS",
                                                "LONGRUN_OPERATOR_TOKENS", "LONGRUN_WEBHOOK_SECRET"]
    assert not any("CHANGE-ME" in p for p in problems)


@pytest.mark.parametrize("value", ["dev-operator-token", "test-" + "x" * 40, "CHANGE-ME-" + "x" * 40, "x" * 31])
def test_an_owned_secret_known_or_under_32_bytes_is_refused(value: str) -> None:
    good = {name: secrets.token_urlsafe(32) for name in OWNED}
    for name in OWNED:
        assert [p.split()[0] for p in refused({**good, name: value})] == [name]


def test_random_secrets_pass_and_a_provider_secret_need_only_not_be_known() -> None:
    good = {name: secrets.token_urlsafe(32) for name in OWNED}
    assert refused(good) == []
    assert refused({**good, "LONGRUN_WEBHOOK_SECRETS": "forge=short"}, provider_secrets=["forge"]) == []
    assert refused({**good, "LONGRUN_WEBHOOK_SECRETS": "forge=dev-hook"}, provider_secrets=["forge"]) != []
    assert refused({**good, "LONGRUN_OIDC_CLIENT_SECRET": "CHANGE-ME"}) != []


def test_no_secret_is_built_in_so_every_other_service_starts_without_one() -> None:
    settings = Settings.from_env({})  # every service parses these settings; none of it needs a secret
    assert (settings.operator_tokens, settings.webhook_secret, settings.console_secret) == (None, "", "")
    problems = secrets_check.refusals(settings, shared_webhook_secret_used=True, provider_secrets=())
    assert sorted(p.split()[0] for p in problems) == sorted(OWNED)
    assert all("is not set" in p for p in problems)


def test_bootstrap_tokens_switched_off_need_a_named_token_or_an_issuer() -> None:
    off = Settings.from_env({"LONGRUN_OPERATOR_TOKENS": "off"})
    assert off.operator_tokens == ()
    problems = secrets_check.refusals(off, shared_webhook_secret_used=False, provider_secrets=())
    assert not any(p.startswith("LONGRUN_OPERATOR_TOKENS") for p in problems)
    assert secrets_check.bootstrap_off_refusal(off, named_tokens=False) is not None
    assert secrets_check.bootstrap_off_refusal(off, named_tokens=True) is None
