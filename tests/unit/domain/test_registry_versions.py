"""Workflow versions are ordered as versions, not as strings: the scheduler pins the newest."""

from __future__ import annotations

import pytest

from longrun.authoring import Registry, RunKind, pins_key
from longrun.domain import PinnedVersions
from longrun.workflows.steps import Steps


def kind(version: str) -> RunKind:
    return RunKind("steps", PinnedVersions(workflow=version, prompt="none", model_policy="none",
                                           tool_schemas="s1"), Steps(), {})


@pytest.mark.parametrize(("versions", "newest"), [
    (["9", "10"], "10"),  # as strings, "9" > "10"
    (["1.9", "1.10"], "1.10"),
    (["2.0rc1", "1.5"], "2.0rc1"),
    (["2.0", "2.0rc1"], "2.0"),  # a release is newer than its candidates
    (["2.0.dev1", "2.0a1"], "2.0a1"),
])
def test_the_newest_workflow_version_is_ordered_as_a_version(versions: list[str], newest: str) -> None:
    for ordering in (versions, list(reversed(versions))):
        assert Registry([kind(v) for v in ordering]).newest("steps").versions.workflow == newest


def test_a_pinned_version_is_found_by_its_own_spelling() -> None:
    registry = Registry([kind("1"), kind("10")])
    assert registry.get("steps", "10").versions.workflow == "10"
    with pytest.raises(LookupError, match="no run kind 'steps' at workflow version '1.0'"):
        registry.get("steps", "1.0")


def test_a_workflow_version_that_is_no_version_is_refused_naming_the_kind() -> None:
    with pytest.raises(ValueError, match="run kind 'steps': workflow version 'memory-v1' is not a version"):
        Registry([kind("memory-v1")])


def test_a_worker_serves_exactly_the_pins_it_has() -> None:
    # The same workflow version with another prompt is another build: compared for equality
    registry = Registry([kind("1"), kind("2")])
    other_prompt = PinnedVersions(workflow="1", prompt="p2", model_policy="none", tool_schemas="s1")
    assert pins_key("steps", kind("1").versions) in registry.serves()
    assert pins_key("steps", other_prompt) not in registry.serves()
    assert len(registry.serves()) == 2


def test_a_pin_holding_the_key_separator_is_refused() -> None:
    bad = RunKind("steps", PinnedVersions(workflow="1", prompt="a\x1fb", model_policy="none", tool_schemas="s1"),
                  Steps(), {})
    with pytest.raises(ValueError, match="control character"):
        Registry([bad])
