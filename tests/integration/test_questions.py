"""A run asks a person a question and uses the answer, through the real services (scheduler, relay,
worker, timer, gateway): the operator API and ``longrunctl run answer`` take the answer, check it
against the question's JSON Schema (a bad one is refused with 422 and nothing is stored), record it
once, and the run completes with it as evidence; an unanswered question ends at its deadline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for
from tests.integration.identities import bearer, token

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"


async def operator(engine, name: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Acting as ``name``, an approver (who may answer)."""
    return await bearer(engine, name)


@pytest.fixture
async def asking(clean, engine, bus, services, tmp_path):  # type: ignore[no-untyped-def]
    """The ensemble running the test-only ``asking`` kind, and a function that starts a run of it and
    returns its id once it waits for the answer."""
    ensemble = Ensemble(services, tmp_path)
    ensemble.env["LONGRUN_RUN_KINDS"] = "tests.kinds:ASKING"
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")

    async def start(**goal: Any) -> str:
        key = new_key()
        await publish_create(bus, tenant="acme", key=key, workflow="asking",
                             input_={"task": "retry storms", "owner": "alice", **goal})
        run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
        await eventually(lambda: _row(engine, run_id, "WAITING_USER"), timeout=30, what="the question")
        return str(run_id)

    return ensemble, start


