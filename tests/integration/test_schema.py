"""Migrations: upgrade from empty, downgrade to empty, and the result equals the metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, ProgrammingError

from longrun.db import admission, migrate
from longrun.db.schema import metadata
from longrun_dependency_upgrade import webhooks as forge
from tests.harness import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def scratch_url(infra):  # type: ignore[no-untyped-def]
    name = f"lrs_{uuid.uuid4().hex[:10]}"
    url = make_url(infra.database_url).set(database=name).render_as_string(hide_password=False)
    migrate.create_database(url)
    yield url
    admin = create_engine(make_url(infra.database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _checks(conn) -> dict[tuple[str, str], str]:  # type: ignore[no-untyped-def]
    """CHECK bodies and index definitions (partial indexes' predicates included) by table and name."""
    rows = conn.execute(text(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'c' AND connamespace = 'public'::regnamespace "
        "UNION ALL SELECT tablename, indexname, indexdef FROM pg_indexes "
        "WHERE schemaname = 'public' AND tablename <> 'alembic_version'"))
    return {(t, n): d for t, n, d in rows}


def test_migrated_database_equals_the_metadata(scratch_url: str) -> None:
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        migrated_checks = _checks(conn)
    engine.dispose()
    assert diff == []
    # Alembic compares neither CHECK bodies nor index predicates: compare them against a create_all.
    reference = scratch_url.rsplit("/", 1)[0] + "/" + scratch_url.rsplit("/", 1)[1] + "_ref"
    migrate.create_database(reference)
    ref_engine = create_engine(reference)
    try:
        metadata.create_all(ref_engine)
        with ref_engine.connect() as conn:
            assert migrated_checks == _checks(conn)
    finally:
        ref_engine.dispose()
        admin = create_engine(make_url(scratch_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{make_url(reference).database}" WITH (FORCE)'))
        admin.dispose()


def test_downgrade_to_empty_and_upgrade_again(scratch_url: str) -> None:
    migrate.upgrade(scratch_url)
    migrate.downgrade(scratch_url, "base")
    engine = create_engine(scratch_url)
    with engine.connect() as conn:
        tables = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
    assert tables == ["alembic_version"]
    migrate.upgrade(scratch_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0
    engine.dispose()


def test_constraints_refuse_what_the_invariants_forbid(scratch_url: str) -> None:
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url)
    base = ("INSERT INTO runs (run_id, tenant_id, idempotency_key, input_hash, workflow, workflow_version, "
            "prompt_version, model_policy_version, tool_schema_version, status, partition, budget, snapshot, "
            "lease_owner, lease_until, wait_deadline, wait_correlation_key) VALUES ('r', 't', 'k', 'h', 'w', '1', "
            "'1', '1', '1', :status, 0, '{}', '{}', :owner, :until, :deadline, :key)")
    forbidden = [
        {"status": "RUNNING", "owner": "w1", "until": None, "deadline": None, "key": None},  # half a lease
        {"status": "WAITING_EVENT", "owner": None, "until": None, "deadline": None, "key": "ci/1"},
        {"status": "WAITING_EVENT", "owner": None, "until": None, "deadline": "2030-01-01", "key": None},
        {"status": "WAITING_USER", "owner": None, "until": None, "deadline": "2030-01-01", "key": None},
        {"status": "DONE", "owner": None, "until": None, "deadline": None, "key": None},
    ]
    for values in forbidden:
        with engine.connect() as conn, pytest.raises(IntegrityError):
            conn.execute(text(base), values)
    with engine.begin() as conn:
        conn.execute(text(base), {"status": "READY", "owner": None, "until": None, "deadline": None, "key": None})
        conn.execute(text("INSERT INTO run_events (run_id, seq, event_id, type, data, occurred_at) "
                          "VALUES ('r', 1, 'r:1', 'run.created', '{}', now())"))
    # An event id is its run and seq, so the primary key keeps it unique.
    with engine.connect() as conn, pytest.raises(IntegrityError, match="event_id_is_run_seq"):
        conn.execute(text("INSERT INTO run_events (run_id, seq, event_id, type, data, occurred_at) "
                          "VALUES ('r', 2, 'e2', 'run.woken', '{}', now())"))
    with engine.connect() as conn, pytest.raises(ProgrammingError, match="append-only"):
        conn.execute(text("UPDATE run_events SET type = 'x'"))
    engine.dispose()


def test_a_run_waits_for_a_person_only_naming_the_approval_or_the_question(scratch_url: str) -> None:
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url)
    insert = text("INSERT INTO runs (run_id, tenant_id, idempotency_key, input_hash, workflow, workflow_version, "
                  "prompt_version, model_policy_version, tool_schema_version, status, partition, budget, snapshot, "
                  "wait_kind, wait_deadline) VALUES (:r, 't', :r, 'h', 'w', '1', '1', '1', '1', 'WAITING_USER', 0, "
                  "'{}', CAST(:snapshot AS jsonb), :kind, '2030-01-01')")
    for kind, snapshot in (("question", '{"wait": {"question_id": null}}'),  # a question wait names its question
                           ("approval", '{"wait": {"question_id": "q"}}')):  # an approval wait, its approval
        with engine.connect() as conn, pytest.raises(IntegrityError, match="user_wait_named"):
            conn.execute(insert, {"r": f"r-{kind}", "kind": kind, "snapshot": snapshot})
    with engine.begin() as conn:
        conn.execute(insert, {"r": "r-asks", "kind": "question", "snapshot": '{"wait": {"question_id": "q"}}'})
    engine.dispose()


COUNTS = pytest.mark.parametrize("query", [admission.tenant_slots(":t")], ids=["tenant slots"])


@COUNTS
def test_admission_counts_read_only_the_runs_holding_slots(scratch_url: str, query: str) -> None:
    # Given a tenant with 3 runs holding slots, 300 queued and 300 finished
    engine = _tenant_with_runs(scratch_url, 603, status="CASE WHEN i <= 303 THEN 'READY' ELSE 'COMPLETED' END",
                               admitted_at="CASE WHEN i <= 3 OR i > 303 THEN now() END")
    # When PostgreSQL runs admission's count queries
    counted, plan = _explained(engine, query, {"t": "acme", "slots": 4})
    # Then they read the 3 runs holding slots (and, to see whether a run is queued, a few rows at most):
    # neither the queue nor the finished runs are visited
    assert counted == 3
    indexes, most_rows = _reads(plan)
    assert "ix_runs_holding_slots" in indexes
    assert most_rows <= 10


@COUNTS
def test_admission_counts_stop_at_the_tenants_slots(scratch_url: str, query: str) -> None:
    # Given a tenant with 600 runs parked on timers, every one admitted (each holds a slot)
    engine = _tenant_with_runs(scratch_url, 600, status="'RETRY_SCHEDULED'", admitted_at="now()")
    # When PostgreSQL runs admission's count queries for a tenant of 4 slots
    counted, plan = _explained(engine, query, {"t": "acme", "slots": 4}, index_only=True)
    # Then every slot is taken, and they read as many runs as there are slots, not all 600
    assert counted == 4
    indexes, most_rows = _reads(plan)
    assert "ix_runs_holding_slots" in indexes
    assert most_rows <= 4


def test_a_finish_with_nobody_queued_reads_no_run_holding_a_slot(scratch_url: str) -> None:
    # Given a tenant of 1,000 slots with 600 runs parked on timers, every one admitted, and none queued
    engine = _tenant_with_runs(scratch_url, 600, status="'RETRY_SCHEDULED'", admitted_at="now()")
    # When PostgreSQL asks, as a finishing run's write does, whether its slot goes to a queued run
    hands_on, plan = _explained(engine, f"SELECT {admission.hands_on(':t', ':slots')}",
                                {"t": "acme", "slots": 1000}, index_only=True)
    # Then it does not, and none of the 600 is read: the count is never made
    assert hands_on is False
    assert _reads(plan)[1] <= 1


def _explained(engine: Engine, query: str, params: dict[str, object], *,
               index_only: bool = False) -> tuple[object, list[dict]]:  # type: ignore[type-arg]
    """``query``'s first column, and its EXPLAIN (ANALYZE, FORMAT JSON) plan. ``index_only``: with
    sequential scans off, as on a table this small the planner would read it whole (on a real one it
    does not)."""
    with engine.begin() as conn:
        if index_only:
            conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + query), params).scalar()
        value = conn.execute(text(query), params).one()[0]
    engine.dispose()
    return value, plan


