"""Which tenant tool group bounds a tool (``domain.tool_permits``): its own name first, else the
longest prefix group it starts with, else none; and the wait of a call whose group is full."""

from __future__ import annotations

from longrun.domain.slots import SLOTLESS_WAITS
from longrun.domain.tool_permits import TOOL_CONCURRENCY_WAIT, bounded_group, permit_wait

BOUNDS = {"forge.*": 4, "forge.merge": 1, "forge.ci.*": 2, "search": 3}


def test_a_tool_named_by_a_group_is_bounded_by_it_before_any_prefix() -> None:
    assert bounded_group("forge.merge", BOUNDS) == ("forge.merge", 1)
    assert bounded_group("search", BOUNDS) == ("search", 3)


def test_a_tool_is_bounded_by_the_longest_prefix_group_it_starts_with() -> None:
    assert bounded_group("forge.create_branch", BOUNDS) == ("forge.*", 4)
    assert bounded_group("forge.ci.status", BOUNDS) == ("forge.ci.*", 2)
    assert bounded_group("forge.", BOUNDS) == ("forge.*", 4)


def test_a_tool_no_group_names_is_not_bounded() -> None:
    assert bounded_group("searcher", BOUNDS) is None  # a group without `*` is a name, not a prefix
    assert bounded_group("forg", BOUNDS) is None
    assert bounded_group("anything", {}) is None
    assert bounded_group("anything", {"*": 5}) == ("*", 5)


def test_a_call_waiting_for_a_permit_shows_its_group_holds_no_slot_and_looks_again_by_itself() -> None:
    wait = permit_wait(wait_id="w1", group="forge.*", logical_action="branch", now=100.0, max_wait=600.0)
    assert (wait.kind, wait.correlation_key, wait.subject) == (TOOL_CONCURRENCY_WAIT, "tool_concurrency:forge.*",
                                                               "branch")
    assert wait.wake_at == wait.deadline == 700.0
    assert TOOL_CONCURRENCY_WAIT in SLOTLESS_WAITS
