"""The timer service's pace."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting


@dataclass(frozen=True)
class TimerSettings(Concern):
    """Timers"""

    timer_batch: int = setting("LONGRUN_TIMER_BATCH", parse.positive_int, "an integer >= 1", "1000")
    """Due timers the timer service fires per transaction. Each batch pays a fixed share (its
    statements, its commit, one wake through the domain); 1,000 fired 10,000 due at once with 5-10 %
    less p99 lateness and a tenth less timer CPU per wake than 500 (docs/cost-model.md), and holds its
    runs' locks for tens of milliseconds."""