def test_admission_picks_from_the_oldest_queued_runs_without_visiting_the_rest(scratch_url: str) -> None:
    # Given a tenant with 300 runs queued over three priorities, behind 300 older ones terminated
    # while queued (never admitted)
    engine = _tenant_with_runs(scratch_url, 600, status="CASE WHEN i <= 300 THEN 'TERMINATED' ELSE 'READY' END",
                               priority="i % 3", created_at="now() - make_interval(secs => 1000 - i)")
    # When admission admits the best two (sequential scans off: this table is tiny here, so reading
    # all of it would be the planner's cheapest way; on a real one it is not)
    with engine.connect() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + admission.ADMIT_BEST.text),
                            {"t": "acme", "aging": 30, "n": 2}).scalar()
        conn.rollback()
    engine.dispose()
    # Then it read a few queued runs of each priority: neither the rest of the queue nor the runs
    # that left it unadmitted
    indexes, most_rows = _reads(plan)
    assert "ix_runs_queued" in indexes
    assert most_rows <= 10


def test_admission_reads_a_few_queued_runs_even_when_the_planner_has_not_seen_the_queue(scratch_url: str) -> None:
    # Given a tenant whose 300 runs were queued in a burst the table's statistics have not seen yet
    # (as after a TRUNCATE, before autovacuum analyzes), a hundred of them per priority
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO runs (run_id, tenant_id, idempotency_key, input_hash, workflow, workflow_version, "
            "prompt_version, model_policy_version, tool_schema_version, partition, budget, snapshot, status, "
            "priority, created_at) SELECT 'q' || i, 'acme', 'q' || i, 'h', 'w', '1', '1', '1', '1', 0, '{}', '{}', "
            "'READY', i % 3, now() - make_interval(secs => 1000 - i) FROM generate_series(1, 300) AS i"))
    # When admission picks the best one (a finishing run's handover picks with the same best_queued)
    # with the plan a prepared statement settles on (sequential scans off: this table is tiny here,
    # a real one is not)
    with engine.connect() as conn:
        conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        conn.execute(text("PREPARE pick(text, float8, int) AS " + admission.ADMIT_BEST.text.replace(
            ":t", "$1").replace(":aging", "$2").replace(":n", "$3")))
        plan = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE pick('acme', 30, 1)")).scalar()
        conn.rollback()
    engine.dispose()
    # Then it read at most the queue once per priority (where it can, through ix_runs_queued, which a
    # planner that has seen the queue uses: a few runs), not the whole queue once per candidate
    _, most_rows = _reads(plan)
    assert most_rows <= 2 * 300


