"""Prometheus metrics, served at ``/metrics`` on each service's health port (``longrun.service``).

Two kinds, by where a figure can be true:
- Events counted in the process where they happen (a transition written, a wakeup taken, a step,
  a duplicate absorbed, a lease expiry, a timer fired): counters and histograms in memory, an
  increment or an observation and no I/O. Prometheus sums them over replicas.
- Figures that must agree with the database (runs by status, actions by status, the outbox
  backlog, the quarantine, runs silent or waiting for a worker): gauges set from queries that ONE
  elected process runs on an interval (``longrun.services.reconciler.gauges``). Only that
  process exports them, so they are never summed over replicas.

Labels stay few-valued: workflow (run kind), status, outcome, reason codes, the inbox's service.
``tenant`` is empty (Prometheus drops an empty label) unless ``LONGRUN_METRICS_TENANT_LABEL`` turns
it on; run ids never appear.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from longrun.domain import TERMINAL, ActionStatus, RunSnapshot, RunStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format ``exposition`` writes (every name here is plain ASCII), which Prometheus 2.x reads."""

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_DWELL = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0, 3 * 86400.0, 7 * 86400.0)

# -- counted where it happens ----------------------------------------------------------------------
STATUS_DWELL = Histogram("longrun_run_status_duration_seconds",
                         "Time a run spent in a status, observed when a transition out of it is written",
                         ["workflow", "status"], buckets=_DWELL)
TRANSITIONS = Counter("longrun_run_transitions_total", "Status changes written, by the status entered",
                      ["workflow", "status"])
FINISHED = Counter("longrun_runs_finished_total", "Runs that reached a terminal status, by that status",
                   ["workflow", "status", "tenant"])
BUDGET_EXHAUSTED = Counter("longrun_budget_exhaustions_total", "Runs stopped because a budget ran out",
                           ["workflow"])
ADMISSION_DELAY = Histogram("longrun_run_admission_delay_seconds",
                            "From run.create (its occurred_at) or the run's creation (queued runs) to admission",
                            ["workflow"], buckets=_LATENCY + (900.0, 3600.0))
TAKE_DELAY = Histogram("longrun_wakeup_take_delay_seconds",
                       "From a wakeup's occurred_at to the worker taking the run's lease", buckets=_LATENCY)
STEP_DURATION = Histogram("longrun_step_duration_seconds",
                          "One worker round: decide, then the model or tool call and the commit it leads to",
                          ["workflow"], buckets=_LATENCY)
LEASE_EXPIRIES = Counter("longrun_lease_expiries_total", "Run leases found expired by the reconciler")
LEASE_REWAKES = Counter("longrun_lease_rewakes_total", "Runs woken again after their lease expired")
RECOVERIES = Counter("longrun_recoveries_total",
                     "Runs moved on after their worker or message was lost, by how", ["reason"])
RECOVERY_PROGRESS = Histogram("longrun_recovery_progress_seconds",
                              "From a run's recovery from a lost worker (taken over, or woken after its lease "
                              "expired) to its first round committed under the new lease, by how it was recovered",
                              ["reason"], buckets=_LATENCY)
DUPLICATES = Counter("longrun_inbox_duplicates_total",
                     "Messages a service's inbox recognised as handled already (absorbed, nothing changed)",
                     ["inbox"])
RECONCILED = Counter("longrun_actions_reconciled_total", "Actions in doubt settled by the reconciler, by outcome",
                     ["outcome"])
ALERTS = Counter("longrun_reconciler_alerts_total",
                 "Audit alerts the reconciler raised (silent run, no compatible worker, drift, correction)", ["alert"])
SCHEDULE_FIRES = Counter("longrun_schedule_fires_total",
                         "Schedules' due times, by what each did (created, skipped, missed: a range)", ["outcome"])
TIMER_LATENESS = Histogram("longrun_timer_lateness_seconds", "How long after its due time a timer fired",
                           buckets=_LATENCY)
MODEL_TOKENS = Counter("longrun_model_tokens_total", "Model tokens used, by direction (input, output)",
                       ["workflow", "direction"])
MODEL_COST = Counter("longrun_model_cost_usd_total", "Model cost in US dollars, as the adapter priced it",
                     ["workflow"])
RATE_LIMITED = Counter("longrun_rate_limited_calls_total",
                       "Calls that waited for their place in a rate limit's line, by the limit that set the time",
                       ["limit"])
RATE_LIMIT_WAIT = Histogram("longrun_rate_limit_wait_seconds",
                            "How long a limited call's reservation had it wait, by limit", ["limit"],
                            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))

# -- from the database, exported by the one elected collector ---------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    """The database gauges as one collection read them (``longrun.services.reconciler.gauges``)."""

    runs: Mapping[tuple[str, str, str], int]
    """(workflow, status, tenant or "") -> runs."""
    actions: Mapping[str, int]
    in_doubt_oldest: float
    outbox_backlog: int
    outbox_oldest: float
    quarantine: Mapping[tuple[str, str], int]
    """(owner, error code) -> messages not replayed."""
    silent: Mapping[str, int]
    awaiting_worker: Mapping[str, int]
    rate_limit_held: Mapping[str, tuple[int, float]]
    """Limit name -> (runs waiting for their place in its line, seconds the longest of them has waited)."""
    rate_limit_levels: Mapping[str, float]
    """Bucket -> its level now (below zero: owed to places already given)."""
    cleanups_failing: Mapping[str, int]
    """Workflow -> finished runs whose cleanup failed and is not done yet (its alert open)."""
    took: float
    """Seconds the collection's queries took."""


