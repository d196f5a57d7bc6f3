"""JSON for PostgreSQL parameters: what json.dumps accepted is still accepted, and reads back the same."""

from __future__ import annotations

import json

import pytest

from longrun.db import jsonb


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, None, True, "é", {"nested": {"k": "v"}}]},
    {"big": 2**70, "negative": -(2**65)},
    {1: "int key", "s": "str key"},
    [],
    "text with \"quotes\" and \\ backslashes",
])
def test_what_the_standard_library_wrote_is_written_and_reads_back_the_same(value: object) -> None:
    assert json.loads(jsonb.dumps(value)) == json.loads(json.dumps(value))


def test_a_value_json_cannot_encode_is_still_refused() -> None:
    with pytest.raises(TypeError):
        jsonb.dumps({"when": object()})