def _tenant_with_runs(scratch_url: str, n: int, **columns: str) -> Engine:
    """A migrated database whose tenant "acme" has ``n`` runs; ``columns`` are SQL of ``i`` (1..n)."""
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO runs (run_id, tenant_id, idempotency_key, input_hash, workflow, workflow_version, "
            f"prompt_version, model_policy_version, tool_schema_version, partition, budget, snapshot, "
            f"{', '.join(columns)}) SELECT 'r' || i, 'acme', 'k' || i, 'h', 'w', '1', '1', '1', '1', 0, '{{}}', "
            f"'{{}}', {', '.join(columns.values())} FROM generate_series(1, {n}) AS i"))
        conn.execute(text("ANALYZE runs"))
    return engine


def _reads(plan: list[dict]) -> tuple[set[str], int]:  # type: ignore[type-arg]
    """The indexes an EXPLAIN (ANALYZE, FORMAT JSON) plan read, and the most rows any of its nodes
    visited (returned or filtered out)."""
    nodes = list(_plan_nodes(plan[0]["Plan"]))
    return ({n["Index Name"] for n in nodes if "Index Name" in n},
            max(n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0) for n in nodes))


def _plan_nodes(node: dict) -> Iterator[dict]:  # type: ignore[type-arg]
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


WAITING_FORGE_EVENTS = [
    {"type": "ci.finished", "id": "e1", "repo": "acme/payments", "ci_run_id": 3, "status": "passed", "sha": "s1"},
    {"type": "ci.finished", "id": "e2", "repo": "acme/payments", "ci_run_id": "ci-7", "status": "failed",
     "sha": "s2", "log_excerpt": "1 test failed"},
    {"type": "branch.pushed", "id": "e3", "repo": "acme/payments", "branch": "longrun/upgrade", "sha": "s3",
     "pusher": "dana"},
    {"type": "branch.pushed", "id": "e4", "repo": "acme/payments", "branch": "longrun/upgrade", "sha": "s4"},
]


