"""The Grafana dashboard: one row per question an operator asks, each panel one or more PromQL
queries over ``longrun.metrics``. ``PANELS`` is the source; ``dashboard()`` the JSON Grafana imports
(datasource chosen at import, ``${datasource}``). Every query is run against a live Prometheus in
tests/integration/test_prometheus.py."""

from __future__ import annotations

from typing import Any

from longrun.monitoring.alerts import runs

Panel = tuple[str, str, list[tuple[str, str]]]
"""(title, unit, [(query, legend)])."""

PANELS: list[tuple[str, list[Panel]]] = [
    ("Runs", [
        ("Runs by status", "short", [(f"sum by (status) ({runs()})", "{{status}}")]),
        ("Status changes a minute, by status entered", "short",
         [("sum by (status) (rate(longrun_run_transitions_total[5m])) * 60", "{{status}}")]),
        ("Finished runs a minute, by terminal status", "short",
         [("sum by (status) (rate(longrun_runs_finished_total[5m])) * 60", "{{status}}")]),
        ("Time in status (p90, by status left)", "s",
         [("histogram_quantile(0.9, sum by (le, status) (rate(longrun_run_status_duration_seconds_bucket[15m])))",
           "{{status}}")]),
    ]),
    ("Latency", [
        ("create → admit (p50, p99)", "s", [
            ("histogram_quantile(0.5, sum by (le) (rate(longrun_run_admission_delay_seconds_bucket[5m])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) (rate(longrun_run_admission_delay_seconds_bucket[5m])))", "p99")]),
        ("wakeup → take (p50, p99)", "s", [
            ("histogram_quantile(0.5, sum by (le) (rate(longrun_wakeup_take_delay_seconds_bucket[5m])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) (rate(longrun_wakeup_take_delay_seconds_bucket[5m])))", "p99")]),
        ("Step duration (p50, p99)", "s", [
            ("histogram_quantile(0.5, sum by (le) (rate(longrun_step_duration_seconds_bucket[5m])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) (rate(longrun_step_duration_seconds_bucket[5m])))", "p99")]),
        ("Timer lateness (p99)", "s",
         [("histogram_quantile(0.99, sum by (le) (rate(longrun_timer_lateness_seconds_bucket[5m])))", "p99")]),
    ]),
    ("Actions and recovery", [
        ("Actions by status", "short", [("max by (status) (longrun_actions)", "{{status}}")]),
        ("Oldest action in doubt", "s", [("max(longrun_actions_unknown_oldest_age_seconds)", "age")]),
        ("Reconciled a minute, by outcome", "short",
         [("sum by (outcome) (rate(longrun_actions_reconciled_total[5m])) * 60", "{{outcome}}")]),
        ("Lease expiries, re-wakes and recoveries a minute", "short", [
            ("sum(rate(longrun_lease_expiries_total[5m])) * 60", "lease expiries"),
            ("sum(rate(longrun_lease_rewakes_total[5m])) * 60", "re-wakes"),
            ("sum by (reason) (rate(longrun_recoveries_total[5m])) * 60", "recovered: {{reason}}")]),
        ("Recovery from a lost worker: success rate", "percentunit", [
            ("sum(rate(longrun_recovery_progress_seconds_count[15m])) / "
             'sum(rate(longrun_recoveries_total{reason=~"member_lapsed|lease_expired"}[15m]))', "progressed")]),
        ("Recovery → first progress (p50, p95)", "s", [
            ("histogram_quantile(0.5, sum by (le) (rate(longrun_recovery_progress_seconds_bucket[15m])))", "p50"),
            ("histogram_quantile(0.95, sum by (le) (rate(longrun_recovery_progress_seconds_bucket[15m])))", "p95")]),
    ]),
    ("Messages", [
        ("Outbox backlog", "short", [("max(longrun_outbox_backlog_messages)", "unpublished")]),
        ("Oldest unpublished outbox row", "s", [("max(longrun_outbox_oldest_unpublished_age_seconds)", "age")]),
        ("Duplicates absorbed a minute, by inbox", "short",
         [("sum by (inbox) (rate(longrun_inbox_duplicates_total[5m])) * 60", "{{inbox}}")]),
        ("Quarantine, by owner and reason", "short",
         [("max by (owner, reason) (longrun_quarantine_messages)", "{{owner}} {{reason}}")]),
    ]),
    ("Attention", [
        ("Silent runs, by status", "short", [("max by (status) (longrun_runs_silent)", "{{status}}")]),
        ("Runs waiting for a compatible worker", "short",
         [("max by (workflow) (longrun_runs_awaiting_worker)", "{{workflow}}")]),
        ("Reconciler alerts a minute", "short",
         [("sum by (alert) (rate(longrun_reconciler_alerts_total[5m])) * 60", "{{alert}}")]),
        ("Database gauges: collection time", "s", [("max(longrun_metrics_collect_duration_seconds)", "seconds")]),
    ]),
    ("Model and budget", [
        ("Model tokens a minute", "short",
         [("sum by (direction) (rate(longrun_model_tokens_total[5m])) * 60", "{{direction}}")]),
        ("Model cost an hour (USD)", "currencyUSD",
         [("sum by (workflow) (rate(longrun_model_cost_usd_total[1h])) * 3600", "{{workflow}}")]),
        ("Budget exhaustions an hour", "short",
         [("sum by (workflow) (increase(longrun_budget_exhaustions_total[1h]))", "{{workflow}}")]),
    ]),
]


def queries() -> list[str]:
    return [query for _, panels in PANELS for _, _, targets in panels for query, _ in targets]


def dashboard() -> dict[str, Any]:
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    out: list[dict[str, Any]] = []
    y = 0
    for row_title, panels in PANELS:
        out.append({"type": "row", "title": row_title, "collapsed": False, "id": len(out) + 1,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        for i, (title, unit, targets) in enumerate(panels):
            out.append({
                "type": "timeseries", "title": title, "id": len(out) + 1, "datasource": datasource,
                "gridPos": {"h": 8, "w": 6, "x": 6 * (i % 4), "y": y + 8 * (i // 4)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"refId": chr(ord("A") + k), "datasource": datasource, "expr": query,
                             "legendFormat": legend} for k, (query, legend) in enumerate(targets)]})
        y += 8 * ((len(panels) + 3) // 4)
    return {
        "title": "longrun", "uid": "longrun-overview", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "tags": ["longrun"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": out}
