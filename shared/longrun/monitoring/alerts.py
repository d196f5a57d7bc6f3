"""The alert rules, written once: ``rules`` renders them as a Prometheus rule group, which
``longrun.monitoring`` writes both as a plain rules file and inside a PrometheusRule manifest.

Gauges read from the database come from one process at a time, but during a handover of the
collector's lease two may briefly export them: the rules take ``max`` over replicas, never ``sum``.
Every alert has a ``promtool test rules`` case (``tests/unit/monitoring/rules_test.yml``) and a runbook
section in docs/operations.md (its ``runbook`` anchor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP = "longrun"
DOCS = "docs/operations.md"
"""Where the runbooks are; point ``runbook_url`` at your own copy of the docs if you publish them."""

# The database gauges, one copy each whichever replicas export them.
def runs(matcher: str = "") -> str:
    return f"max by (workflow, status, tenant) (longrun_runs{matcher})"


MOVING = runs('{status=~"READY|RUNNING"}')
NEEDING_ATTENTION = runs('{status="NEEDS_ATTENTION"}')


def quarantined(offset: str = "") -> str:
    return f"sum(max by (owner, reason) (longrun_quarantine_messages{' offset ' + offset if offset else ''}))"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What each alert waits for; tests render the rules with smaller ones."""

    no_progress_window: str = "30m"
    """No transition of a run kind for this long while it has READY or RUNNING runs."""
    lease_expiries_per_minute: float = 1.0
    retry_share: float = 0.3
    """Share of a run kind's transitions that schedule a retry."""
    retries_per_minute: float = 6.0
    """...and at least this many retries a minute, so that two retries out of five do not page."""
    unknown_after_seconds: float = 900.0
    outbox_oldest_seconds: float = 120.0
    quarantine_window: str = "30m"
    timer_lateness_seconds: float = 30.0
    awaiting_worker_for: str = "10m"
    cleanup_failing_for: str = "15m"
    """A finished run's cleanup failing this long (it is retried meanwhile): what it holds stays held."""
    rate_limit_held_seconds: float = 900.0
    """A run waiting this long for its place in a rate limit's line: the limit is too low for the load."""
    hold: str = "5m"
    """How long a condition must hold before most alerts fire."""


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    expr: str
    hold: str
    severity: str
    summary: str
    description: str
    runbook: str
    """Anchor of its section in docs/operations.md."""