def test_kept_webhook_events_waiting_for_a_run_keep_their_meaning_across_the_upgrade(scratch_url: str) -> None:
    # Given events kept by a release that stored only the payload: some waiting for a run, one matched
    migrate.upgrade(scratch_url, "0012")
    engine = create_engine(scratch_url)
    insert = text("INSERT INTO webhook_events (provider, event_id, correlation_key, payload, matched_run_id) "
                  "VALUES ('forge', :e, :key, CAST(:payload AS jsonb), :m)")
    with engine.begin() as conn:
        for payload in WAITING_FORGE_EVENTS:
            conn.execute(insert, {"e": payload["id"], "key": forge.translate(payload).correlation_key,
                                  "payload": json.dumps(payload), "m": None})
        matched = {**WAITING_FORGE_EVENTS[0], "id": "e0"}
        conn.execute(insert, {"e": "e0", "key": "ci/acme/payments/3", "payload": json.dumps(matched), "m": "r0"})
    # When the database is upgraded (the migration holds its own translation of the forge's events)
    migrate.upgrade(scratch_url)
    # Then each waiting event holds what the forge provider makes of it; the matched one is left as it was
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT event_id, jsonb_build_array(fact_key, fact) FROM webhook_events"))
                    .all())
    engine.dispose()
    translated = {p["id"]: forge.translate(p) for p in WAITING_FORGE_EVENTS}
    assert rows == {"e0": [None, None], **{e: [t.fact_key, t.fact] for e, t in translated.items()}}


def test_an_upgrade_stops_rather_than_lose_a_waiting_event_of_a_provider_not_installed(scratch_url: str) -> None:
    migrate.upgrade(scratch_url, "0012")
    engine = create_engine(scratch_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO webhook_events (provider, event_id, correlation_key, payload) "
                          "VALUES ('tracker', 't1', 'issue/1', '{}')"))
    with pytest.raises(RuntimeError, match="provider 'tracker' waits to be matched, and this migration knows only"):
        migrate.upgrade(scratch_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM webhook_events")).scalar() == 1
    engine.dispose()


def test_the_migration_job_logs_what_it_did_as_json_lines(infra) -> None:  # type: ignore[no-untyped-def]
    name = f"lrs_{uuid.uuid4().hex[:10]}"
    url = make_url(infra.database_url).set(database=name).render_as_string(hide_password=False)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("LONGRUN_", "OTEL_"))},
           "LONGRUN_DATABASE_URL": url, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")])}

    def migrate_job() -> list[dict[str, str]]:
        done = subprocess.run([sys.executable, "-m", "longrun.db.migrate"], env=env, capture_output=True, text=True,
                              timeout=120, check=True)
        return [json.loads(line) for line in done.stderr.splitlines()]

    try:
        # Given a server without the database, when the job runs, then it says it created it and migrated it
        first = [line["message"] for line in migrate_job() if line["service"] == "migrate"]
        head = ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()
        assert f"created database {name}" in first
        assert any(m.startswith("Running upgrade 0018 -> 0019") for m in first)
        assert first[-1] == f"database {name} migrated from revision (none) to {head}"
        # and run again, that there was nothing to do
        assert migrate_job()[-1]["message"] == f"database {name} already at revision {head}; nothing to do"
    finally:
        admin = create_engine(make_url(infra.database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