async def test_a_question_is_asked_answered_through_the_api_and_used(asking, engine) -> None:  # type: ignore[no-untyped-def]
    ensemble, start = asking
    run_id = await start()
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        # Given the run shows the question it asks: its text, answer schema, owner and deadline
        run = (await http.get(f"/runs/{run_id}", headers=await operator(engine, "alice"))).json()
        shown = run["snapshot"]
        [question] = shown["open_questions"]
        assert question["question_id"] == "module" and question["text"] == "Which module is 'retry storms' about?"
        assert question["answer_schema"]["required"] == ["module"]
        assert (shown["wait"]["kind"], shown["wait"]["question_id"], shown["wait"]["owner"]) == \
            ("question", "module", "alice")
        assert run["allowed_operations"] == ["answer", "pause", "cancel", "terminate"]
        assert run["next_timer"]["kind"] == "wait_deadline" and run["lease"] is None
        assert shown["wait"]["deadline"] > shown["status_since"]
        listed = (await http.get("/runs", params={"wait_kind": "question"}, headers=await operator(engine, "alice"))).json()["runs"]
        assert [r["run_id"] for r in listed] == [run_id]
        stored = await _stored(engine, run_id)
        # When an answer breaks the schema, it is refused with 422 naming the violation, and nothing is stored
        bad = await http.post(f"/runs/{run_id}/answer", headers=await operator(engine, "alice"), json={
            "question_id": "module", "answer": {"module": 7}, "reason": "it is the seventh"})
        assert bad.status_code == 422, bad.text
        assert bad.json()["problems"] == ["$.module: 7 is not of type 'string'"]
        assert "7 is not of type 'string'" in bad.json()["error"]
        # And someone other than the owner it names is refused
        other = await http.post(f"/runs/{run_id}/answer", headers=await operator(engine, "bob"), json={
            "question_id": "module", "answer": {"module": "billing"}, "reason": "I know"})
        assert other.status_code == 403, other.text
        assert await _stored(engine, run_id) == stored
        # When the owner answers, and the request is retried
        body = {"question_id": "module", "answer": {"module": "billing", "urgent": True}, "reason": "billing owns it"}
        answered = await http.post(f"/runs/{run_id}/answer", headers=await operator(engine, "alice"), json=body)
        assert answered.status_code == 200, answered.text
        retried = await http.post(f"/runs/{run_id}/answer", headers=await operator(engine, "alice"), json=body)
        assert retried.status_code == 200 and retried.json()["repeated"] is True
        # Then the run completes with the answer as its evidence, recorded once and audited once
        await eventually(lambda: _row(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
        events = await event_types(engine, run_id)
        [resolved] = [d for t, d in events if t == "question.resolved"]
        assert (resolved["answer"], resolved["answered_by"]) == ({"module": "billing", "urgent": True}, "alice")
        [completed] = [d for t, d in events if t == "run.completed"]
        assert completed["evidence"] == {"answer": {"module": "billing", "urgent": True}, "answered_by": "user:alice"}
        assert await _audited(engine, run_id) == [("alice", "billing owns it", {"question_id": "module"})]
        # And a different answer now is refused, naming why
        late = await http.post(f"/runs/{run_id}/answer", headers=await operator(engine, "alice"), json={
            "question_id": "module", "answer": {"module": "payments"}, "reason": "changed my mind"})
        assert late.status_code == 409 and "alice answered it already" in late.json()["error"]


async def test_longrunctl_answers_a_question(asking, engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ensemble, start = asking
    run_id = await start()
    stored = await _stored(engine, run_id)
    # When the owner answers from a terminal, first without an answer, then with one the schema refuses
    unsaid = await _longrunctl(ensemble, engine, "alice", "run", "answer", run_id, "module")
    assert unsaid.returncode == 2 and "exactly one of --json and --answer-file" in unsaid.stderr
    (tmp_path / "answer.json").write_text('{"module": ""}')
    refused = await _longrunctl(ensemble, engine, "alice", "run", "answer", run_id, "module",
                                "--answer-file", str(tmp_path / "answer.json"))
    assert refused.returncode == 1 and "422" in refused.stderr and "should be non-empty" in refused.stderr
    assert await _stored(engine, run_id) == stored
    answered = await _longrunctl(ensemble, engine, "alice", "run", "answer", run_id, "module", "--json",
                                 '{"module": "ledger"}', "--reason", "the ledger team owns retries")
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["repeated"] is False
    # Then the run completes with that answer
    await eventually(lambda: _row(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    [completed] = [d for t, d in await event_types(engine, run_id) if t == "run.completed"]
    assert completed["evidence"]["answer"] == {"module": "ledger"}
    assert await _audited(engine, run_id) == [("alice", "the ledger team owns retries", {"question_id": "module"})]


@pytest.mark.long
async def test_an_unanswered_question_ends_at_its_deadline(asking, engine) -> None:  # type: ignore[no-untyped-def]
    ensemble, start = asking
    run_id = await start(answer_within=2)
    # When nobody answers before the deadline, the timer service ends the wait and the question
    await eventually(lambda: _row(engine, run_id, "FAILED"), timeout=30, what="FAILED at the deadline")
    events = await event_types(engine, run_id)
    assert [d["reason"] for t, d in events if t == "run.woken"] == ["deadline"]
    assert not any(t == "question.resolved" for t, _ in events)
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        shown = (await http.get(f"/runs/{run_id}", headers=await operator(engine, "alice"))).json()["snapshot"]
        assert shown["open_questions"] == [] and shown["terminal_reason"] == \
            "nobody said which module before the question's deadline"
        # Then an answer now is refused, naming why, and nothing is stored
        stored = await _stored(engine, run_id)
        late = await http.post(f"/runs/{run_id}/answer", headers=await operator(engine, "alice"), json={
            "question_id": "module", "answer": {"module": "billing"}, "reason": "sorry, late"})
        assert late.status_code == 409 and "it is FAILED and waits for no answer" in late.json()["error"]
        assert await _stored(engine, run_id) == stored


async def _longrunctl(ensemble: Ensemble, engine, operator_name: str,  # type: ignore[no-untyped-def]
                      *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(LONGRUNCTL), "--url", ensemble.gateway_url, "--token", await token(engine, operator_name),
            "-o", "json", *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


async def _row(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT status FROM runs WHERE run_id = :r"), {"r": run_id})).scalar() \
            == status


async def _stored(engine, run_id: str) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
    """What an answer would change: the run's revision and events, and the audit rows about it."""
    async with engine.connect() as conn:
        revision = (await conn.execute(text("SELECT revision FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()
        events = (await conn.execute(text("SELECT count(*) FROM run_events WHERE run_id = :r"),
                                     {"r": run_id})).scalar()
        audited = (await conn.execute(text("SELECT count(*) FROM audit_log WHERE target = :r"),
                                      {"r": run_id})).scalar()
    return revision, events, audited


async def _audited(engine, run_id: str) -> list[tuple[str, str, dict[str, Any]]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT actor, reason, details FROM audit_log WHERE action = 'answer' "
                                       "AND target = :r"), {"r": run_id})
        return [(r.actor, r.reason, {k: v for k, v in r.details.items() if k == "question_id"}) for r in rows]