def alerts(t: Thresholds = Thresholds()) -> list[Alert]:
    return [
        Alert("LongrunNoProgress",
              f"sum by (workflow) ({MOVING}) > 0 unless on (workflow) "
              f"sum by (workflow) (increase(longrun_run_transitions_total[{t.no_progress_window}])) > 0",
              t.hold, "critical", "Runs of {{ $labels.workflow }} are not moving",
              f"{{{{ $value }}}} runs of {{{{ $labels.workflow }}}} are READY or RUNNING and none of that kind "
              f"changed status in {t.no_progress_window}.", "no-progress"),
        Alert("LongrunLeaseExpiriesClimbing",
              f"sum(rate(longrun_lease_expiries_total[10m])) * 60 > {t.lease_expiries_per_minute:g}",
              t.hold, "warning", "Run leases keep expiring",
              "{{ $value | humanize }} run leases expire a minute: workers die, freeze or lose the database "
              "mid-step.", "lease-expiries"),
        Alert("LongrunRetryStorm",
              f'(sum by (workflow) (rate(longrun_run_transitions_total{{status="RETRY_SCHEDULED"}}[10m])) '
              f"/ sum by (workflow) (rate(longrun_run_transitions_total[10m]))) > {t.retry_share:g} "
              f'and on (workflow) sum by (workflow) (rate(longrun_run_transitions_total{{status="RETRY_SCHEDULED"}}'
              f"[10m])) * 60 > {t.retries_per_minute:g}",
              t.hold, "warning", "Retry storm in {{ $labels.workflow }}",
              "{{ $value | humanizePercentage }} of the status changes of {{ $labels.workflow }} schedule a retry: "
              "a far side or the model is failing.", "retry-storm"),
        Alert("LongrunUnknownActionsStale",
              f"max(longrun_actions_unknown_oldest_age_seconds) > {t.unknown_after_seconds:g}",
              "0s", "critical", "An action's outcome has been unknown too long",
              "The oldest action in doubt (UNKNOWN or RECONCILING) has been so for {{ $value | humanizeDuration }}: "
              "the reconciler cannot settle it.", "unknown-actions"),
        Alert("LongrunOutboxBacklogGrowing",
              f"max(longrun_outbox_oldest_unpublished_age_seconds) > {t.outbox_oldest_seconds:g}",
              t.hold, "critical", "The outbox is not being published",
              "The oldest unpublished outbox row is {{ $value | humanizeDuration }} old: no message leaves "
              "the database (wakeups, run events).", "outbox-backlog"),
        Alert("LongrunQuarantineGrowing",
              f"{quarantined()} - ({quarantined(t.quarantine_window)} or vector(0)) > 0",
              "0s", "warning", "Messages are being quarantined",
              f"{{{{ $value }}}} more messages in quarantine than {t.quarantine_window} ago.", "quarantine-growth"),
        Alert("LongrunSilentRuns", "sum by (status) (max by (status) (longrun_runs_silent)) > 0",
              "0s", "warning", "Runs silent in {{ $labels.status }}",
              "{{ $value }} runs have been {{ $labels.status }} past their silence limit with no worker on them.",
              "silent-runs"),
        Alert("LongrunTimersLate",
              "histogram_quantile(0.99, sum by (le) (rate(longrun_timer_lateness_seconds_bucket[5m]))) "
              f"> {t.timer_lateness_seconds:g}",
              t.hold, "warning", "Timers fire late",
              "Timers fire up to {{ $value | humanizeDuration }} after their due time (99th percentile over "
              "5 minutes): the timer service is behind or down.", "timers-late"),
        Alert("LongrunRunsNeedAttention", f"sum by (workflow) ({NEEDING_ATTENTION}) > 0",
              "0s", "warning", "Runs of {{ $labels.workflow }} need a person",
              "{{ $value }} runs of {{ $labels.workflow }} are NEEDS_ATTENTION.", "needs-attention"),
        Alert("LongrunRunsWaitingForWorker", "sum by (workflow) (max by (workflow) (longrun_runs_awaiting_worker)) > 0",
              t.awaiting_worker_for, "warning", "Runs of {{ $labels.workflow }} wait for a compatible worker",
              "{{ $value }} runs of {{ $labels.workflow }} are pinned to versions no live worker runs.",
              "incompatible-versions"),
        Alert("LongrunRateLimitHoldingRuns",
              f"max by (limit) (longrun_rate_limit_held_oldest_seconds) > {t.rate_limit_held_seconds:g}",
              t.hold, "warning", "Rate limit {{ $labels.limit }} holds runs too long",
              "A run has waited {{ $value | humanizeDuration }} for its place in rate limit {{ $labels.limit }}'s "
              "line: more calls want that far side than the limit lets through.", "rate-limit-holding-runs"),
        Alert("LongrunCleanupsFailing", "sum by (workflow) (max by (workflow) (longrun_cleanups_failing)) > 0",
              t.cleanup_failing_for, "warning", "Cleanups of {{ $labels.workflow }} runs keep failing",
              "{{ $value }} finished runs of {{ $labels.workflow }} have a cleanup step failing (retried): what "
              "they hold (workspaces, credentials) is not released.", "cleanup-failed"),
        Alert("LongrunMetricsNotCollected",
              "max(longrun_metrics_collector) < 1 or absent(longrun_metrics_collector)",
              t.hold, "warning", "No process exports the database gauges",
              "No reconciler holds the metrics collector's lease: the alerts on runs, actions, the outbox and "
              "the quarantine cannot fire.", "metrics-not-collected"),
    ]


def rules(t: Thresholds = Thresholds(), *, hold: str | None = None) -> dict[str, Any]:
    """The rule file's content; ``hold`` overrides every alert's ``for`` (tests)."""
    return {"groups": [{"name": GROUP, "rules": [
        {"alert": a.name, "expr": a.expr, "for": hold or a.hold,
         "labels": {"severity": a.severity},
         "annotations": {"summary": a.summary, "description": a.description,
                         "runbook_url": f"{DOCS}#{a.runbook}"}}
        for a in alerts(t)]}]}


def prometheus_rule(t: Thresholds = Thresholds()) -> dict[str, Any]:
    """The same rules as a Prometheus Operator PrometheusRule."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "longrun", "labels": {"app.kubernetes.io/name": "longrun",
                                                       "app.kubernetes.io/component": "alerts"}},
            "spec": rules(t)}
