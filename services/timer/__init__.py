"""timer: turns due timers (retry backoff, sleeps, deadlines, attempt timeouts) into run events."""

from __future__ import annotations
