"""RunSnapshot.replace: what ``dataclasses.replace`` gives, for every field, without its cost."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longrun.domain import RunSnapshot
from tests.unit.domain.support import strategy_for

FIELDS = [f.name for f in dataclasses.fields(RunSnapshot)]


@settings(max_examples=200, deadline=None)
@given(before=strategy_for(RunSnapshot), donor=strategy_for(RunSnapshot),
       changed=st.lists(st.sampled_from(FIELDS), unique=True, max_size=len(FIELDS)))
def test_replace_gives_what_dataclasses_replace_gives(before: RunSnapshot, donor: RunSnapshot,
                                                      changed: list[str]) -> None:
    # Given any snapshot and new values for any of its fields
    changes = {name: getattr(donor, name) for name in changed}
    # When replaced
    after = before.replace(**changes)
    # Then every field is the new value or the old one, exactly as dataclasses.replace has it
    assert after == dataclasses.replace(before, **changes)
    assert all(getattr(after, name) is changes.get(name, getattr(before, name)) for name in FIELDS)
    assert type(after) is RunSnapshot


@settings(max_examples=20, deadline=None)
@given(before=strategy_for(RunSnapshot))
def test_replace_leaves_the_original_alone_and_the_copy_frozen(before: RunSnapshot) -> None:
    stage, revision = before.stage, before.revision
    after = before.replace(stage=stage + "-next", revision=revision + 1)
    assert (before.stage, before.revision) == (stage, revision)
    assert (after.stage, after.revision) == (stage + "-next", revision + 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.stage = "other"  # type: ignore[misc]


@settings(max_examples=5, deadline=None)
@given(before=strategy_for(RunSnapshot))
def test_a_name_that_is_not_a_field_is_refused(before: RunSnapshot) -> None:
    with pytest.raises(TypeError, match="no field 'stauts'"):
        before.replace(stauts="READY")
