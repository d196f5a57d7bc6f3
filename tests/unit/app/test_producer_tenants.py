"""Which broker users may create runs in which tenants (LONGRUN_PRODUCER_TENANTS)."""

from __future__ import annotations

import pytest

from longrun.bus.codec import broker_user
from longrun.errors import ConfigError
from longrun.services.scheduler.producers import on_this_machine, producer_tenants

LOCAL = "amqp://guest:guest@127.0.0.1:5672/"
REMOTE = "amqp://longrun:secret@rabbitmq.example:5672/"


def test_a_user_creates_only_in_its_tenants_and_a_create_naming_no_user_in_none() -> None:
    grants = producer_tenants((("billing", "acme"), ("billing", "beta"), ("ops", "*")), REMOTE)
    assert grants.allows("billing", "acme") and grants.allows("billing", "beta")
    assert not grants.allows("billing", "other")
    assert grants.allows("ops", "anyone")
    assert not grants.allows("stranger", "acme")
    assert not grants.allows(None, "acme")


def test_the_runtimes_own_user_creates_in_every_tenant_and_guest_only_in_development() -> None:
    assert producer_tenants((), REMOTE).allows("longrun", "acme")
    assert producer_tenants((), LOCAL).allows("guest", "acme")
    assert not producer_tenants((), "amqp://guest:guest@rabbitmq.example:5672/").allows("guest", "acme")
    assert producer_tenants((("guest", "acme"),), "amqp://localhost/").allows("guest", "acme")
    with pytest.raises(ConfigError, match="LONGRUN_PRODUCER_TENANTS: 'guest' may create runs only in development"):
        producer_tenants((("guest", "acme"),), REMOTE)


def test_a_grant_names_a_tenant_or_every_tenant() -> None:
    with pytest.raises(ConfigError) as refused:
        producer_tenants((("billing", "acme.prod"), ("ops", "a*")), REMOTE)
    assert [why for _, why in refused.value.problems] == [
        "billing=acme.prod: 'acme.prod' is neither a tenant id nor *", "ops=a*: 'a*' is neither a tenant id nor *"]


def test_a_url_names_its_user_and_where_the_broker_is() -> None:
    assert [broker_user(u) for u in (REMOTE, "amqp://h/", "amqp://a%40b:p@h1:1,h2:2/v")] == ["longrun", "guest", "a@b"]
    assert on_this_machine("amqp://u:p@127.0.0.1:5672,[::1]:5673/") and on_this_machine("amqp://localhost/")
    assert not on_this_machine("amqp://u:p@127.0.0.1:5672,rabbitmq:5672/")
