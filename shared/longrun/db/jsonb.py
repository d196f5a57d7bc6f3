"""JSON to PostgreSQL: orjson, which encodes our rows far faster than the standard library
(docs/cost-model.md, the timer service's profile).

Used for every JSONB value the engine binds, and for the JSON arrays the batch statements take
(outbox rows, a timer batch's events and patches). Keys that are not strings become strings, as
with ``json.dumps``; an integer beyond 64 bits, which orjson refuses, goes through the standard
library instead so no value that was accepted before is refused now. Reading stays with the
standard library: orjson would read such an integer back as a float.
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

