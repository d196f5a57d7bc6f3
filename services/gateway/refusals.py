"""Unauthenticated refusals, audited by sample: anyone can send a forged webhook, so writing an audit
row for each would let a flood of them write to the database as fast as it arrives.

Per key (a provider), the first refusal of each window is audited, carrying how many were refused
since the last one audited; the others are only counted. The keys are the configured providers, so
the counts stay as few as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WINDOW = 60.0
"""Seconds between two audited refusals of one key."""


class Sampler:
    def __init__(self, *, window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._audited_at: dict[str, float] = {}
        self._unaudited: dict[str, int] = {}

    def audit(self, key: str) -> int | None:
        """None: count this refusal and audit nothing; else audit it, with the number returned: the
        refusals of ``key`` counted and not audited since the last one audited."""
        now = self._clock()
        last = self._audited_at.get(key)
        if last is not None and now - last < self._window:
            self._unaudited[key] = self._unaudited.get(key, 0) + 1
            return None
        self._audited_at[key] = now
        return self._unaudited.pop(key, 0)