class _Database(Collector):
    """Exports the last ``Figures`` while this process holds the collector's lease, nothing otherwise:
    a replica without the lease adds no series for Prometheus to sum."""

    def __init__(self) -> None:
        self.figures: Figures | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        f = self.figures
        yield GaugeMetricFamily("longrun_metrics_collector",
                                "1 in the process that exports the database gauges, else 0", 0 if f is None else 1)
        if f is None:
            return
        yield _family("longrun_runs", "Runs by workflow and status (archived finished runs included)",
                      ["workflow", "status", "tenant"], f.runs.items())
        yield _family("longrun_actions", "Ledger actions by status", ["status"],
                      (((s.value,), f.actions.get(s.value, 0)) for s in ActionStatus))
        yield GaugeMetricFamily("longrun_actions_unknown_oldest_age_seconds",
                                "Age of the oldest action in doubt (UNKNOWN or RECONCILING) since its last change; "
                                "0: none", f.in_doubt_oldest)
        yield GaugeMetricFamily("longrun_outbox_backlog_messages", "Outbox rows committed and not yet published",
                                f.outbox_backlog)
        yield GaugeMetricFamily("longrun_outbox_oldest_unpublished_age_seconds",
                                "Age of the oldest unpublished outbox row; 0: none", f.outbox_oldest)
        yield _family("longrun_quarantine_messages", "Quarantined messages not replayed, by owner and error code",
                      ["owner", "reason"], f.quarantine.items())
        yield _family("longrun_runs_silent", "Runs past their status's silence limit with no live lease",
                      ["status"], (((s,), n) for s, n in f.silent.items()))
        yield _family("longrun_runs_awaiting_worker", "Runs waiting for a worker that runs their pinned versions",
                      ["workflow"], (((w,), n) for w, n in f.awaiting_worker.items()))
        yield _family("longrun_rate_limit_held_runs", "Runs waiting for their place in a rate limit's line",
                      ["limit"], (((name,), n) for name, (n, _) in f.rate_limit_held.items()))
        yield _family("longrun_rate_limit_held_oldest_seconds",
                      "How long the run a rate limit has held longest has waited", ["limit"],
                      (((name,), age) for name, (_, age) in f.rate_limit_held.items()))
        yield _family("longrun_rate_limit_bucket_level",
                      "A rate limit bucket's level now; below zero: owed to places in line already given",
                      ["bucket"], (((b,), level) for b, level in f.rate_limit_levels.items()))
        yield _family("longrun_cleanups_failing", "Finished runs whose cleanup failed and is retried (its alert open)",
                      ["workflow"], (((w,), n) for w, n in f.cleanups_failing.items()))
        yield GaugeMetricFamily("longrun_metrics_collect_duration_seconds",
                                "How long the last collection of the database gauges took", f.took)


def _family(name: str, documentation: str, labels: list[str],
            values: Iterable[tuple[tuple[str, ...], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for key, value in values:
        family.add_metric(list(key), value)
    return family


DATABASE = _Database()
REGISTRY.register(DATABASE)

_tenants = False


def label_tenants(on: bool) -> None:
    """Whether the per-tenant label is filled (``LONGRUN_METRICS_TENANT_LABEL``)."""
    global _tenants
    _tenants = on


def tenant(tenant_id: str) -> str:
    return tenant_id if _tenants else ""


@functools.cache
def _dwell(workflow: str, status: RunStatus) -> Any:
    """The labelled child, looked up once (a child's lookup costs a lock and a dict; the workers
    observe every transition they write)."""
    return STATUS_DWELL.labels(workflow, status.value)


@functools.cache
def _entered(workflow: str, status: RunStatus) -> Any:
    return TRANSITIONS.labels(workflow, status.value)


@functools.cache
def step(workflow: str) -> Any:
    """``STEP_DURATION``'s child for ``workflow``, looked up once."""
    return STEP_DURATION.labels(workflow)


def transitioned(before: RunSnapshot, after: RunSnapshot) -> None:
    """A transition was written: how long the run stayed in the status it left, where it went."""
    if after.status is before.status:
        return
    _dwell(before.kind, before.status).observe(max(0.0, after.status_since - before.status_since))
    _entered(after.kind, after.status).inc()
    if after.status in TERMINAL:
        FINISHED.labels(after.kind, after.status.value, tenant(after.tenant_id)).inc()
        if after.status is RunStatus.BUDGET_EXHAUSTED:
            BUDGET_EXHAUSTED.labels(after.kind).inc()


def exposition() -> bytes:
    """This process's metrics in Prometheus' text format."""
    return generate_latest(REGISTRY)
