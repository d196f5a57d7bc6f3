"""A run's scope: computed once from the kind's maximum, the tenant's policy and the producer's request;
narrowing never widens, and the check before each call names what it refused and why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longrun.domain import (
    DENIED_FACT_PREFIX,
    PermissionDenied,
    RunCreated,
    RunStatus,
    RunStatusChanged,
    Scope,
    TenantPolicy,
    event_from_dict,
    event_to_dict,
    fold,
    narrow,
    refusal,
    revalidated,
)
from longrun.domain.scope import allowed, covers, intersect
from longrun.errors import EventRejected

from .support import History

names = st.from_regex(r"[ab.]{1,4}", fullmatch=True)
patterns = st.one_of(names, names.map(lambda n: n + "*"), st.just("*"))
pattern_sets = st.lists(patterns, max_size=4)


@pytest.mark.parametrize("bad", ["", "forge.*.write", "*forge", "a**"])
def test_a_pattern_is_a_name_or_a_prefix_ending_in_a_star(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("*", r"\*")):
        Scope(tools=(bad,))


def test_prefix_patterns_cover_names_and_narrower_prefixes() -> None:
    assert covers("forge.*", "forge.open_merge_request") and covers("forge.*", "forge.open_*")
    assert covers("*", "anything") and not covers("forge.open_*", "forge.*")
    assert not covers("forge.read", "forge.read_file")


@given(pattern_sets, pattern_sets, names)
def test_the_intersection_allows_exactly_what_both_allow(a: list[str], b: list[str], name: str) -> None:
    assert allowed(intersect(a, b), name) == (allowed(a, name) and allowed(b, name))


@given(pattern_sets, pattern_sets, pattern_sets, names, names)
def test_narrowing_never_widens(kind: list[str], policy: list[str], asked: list[str], tool: str,
                               resource: str) -> None:
    maximum = Scope(tuple(kind), tuple(kind))
    scope = narrow(maximum, TenantPolicy("t", 2, Scope(tuple(policy), tuple(policy))), Scope(tuple(asked), ("*",)))
    if refusal(scope, tool, resource) is None:
        assert refusal(maximum, tool, resource) is None
        assert allowed(policy, tool) and allowed(policy, resource) and allowed(asked, tool)


def test_a_producer_asking_for_more_than_the_kind_and_tenant_allow_gets_only_what_they_allow() -> None:
    kind = Scope(tools=("notes.*",), resources=("doc:*",))
    policy = TenantPolicy("acme", 3, Scope(tools=("notes.write", "notes.read"), resources=("doc:public/*",)))
    scope = narrow(kind, policy, Scope(tools=("*",), resources=("doc:*", "db:*")))
    assert scope == Scope(("notes.read", "notes.write"), ("doc:public/*",), policy_version=3)
    assert refusal(scope, "notes.write", "doc:public/a") is None
    assert refusal(scope, "notes.delete", "doc:public/a") == (
        "tool 'notes.delete' is outside the run's scope (tools ['notes.read', 'notes.write'], "
        "resources ['doc:public/*'], tenant policy v3)")
    assert "resource 'doc:secret/a' of tool 'notes.write' is outside" in str(
        refusal(scope, "notes.write", "doc:secret/a"))


def test_a_tool_that_declares_no_resource_is_checked_by_name_only() -> None:
    assert refusal(Scope(("notes.*",), ()), "notes.write", None) is None


def test_without_a_policy_or_a_request_the_kinds_maximum_is_the_scope() -> None:
    assert narrow(Scope(("a.*",), ("r:*",))) == Scope(("a.*",), ("r:*",), None)


def test_a_changed_policy_narrows_the_scope_it_is_revalidated_under_and_never_widens_it() -> None:
    scope = narrow(Scope(("notes.*",)), TenantPolicy("acme", 1, Scope(("notes.*",))))
    assert revalidated(scope, TenantPolicy("acme", 1, Scope(("notes.*",)))) is scope
    assert revalidated(scope, None) is scope
    narrower = revalidated(scope, TenantPolicy("acme", 2, Scope(("notes.write",))))
    assert narrower == Scope(("notes.write",), ("*",), policy_version=2)
    wider = revalidated(scope, TenantPolicy("acme", 3, Scope(("*",))))
    assert wider.tools == ("notes.*",)


def test_a_refusal_is_recorded_as_a_fact_of_a_running_run_and_folds_like_any_event() -> None:
    h = History()
    with pytest.raises(EventRejected, match="only a worker's step is refused a call"):
        h.apply(PermissionDenied, logical_action="rm:1", tool="forge.delete_repo", resource="repo:payments",
                request_hash="h1", reason="tool 'forge.delete_repo' is outside the run's scope")
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    h.apply(PermissionDenied, logical_action="rm:1", tool="forge.delete_repo", resource="repo:payments",
            request_hash="h1", reason="tool 'forge.delete_repo' is outside the run's scope")
    refused = h.snapshot.fact(DENIED_FACT_PREFIX + "rm:1")
    assert refused is not None and refused.source == "runtime" and refused.value["resource"] == "repo:payments"
    assert h.snapshot.actions == () and fold(event_from_dict(event_to_dict(e)) for e in h.events) == h.snapshot
    assert h.snapshot.permissions == Scope(("forge.*",), ("repo:payments",))


def test_a_run_created_before_scopes_has_none_and_is_not_restricted() -> None:
    created = event_to_dict(History().events[0]) | {"permissions": []}
    legacy = event_from_dict(created)
    assert isinstance(legacy, RunCreated) and legacy.permissions is None
