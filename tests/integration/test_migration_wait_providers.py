"""Migration 0030 gives the waits of runs waiting today the webhook provider they could only have
meant, keeps the ids of the deliveries already seen, and stops, naming the runs, when nothing tells."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from longrun.db import migrate

pytestmark = pytest.mark.integration


@pytest.fixture
def before_0030(infra):  # type: ignore[no-untyped-def]
    name = f"lrm_{uuid.uuid4().hex[:10]}"
    url = make_url(infra.database_url).set(database=name).render_as_string(hide_password=False)
    migrate.create_database(url)
    migrate.upgrade(url, "0029")
    yield url
    admin = create_engine(make_url(infra.database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _waiting(conn, run_id: str, key: str, status: str = "WAITING_EVENT") -> None:  # type: ignore[no-untyped-def]
    snapshot = {"wait": {"wait_id": f"w-{run_id}", "kind": "ci", "deadline": 1.0e10, "correlation_key": key},
                "schema_version": 7}
    conn.execute(text(
        "INSERT INTO runs (run_id, tenant_id, idempotency_key, input_hash, workflow, workflow_version, prompt_version, "
        "model_policy_version, tool_schema_version, status, partition, wait_kind, wait_correlation_key, wait_deadline, "
        "budget, snapshot) VALUES (:r, 'acme', :r, 'h', 'k', '1', '1', '1', '1', :s, 0, 'ci', :k, now(), '{}', "
        "CAST(:snap AS jsonb))"), {"r": run_id, "k": key, "s": status, "snap": json.dumps(snapshot)})


def _event(conn, provider: str, event_id: str, key: str) -> None:  # type: ignore[no-untyped-def]
    conn.execute(text("INSERT INTO webhook_events (provider, event_id, correlation_key, payload) "
                      "VALUES (:p, :e, :k, '{}')"), {"p": provider, "e": event_id, "k": key})


def _providers(url: str) -> dict[str, str | None]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, snapshot->'wait'->>'provider' FROM runs ORDER BY run_id")).all()
    engine.dispose()
    return dict(rows)  # type: ignore[arg-type]


def test_each_wait_gets_the_provider_of_its_key_else_the_only_one_ever_seen(before_0030: str) -> None:
    engine = create_engine(before_0030)
    with engine.begin() as conn:
        _event(conn, "forge", "f-1", "ci/1")
        _event(conn, "forge", "f-2", "ci/2")
        _event(conn, "acme", "a-1", "acme/1")
        _waiting(conn, "r-forge", "ci/1")
        _waiting(conn, "r-acme", "acme/1", "PAUSED")
        _waiting(conn, "r-health", "tool-healthy:forge")
    engine.dispose()
    migrate.upgrade(before_0030)
    assert _providers(before_0030) == {"r-acme": "acme", "r-forge": "forge", "r-health": None}
    engine = create_engine(before_0030)
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT provider, event_id FROM webhook_deliveries ORDER BY 1, 2")).all()
    engine.dispose()
    assert [tuple(i) for i in ids] == [("acme", "a-1"), ("forge", "f-1"), ("forge", "f-2")]


def test_with_one_provider_ever_seen_a_wait_on_a_key_of_no_event_gets_it(before_0030: str) -> None:
    engine = create_engine(before_0030)
    with engine.begin() as conn:
        _event(conn, "forge", "f-1", "ci/1")
        _waiting(conn, "r-new", "ci/9")
    engine.dispose()
    migrate.upgrade(before_0030)
    assert _providers(before_0030) == {"r-new": "forge"}


def test_when_nothing_tells_the_migration_stops_naming_the_runs_unless_told(before_0030: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    engine = create_engine(before_0030)
    with engine.begin() as conn:
        _event(conn, "forge", "f-1", "ci/1")
        _event(conn, "acme", "a-1", "acme/1")
        _waiting(conn, "r-unsure", "ci/9")
    engine.dispose()
    with pytest.raises(RuntimeError, match=r"LONGRUN_MIGRATE_WAIT_PROVIDER .*runs: r-unsure"):
        migrate.upgrade(before_0030)
    assert migrate.current_revision(before_0030) == "0029"
    monkeypatch.setenv("LONGRUN_MIGRATE_WAIT_PROVIDER", "forge")
    migrate.upgrade(before_0030)
    assert _providers(before_0030) == {"r-unsure": "forge"}
