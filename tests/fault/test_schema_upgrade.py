"""Row: the state schema is upgraded while a run waits for approval.

``fixtures/run_waiting_for_approval.snapshot-v1.json`` is what the previous release (snapshot
schema 1, commit in ``produced_by``) stored for a dependency upgrade parked in WAITING_USER:
its ``runs`` row with the schema-1 snapshot, its 40 events, its action ledger and timers, and
the forge's objects. The test loads those rows as they were written (every timestamp moved
by the same amount, so the approval is not overdue) and lets this release resume the run.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import insert

from longrun.db.schema import actions, run_events, runs, timers
from longrun.domain import SNAPSHOT_SCHEMA_VERSION, RunStatus
from tests.fault.scenario import EVERYTHING, Scenario
from tests.integration.ensemble import OPERATOR_TOKEN

pytestmark = [pytest.mark.fault, pytest.mark.integration]

RECORDED = Path(__file__).parent / "fixtures" / "run_waiting_for_approval.snapshot-v1.json"
EPOCH_FIELDS = frozenset({"at", "created_at", "status_since", "recorded_at", "deadline", "wake_at"})


def _shift(value: Any, by: float, key: str = "") -> Any:
    """The recorded data with every point in time moved by ``by`` seconds, nothing else changed."""
    if isinstance(value, dict):
        return {k: _shift(v, by, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift(v, by) for v in value]
    if key in EPOCH_FIELDS and isinstance(value, float | int) and not isinstance(value, bool):
        return value + by
    if isinstance(value, str) and key.endswith(("_at", "_until", "_deadline")) and "T" in value:
        return datetime.fromisoformat(value) + timedelta(seconds=by)
    return value


async def _restore(scenario: Scenario, recorded: dict[str, Any]) -> str:
    """Write the recorded rows back exactly as the schema-1 code left them (times shifted)."""
    by = time.time() - recorded["runs"][0]["snapshot"]["status_since"]
    rows = {table: [_shift(row, by) for row in recorded[table]] for table in ("runs", "run_events", "actions", "timers")}
    async with scenario.engine.begin() as conn:
        for table, name in ((runs, "runs"), (run_events, "run_events"), (actions, "actions"), (timers, "timers")):
            await conn.execute(insert(table), rows[name])
    forge = sqlite3.connect(scenario.tmp / "forge.sqlite")
    forge.executescript("""
        CREATE TABLE objects (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, repo TEXT NOT NULL,
            ref TEXT NOT NULL, idempotency_key TEXT NOT NULL, body TEXT NOT NULL, UNIQUE (kind, repo, ref));
        CREATE TABLE idempotency (key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, response TEXT NOT NULL);""")
    with forge:
        for row in recorded["forge_objects"]:
            forge.execute("INSERT INTO objects VALUES (:seq, :kind, :repo, :ref, :idempotency_key, :body)", row)
        for row in recorded["forge_idempotency"]:
            forge.execute("INSERT INTO idempotency VALUES (:key, :request_hash, :response)", row)
    forge.close()
    return str(recorded["runs"][0]["run_id"])


async def test_a_run_parked_for_approval_under_snapshot_schema_1_is_resumed_by_this_release(
        scenario: Scenario) -> None:
    # Given a run that the previous release parked for approval, its snapshot stored as schema 1
    recorded = json.loads(RECORDED.read_text())
    assert recorded["runs"][0]["snapshot"]["schema_version"] == 1 < SNAPSHOT_SCHEMA_VERSION
    run_id = await _restore(scenario, recorded)
    # When this release is deployed in its place
    await scenario.up(*EVERYTHING)
    stored = await scenario.scalar("SELECT snapshot FROM runs WHERE run_id = :r", r=run_id)
    assert stored["schema_version"] == 1, "nothing rewrote the parked run on start"
    # Then the operator console shows the run and what it waits for
    async with httpx.AsyncClient(base_url=scenario.ensemble.gateway_url, timeout=10) as gateway:
        console = await gateway.get(f"/runs/{run_id}", headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert console.status_code == 200, f"the console cannot show the parked run: {console.status_code} {console.text}"
    shown = console.json()
    assert shown["snapshot"]["status"] == "WAITING_USER" and shown["snapshot"]["labels"] == {}
    assert len(shown["events"]) == len(recorded["run_events"])
    # and the owner's approval of exactly the hash shown is accepted and the run completes
    response = await scenario.approve(run_id)
    assert response.status_code == 200, response.text
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    assert done.snapshot.acceptance is not None and done.snapshot.acceptance.unmet == ()
    # with the merge request made once under the approved hash, nothing done before repeated,
    # and the run's snapshot now stored under this release's schema
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    merge = (await scenario.ledger(run_id))["merge_request"]
    assert merge.status == "CONFIRMED" and merge.request_hash == shown["snapshot"]["wait"]["approved_hash"]
    rewritten = await scenario.scalar("SELECT snapshot FROM runs WHERE run_id = :r", r=run_id)
    assert rewritten["schema_version"] == SNAPSHOT_SCHEMA_VERSION
    history = await scenario.events(run_id)
    assert [(e["seq"], e["type"]) for e in history[:len(recorded["run_events"])]] == [
        (e["seq"], e["type"]) for e in recorded["run_events"]]
    await scenario.finish()
