"""What every reconciler sweep shares: the name it writes under and its process-wide counters.

A module of their own because ``reconcile``, the entry, imports the other sweeps' modules
(``reconcile_leases``, ``reconcile_alerts``, ``reconcile_dead_letters``) for the service, so
they cannot import these from it.
"""

from __future__ import annotations

from collections import Counter

PRODUCER = "reconciler"
"""Producer of the reconciler's messages, actor of its audit rows, its name in the inbox."""

METRICS: Counter[str] = Counter()
"""Process-wide counters (outcomes, re-wakes, alerts, dead letters kept); the service logs them."""
