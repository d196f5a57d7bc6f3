"""What every reconciler sweep shares: the name it writes under, the alerts it raises and its
process-wide counters."""

from __future__ import annotations

from collections import Counter

PRODUCER = "reconciler"
"""Producer of the reconciler's messages, actor of its audit rows, its name in the inbox."""

METRICS: Counter[str] = Counter()
"""Process-wide counters (outcomes, re-wakes, alerts, dead letters kept); the service logs them."""

ALERT_PREFIX = "alert."
"""Every alert is an audit row whose action starts so (the operator API's ``/alerts``)."""
SILENT_ALERT = f"{ALERT_PREFIX}silent_run"
DRIFT_ALERT = f"{ALERT_PREFIX}drift"
NO_WORKER_ALERT = f"{ALERT_PREFIX}no_compatible_worker"
CORRECTION_ALERT = f"{ALERT_PREFIX}correction_needed"
"""An outcome that arrived after its run COMPLETED contradicts it (``domain.closure``)."""
CLEANUP_ALERT = f"{ALERT_PREFIX}cleanup_failed"
"""A finished run's cleanup failed; it is retried, and resolved (``RESOLVED_ALERT``) once it succeeds."""
RESOLVED_ALERT = f"{ALERT_PREFIX}resolved"
"""An alert whose cause went away: ``details.alert`` names it, ``details.episode`` its episode."""
