"""Principals: what their roles allow, the tenants they see, the approvals they may decide, and what
a verified JWT's claims make of one."""

from __future__ import annotations

import re

import pytest
from longrun_client.operator_api import CREATE_RUNS

from longrun.principals import ROLES, Principal, from_claims
from longrun.services.gateway.api_types import TOKEN_NAME

CLAIMS = {"roles_claim": "roles", "tenants_claim": "tenants", "groups_claim": "groups"}


def principal(*roles: str, tenants: frozenset[str] | None = None, groups: frozenset[str] = frozenset()) -> Principal:
    return Principal("ana", frozenset(roles), tenants, groups)


@pytest.mark.parametrize("held", ROLES)
def test_a_role_allows_what_the_roles_before_it_allow_and_nothing_after(held: str) -> None:
    rank = ROLES.index(held)
    assert [principal(held).may(r) for r in ROLES] == [i <= rank for i in range(len(ROLES))]


def test_no_role_allows_nothing_and_unknown_roles_count_for_nothing() -> None:
    assert not any(principal().may(r) for r in ROLES)
    assert not any(principal("superuser").may(r) for r in ROLES)


def test_create_runs_stands_beside_the_roles_none_of_which_carries_it_nor_does_it_carry_one() -> None:
    assert not any(principal(role).holds(CREATE_RUNS) for role in ROLES)
    producer = Principal("bot", frozenset(), frozenset({"acme"}), permissions=frozenset({CREATE_RUNS}))
    assert producer.holds(CREATE_RUNS) and not any(producer.may(r) for r in ROLES)
    assert not Principal("bot", frozenset(), None, permissions=frozenset({"superpower"})).holds("superpower")


def test_a_jwts_roles_claim_carries_its_permissions_beside_its_roles() -> None:
    made = from_claims({"sub": "bot", "roles": ["viewer", "create_runs", "root"], "tenants": ["acme"]}, **CLAIMS)
    assert made.roles == frozenset({"viewer"}) and made.permissions == frozenset({CREATE_RUNS})


def test_tenants_none_sees_every_tenant_and_a_set_only_its_own() -> None:
    assert principal("viewer").sees("globex")
    scoped = principal("admin", tenants=frozenset({"acme"}))
    assert scoped.sees("acme") and not scoped.sees("globex")
    assert not principal("admin", tenants=frozenset()).sees("acme")


@pytest.mark.parametrize(("owner", "who", "allowed"), [
    (None, principal("viewer"), True),
    ("ana", principal("approver"), True),
    ("bob", principal("admin"), False),
    ("role:approver", principal("admin"), True),
    ("role:admin", principal("approver"), False),
    ("role:nonsense", principal("admin"), False),
    ("group:release", principal("approver", groups=frozenset({"release"})), True),
    ("group:release", principal("admin", groups=frozenset({"dev"})), False),
    ("group:ana", principal("admin"), False),
])
def test_an_owner_names_a_subject_a_role_or_a_group(owner: str | None, who: Principal, allowed: bool) -> None:
    assert who.is_owner(owner) is allowed


def test_an_identity_providers_user_is_namespaced_by_its_issuer_and_no_token_name_reaches_it() -> None:
    alice = from_claims({"sub": "alice", "iss": "https://id.example.test", "roles": ["approver"]}, **CLAIMS)
    assert alice.is_owner("https://id.example.test|alice")
    assert not alice.is_owner("alice")  # a bare name is the named token of that name
    assert not from_claims({"sub": "alice", "iss": "https://other.example.test"}, **CLAIMS).is_owner(
        "https://id.example.test|alice")
    assert not re.fullmatch(TOKEN_NAME, "https://id.example.test|alice")  # no token is named like her


def test_claims_make_a_principal_keeping_known_roles_and_reading_lists_or_spaced_names() -> None:
    made = from_claims({"sub": "ana@example.test", "roles": "approver root", "tenants": ["acme", 7],
                        "groups": ["release"], "iss": "https://id.example.test"}, **CLAIMS)
    assert made == Principal("https://id.example.test|ana@example.test", frozenset({"approver"}), frozenset({"acme"}),
                             frozenset({"release"}), credential="oidc:https://id.example.test")
    assert from_claims({"sub": "root", "roles": ["admin"], "tenants": "*"}, **CLAIMS).tenants is None
    bare = from_claims({"sub": "x"}, **CLAIMS)
    assert bare.roles == frozenset() and bare.tenants == frozenset() and bare.groups == frozenset()
    custom = from_claims({"sub": "x", "https://longrun/roles": ["viewer"]}, roles_claim="https://longrun/roles",
                         tenants_claim="t", groups_claim="g")
    assert custom.roles == frozenset({"viewer"})
