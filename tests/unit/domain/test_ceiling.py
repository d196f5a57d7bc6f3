"""A tenant's ceiling: which one holds (set, else the value in force, else the kinds' maximum), and the
check of a change against it, setting by setting, naming both values when it goes beyond."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from longrun.domain import Scope
from longrun.domain.ceiling import (
    IN_FORCE,
    KINDS_MAXIMUM,
    SET,
    beyond,
    effective,
    patterns_beyond,
    scope_limits,
)
from longrun.domain.scope import allowed, intersect

names = st.from_regex(r"[ab.]{1,4}", fullmatch=True)
patterns = st.one_of(names, names.map(lambda n: n + "*"), st.just("*"))
pattern_sets = st.lists(patterns, max_size=4)

ACME = {"tools": ["forge.*"], "resources": ["repo:acme/*"]}


def test_narrowing_within_the_set_ceiling_passes() -> None:
    ceiling = effective("acme", ACME, {"tools": ["*"], "resources": ["*"]}, version=2)
    assert ceiling.origins == {"tools": SET, "resources": SET} and ceiling.version == 2
    for asked in (ACME, {"tools": ["forge.open_merge_request"], "resources": ["repo:acme/web", "repo:acme/api*"]},
                  {"tools": [], "resources": []}):
        assert beyond(asked, ceiling) is None, asked


def test_widening_past_the_set_ceiling_is_refused_naming_both_values_and_what_lies_beyond() -> None:
    ceiling = effective("acme", ACME, None, version=3)
    why = beyond({"tools": ["*"], "resources": ["repo:acme/*", "repo:globex/web"]}, ceiling)
    assert why == ("tenant 'acme': tools ['*'] go beyond the ceiling's ['forge.*'] (set by an admin of every "
                   "tenant, v3): '*' not within it; resources ['repo:acme/*', 'repo:globex/web'] go beyond the "
                   "ceiling's ['repo:acme/*'] (set by an admin of every tenant, v3): 'repo:globex/web' not within it")


def test_without_a_ceiling_the_value_in_force_is_the_ceiling() -> None:
    ceiling = effective("acme", None, ACME)
    assert ceiling.limits == ACME and ceiling.origins == {"tools": IN_FORCE, "resources": IN_FORCE}
    assert ceiling.version is None
    assert beyond({"tools": ["forge.merge"], "resources": ["repo:acme/web"]}, ceiling) is None
    why = beyond({"tools": ["forge.*"], "resources": ["repo:*"]}, ceiling)
    assert why is not None and "resources ['repo:*'] go beyond the ceiling's ['repo:acme/*'] (the value in force: " \
                               "no ceiling is set): 'repo:*' not within it" in why and "tools" not in why


def test_without_a_ceiling_or_a_value_the_kinds_maximum_holds_and_nothing_goes_beyond_it() -> None:
    ceiling = effective("acme", None, None)
    assert ceiling.limits == {"tools": ["*"], "resources": ["*"]}
    assert ceiling.origins == {"tools": KINDS_MAXIMUM, "resources": KINDS_MAXIMUM}
    assert beyond({"tools": ["*"], "resources": ["*"]}, ceiling) is None


def test_a_setting_the_stored_ceiling_lacks_falls_back_setting_by_setting() -> None:
    ceiling = effective("acme", {"tools": ["forge.*"]}, {"tools": ["*"], "resources": ["repo:acme/*"]}, version=1)
    assert ceiling.limits == ACME and ceiling.origins == {"tools": SET, "resources": IN_FORCE}


def test_a_policy_scope_is_a_document_of_settings() -> None:
    assert scope_limits(Scope(("forge.*",), ("repo:acme/*",))) == ACME


@given(pattern_sets, pattern_sets, names)
def test_within_means_the_narrower_never_allows_what_the_ceiling_refuses(asked: list[str], ceiling: list[str],
                                                                         name: str) -> None:
    if not patterns_beyond(asked, ceiling):
        assert not allowed(asked, name) or allowed(ceiling, name)
        assert set(intersect(asked, ceiling)) == set(intersect(asked, asked))
