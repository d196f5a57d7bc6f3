"""A real Prometheus scrapes the real ensemble (two workers, two reconcilers) while runs go through
CI, a webhook delivered twice, a model fix, an approval and a merge; one merge request times out after
the forge created it, and with no reconciler sweep to settle it the action stays UNKNOWN.

Then, from Prometheus' HTTP API: the runs by status, the UNKNOWN actions and the outbox backlog agree
with the database (exported once, though two reconcilers run); both workers' metrics are there; the
alert on actions unknown too long fires (its threshold rendered at 2 s); and every query of the Grafana
dashboard runs, with data wherever this story produces its metric."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from longrun.monitoring import alerts, dashboard
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, goal, new_key, publish_create, run_id_for, status_of
from tests.integration.prometheus_server import PrometheusServer
from tests.integration.test_unknown_outcome import approve_when_asked
from tests.ports import free_port

pytestmark = pytest.mark.integration

SERVICES = (("gateway", "longrun.services.gateway"), ("scheduler", "longrun.services.scheduler"), ("worker", "longrun.services.worker"),
            ("worker", "longrun.services.worker"), ("timer", "longrun.services.timer"), ("relay", "longrun.services.outbox_relay"),
            ("reconciler", "longrun.services.reconciler"), ("reconciler", "longrun.services.reconciler"))
ABSENT_HERE = {"longrun_quarantine_messages", "longrun_runs_awaiting_worker", "longrun_recoveries_total",
               "longrun_budget_exhaustions_total", "longrun_reconciler_alerts_total",
               "longrun_actions_reconciled_total", "longrun_recovery_progress_seconds"}
"""Metrics this story gives no event or row to (nothing quarantined, no version missing, no recovery...)."""


def value(result: list[dict]) -> float:  # type: ignore[type-arg]
    (sample,) = result
    return float(sample["value"][1])


@pytest.mark.long
async def test_prometheus_scrapes_the_ensemble_agrees_with_the_database_and_fires_an_alert(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the ensemble, each process with /metrics on a port of its own, and a Prometheus scraping them
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    ports: dict[str, list[int]] = {}
    for name, module in SERVICES:
        port = free_port()
        ports.setdefault(name, []).append(port)
        ensemble.start(name, module, LONGRUN_HEALTH_PORT=str(port), LONGRUN_HEALTH_BIND="127.0.0.1",
                       LONGRUN_METRICS_INTERVAL="1", LONGRUN_FORGE_TIMEOUT="2",
                       # No sweep after the first: an UNKNOWN action stays UNKNOWN.
                       LONGRUN_RECONCILE_INTERVAL="3600")
    await ensemble.configure_forge(deliver_times=2, faults=(
        {"endpoint": "merge_requests", "mode": "timeout_after_commit", "times": 1, "hold_seconds": 10},))
    prometheus = PrometheusServer(tmp_path / "prometheus", ports,
                                  alerts.rules(alerts.Thresholds(unknown_after_seconds=2), hold="0s"))
    try:
        await prometheus.ready()
        await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
        await eventually(prometheus.targets_up, timeout=30, what="every target scraped")

        # When one run's merge request times out after the forge created it, and another run completes
        unknown_run = await _run(ensemble, engine, bus, "ACTION_UNKNOWN")
        await _run(ensemble, engine, bus, "COMPLETED")

        # Then the figures Prometheus holds agree with the database
        async def agree() -> bool:
            async with engine.connect() as conn:
                by_status = {(r.workflow, r.status): r.n for r in await conn.execute(text(
                    "SELECT workflow, status, count(*) AS n FROM runs GROUP BY workflow, status"))}
                unknown = (await conn.execute(text("SELECT count(*) FROM actions WHERE status = 'UNKNOWN'"))).scalar()
                backlog = (await conn.execute(text(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"))).scalar()
            scraped = {(s["metric"]["workflow"], s["metric"]["status"]): int(float(s["value"][1]))
                       for s in await prometheus.query("longrun_runs")}
            return (scraped == by_status and unknown == 1
                    and value(await prometheus.query('longrun_actions{status="UNKNOWN"}')) == unknown
                    and value(await prometheus.query("longrun_outbox_backlog_messages")) == backlog)

        await eventually(agree, timeout=30, what="Prometheus' figures to agree with the database")
        # ...exported by one of the two reconcilers only
        assert value(await prometheus.query('count(longrun_actions{status="UNKNOWN"})')) == 1
        assert value(await prometheus.query("sum(longrun_metrics_collector)")) == 1
        assert value(await prometheus.query('count(longrun_metrics_collector{service="reconciler"})')) == 2
        # ...counted where it happened, by both workers
        assert value(await prometheus.query(
            'count(longrun_wakeup_take_delay_seconds_count{service="worker"})')) == 2
        assert value(await prometheus.query("sum(longrun_wakeup_take_delay_seconds_count)")) >= 2
        # (the finishing worker's counter reaches Prometheus at its next scrape)
        async def finished() -> bool:
            result = await prometheus.query('sum(longrun_runs_finished_total{status="COMPLETED"})')
            return bool(result) and value(result) == 1

        await eventually(finished, timeout=30, what="the completed run's counter to be scraped")
        assert value(await prometheus.query('sum(longrun_inbox_duplicates_total{inbox="gateway"})')) >= 1
        assert value(await prometheus.query('sum(longrun_model_tokens_total{direction="input"})')) > 0
        assert value(await prometheus.query(
            'sum(longrun_run_status_duration_seconds_count{status="WAITING_EVENT"})')) >= 2

        # ...and the alert on an action unknown past its threshold fires
        async def firing() -> bool:
            return any(a["labels"]["alertname"] == "LongrunUnknownActionsStale" and a["state"] == "firing"
                       for a in await prometheus.alerts())

        await eventually(firing, timeout=30, what="LongrunUnknownActionsStale firing")
        assert await status_of(engine, unknown_run) == "ACTION_UNKNOWN"

        # ...and every dashboard query runs, with data where this story has the metric
        for query in dashboard.queries():
            result = await prometheus.query(query)
            if not set(re.findall(r"longrun_[a-z_]+?(?=_bucket\b|\b)", query)) & ABSENT_HERE:
                assert result, f"no data for the dashboard's {query!r}"
    finally:
        prometheus.stop()


async def _run(ensemble: Ensemble, engine, bus, until: str) -> str:  # type: ignore[no-untyped-def]
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal(key))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    await eventually(lambda: approve_when_asked(engine, ensemble, run_id), timeout=60, what="the approval")

    async def reached() -> bool:
        return await status_of(engine, run_id) == until

    await eventually(reached, timeout=60, what=until)
    return run_id
