"""Test helpers for the domain: a history recorder and Hypothesis strategies from type hints."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from hypothesis import strategies as st

from longrun.domain import (
    Scope,
    FrozenMap,
    PinnedVersions,
    RunCreated,
    RunEvent,
    RunSnapshot,
    RunTimeouts,
    Usage,
    evolve,
    freeze,
)

VERSIONS = PinnedVersions(workflow="wf@1", prompt="p@1", model_policy="mp@1", tool_schemas="ts@1")


class History:
    """Builds a run event by event, numbering seqs and ticking a fake clock one second a step."""

    def __init__(self, *, budget: Usage = Usage(10, 10, 100.0), **created: Any) -> None:
        self.events: list[RunEvent] = []
        self.state: RunSnapshot | None = None
        self.now = 0.0
        fields = {"run_id": "run-1", "tenant_id": "t-1", "kind": "upgrade",
                  "goal": FrozenMap({"goal": "upgrade payment-sdk to 5.x"}), "versions": VERSIONS,
                  "budget": budget, "permissions": Scope(("forge.*",), ("repo:payments",))} | created  # fmt: skip
        self.apply(RunCreated, **fields)

    @property
    def snapshot(self) -> RunSnapshot:
        assert self.state is not None
        return self.state

    def event(self, cls: type[RunEvent], **fields: Any) -> RunEvent:
        return cls(seq=len(self.events) + 1, at=self.now + 1, **fields)

    def apply(self, cls: type[RunEvent], **fields: Any) -> RunSnapshot:
        """Evolve with the next event; on refusal nothing is recorded and the error propagates."""
        event = self.event(cls, **fields)
        self.state = evolve(self.state, event)
        self.events.append(event)
        self.now = event.at
        return self.state


finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.none() | st.booleans() | st.integers() | finite_floats | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=5), json_values, max_size=4)


def strategy_for(tp: object) -> st.SearchStrategy[Any]:
    """A strategy for any domain type, derived from its type hints like the codec does."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return st.one_of(*(strategy_for(arg) for arg in typing.get_args(tp)))
    if origin is tuple:
        return st.lists(strategy_for(typing.get_args(tp)[0]), max_size=3).map(tuple)
    simple: dict[object, st.SearchStrategy[Any]] = {
        type(None): st.none(),
        object: json_values.map(freeze),
        FrozenMap: json_objects.map(FrozenMap),
        float: finite_floats,
        int: st.integers(),
        str: st.text(max_size=8),
        bool: st.booleans(),
    }
    if tp in simple:
        return simple[tp]
    if tp is Scope:  # its patterns are checked: names, or prefixes ending in '*'
        patterns = st.lists(st.from_regex(r"\*|[a-z.:/]{1,6}\*?", fullmatch=True), max_size=3).map(tuple)
        return st.builds(Scope, tools=patterns, resources=patterns, policy_version=st.none() | st.integers(1, 9))
    if tp is RunTimeouts:  # each limit is positive seconds, or none
        limits = st.none() | st.floats(min_value=0.001, max_value=1e9)
        return st.builds(RunTimeouts, schedule_to_start=limits, start_to_close=limits)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(tp)
    assert isinstance(tp, type) and dataclasses.is_dataclass(tp), tp
    hints = typing.get_type_hints(tp)
    return st.builds(tp, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(tp)})
