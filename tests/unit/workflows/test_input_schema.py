"""A run kind's input schema, as a pydantic model or a JSON Schema: what a create's input must be."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import BaseModel

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.workflows import STEPS_VERSIONS, builtin, steps


def _kind(schema: type[BaseModel] | dict[str, object] | None) -> RunKind:
    return RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO}, input_schema=schema)


class Release(BaseModel):
    version: str
    due: datetime
    repos: list[str]


JSON_SCHEMA = {"type": "object", "required": ["version", "repos"],
               "properties": {"version": {"type": "string"}, "repos": {"type": "array", "items": {"type": "string"}}}}


@pytest.mark.parametrize("schema", [Release, JSON_SCHEMA], ids=["pydantic", "json-schema"])
def test_a_fitting_input_has_no_problems(schema: type[BaseModel] | dict[str, object]) -> None:
    assert _kind(schema).input_problems({"version": "2.1", "due": "2026-12-04T09:30:00Z", "repos": ["web"]}) == []


def test_a_pydantic_schema_names_each_field_that_fails_and_coerces_nothing() -> None:
    problems = _kind(Release).input_problems({"version": 2, "repos": ["web", 7]})
    assert problems == ["version: Input should be a valid string", "due: Field required",
                        "repos.1: Input should be a valid string"]


def test_a_json_schema_names_each_field_that_fails() -> None:
    problems = _kind(JSON_SCHEMA).input_problems({"version": 2, "repos": ["web", 7]})
    assert sorted(problems) == ["repos.1: 7 is not of type 'string'", "version: 2 is not of type 'string'"]
    assert _kind(JSON_SCHEMA).input_problems({}) == ["input: 'version' is a required property",
                                                     "input: 'repos' is a required property"]


def test_a_kind_without_a_schema_takes_any_object_and_a_broken_schema_is_refused_at_once() -> None:
    assert _kind(None).input_problems({"anything": [1, {"at": "all"}]}) == []
    with pytest.raises(ValueError, match="run kind 'steps': input_schema is not a JSON Schema"):
        _kind({"type": "no-such-type"})


def test_a_problem_quoting_a_long_value_is_cut() -> None:
    [problem] = _kind(JSON_SCHEMA).input_problems({"version": ["x" * 1000], "repos": []})
    assert problem.startswith("version: ['xxx") and len(problem) == 200


def test_the_builtin_steps_kind_reads_a_count_of_steps() -> None:
    [kind] = builtin(Settings.from_env({}))
    assert kind.input_problems({"steps": 4, "note": "carried"}) == [] == kind.input_problems({})
    assert kind.input_problems({"steps": "abc"}) == ["steps: Input should be a valid integer"]
    assert kind.input_problems({"steps": "2"}) == ["steps: Input should be a valid integer"]
    assert kind.input_problems({"steps": -1}) == ["steps: Input should be greater than or equal to 0"]
