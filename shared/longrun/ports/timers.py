"""A due timer as the timer service claims it: the use case decides what it does to its run."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple


class DueTimer(NamedTuple):
    timer_key: str
    run_id: str
    kind: str
    wake_at: datetime
    payload: dict[str, Any]
