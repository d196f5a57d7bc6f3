"""The JSON arrays our batch statements take (outbox rows, a timer batch's events and patches),
encoded with orjson: far faster than the standard library (docs/cost-model.md, the timer
service's profile).

Only for rows this code builds: envelopes already went through pydantic's JSON (NaN became
null there), and events and snapshot patches of a wake hold no user data. orjson writes NaN as
null, so values that carry user input (a run's goal in its snapshot) keep the engine's standard
encoder, whose NaN PostgreSQL refuses. Keys that are not strings become strings, as with
``json.dumps``; an integer beyond 64 bits, which orjson refuses, goes through the standard
library instead.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)

