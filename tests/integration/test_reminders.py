"""Reminders, escalation and approval validity through the real services (scheduler, worker, timer,
relay, gateway), clocks scaled to seconds: a person's wait is broadcast as ``run.notice`` on the
events exchange (read here from a real queue), reminds its owner and escalates on durable timers, and
the escalation's role may decide from then on (the operator API, ``longrunctl`` and the console admit it),
not before; a decision older than its validity when
the run resumes is asked again; a question is broadcast like an approval."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from sqlalchemy import text

from longrun.bus import topology
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of
from tests.integration.identities import bearer, token

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"


class Notices:
    """A notifier's queue: bound to acme's notices only, as a mail or chat bridge would bind it."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []

    async def start(self, bus) -> None:  # type: ignore[no-untyped-def]
        channel = await bus.channel(prefetch=100)
        exchange = await channel.get_exchange(topology.EVENTS_EXCHANGE, ensure=False)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "acme.run.notice.#")
        await queue.consume(self._take, no_ack=True)

    async def _take(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.received.append((message.routing_key or "", json.loads(message.body)))

    def of(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(routing key, payload) of the run's notices, in the run's order."""
        found = [(key, body["payload"]) for key, body in self.received if body["run_id"] == run_id]
        return sorted(found, key=lambda kept: kept[1]["seq"])

    def count(self, run_id: str, n: int):  # type: ignore[no-untyped-def]
        async def enough() -> list[tuple[str, dict[str, Any]]] | None:
            found = self.of(run_id)
            return found if len(found) >= n else None
        return enough


@pytest.fixture
async def ensemble(clean, engine, bus, services, tmp_path):  # type: ignore[no-untyped-def]
    """The services running the test-only ``publishing`` and ``asking`` kinds, and a notifier's queue."""
    running = Ensemble(services, tmp_path)
    running.env["LONGRUN_RUN_KINDS"] = "tests.kinds:PUBLISHING,tests.kinds:ASKING"
    running.start_services("gateway", "scheduler", "worker", "relay", "timer")
    notices = Notices()
    await notices.start(bus)
    await running.wait_http(f"{running.gateway_url}/healthz")
    return running, notices


async def _start(bus, engine, workflow: str, **goal: Any) -> str:  # type: ignore[no-untyped-def]
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, workflow=workflow, input_=goal)
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    await eventually(lambda: _status(engine, run_id, "WAITING_USER"), timeout=30, what="WAITING_USER")
    return str(run_id)


async def _status(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status


async def _decide(ensemble: Ensemble, engine, who: str,  # type: ignore[no-untyped-def]
                  run_id: str, wait: dict[str, Any], *roles: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        return await http.post(f"/runs/{run_id}/approve", headers=await bearer(engine, who, *roles), json={
            "approval_id": wait["approval_id"], "approved_hash": wait["approved_hash"], "reason": "reviewed"})


async def _signed_in(console: httpx.AsyncClient, secret: str) -> None:
    form = await console.get("/sign-in")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
    assert csrf is not None, form.text
    answer = await console.post("/sign-in", data={"token": secret, "csrf": csrf.group(1)})
    assert answer.status_code == 303, answer.text


@pytest.mark.long
async def test_an_approval_reminds_escalates_on_the_bus_and_then_the_role_may_decide(  # type: ignore[no-untyped-def]
        ensemble, engine, bus) -> None:
    running, notices = ensemble
    # Given a release waiting for alice's approval, reminded after 1 s and escalated to admins after 2.5 s
    run_id = await _start(bus, engine, "publishing", release="v1", owner="alice", remind_after=[1],
                          escalate_after=2.5, escalate_to="role:admin")
    [(key, asked)] = await eventually(notices.count(run_id, 1), timeout=10, what="the request's notice")
    assert key == "acme.run.notice.approval.requested"
    assert (asked["approval_id"], asked["owner"], asked["subject"], asked["escalated_to"]) == \
        ("publish", "alice", "Publish release v1", None)
    # When an admin who is not alice decides before the escalation, it is refused
    early = await _decide(running, engine, "bob", run_id, asked, "admin")
    assert early.status_code == 403 and "role:admin once it is escalated" in early.json()["error"], early.text
    async with httpx.AsyncClient(base_url=f"{running.gateway_url}/console", timeout=10) as console:
        await _signed_in(console, await token(engine, "bob", "admin"))
        before = await console.get(f"/runs/{run_id}")
        assert 'id="not-yours"' in before.text and 'id="approve"' not in before.text
        assert "role:admin too once it escalates" in before.text
    # Then the reminder and the escalation arrive, in that order, each once
    said = await eventually(notices.count(run_id, 3), timeout=15, what="the reminder and the escalation")
    assert [k for k, _ in said] == ["acme.run.notice.approval.requested", "acme.run.notice.approval.reminder",
                                    "acme.run.notice.approval.escalated"]
    assert (said[1][1]["reminder"], said[2][1]["escalated_to"]) == (1, "role:admin")
    # And the console now offers the admin the approval's buttons
    async with httpx.AsyncClient(base_url=f"{running.gateway_url}/console", timeout=10) as console:
        await _signed_in(console, await token(engine, "bob", "admin"))
        after = await console.get(f"/runs/{run_id}")
        assert 'id="approve"' in after.text and "alice or role:admin (escalated)" in after.text
    # And now the admin decides, from a terminal, and the release is published once
    argv = [str(LONGRUNCTL), "--url", running.gateway_url, "--token", await token(engine, "bob", "admin"),
            "-o", "json", "run", "approve", run_id, "--approval-id", "publish", "--hash", asked["approved_hash"],
            "--reason", "alice is away"]
    approved = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
    assert approved.returncode == 0, approved.stderr
    await eventually(lambda: _status(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    events = await event_types(engine, run_id)
    assert [t for t, _ in events if t.startswith("run.wait_")] == \
        ["run.wait_started", "run.wait_reminded", "run.wait_escalated"]
    [decided] = [d for t, d in events if t == "run.approval_decided"]
    assert decided["decided_by"] == "bob"
    async with engine.connect() as conn:
        published = (await conn.execute(text("SELECT status FROM actions WHERE run_id = :r"), {"r": run_id})).all()
        open_timers = (await conn.execute(text(
            "SELECT count(*) FROM timers WHERE run_id = :r AND fired_at IS NULL AND cancelled_at IS NULL"),
            {"r": run_id})).scalar()
    assert [p.status for p in published] == ["CONFIRMED"] and open_timers == 0
    assert len(notices.of(run_id)) == 3


@pytest.mark.long
async def test_a_decision_past_its_validity_when_the_run_resumes_is_asked_again(  # type: ignore[no-untyped-def]
        ensemble, engine, bus) -> None:
    running, notices = ensemble
    # Given a release approved at once, valid 1 s, to be published when its window opens 3 s later
    run_id = await _start(bus, engine, "publishing", release="v2", owner="alice", valid_for=1,
                          window_at=time.time() + 3)
    [(_, asked)] = await eventually(notices.count(run_id, 1), timeout=10, what="the request's notice")
    assert (await _decide(running, engine, "alice", run_id, asked)).status_code == 200
    # When the window opens the decision is 2 s older than it may be: expired, and asked again
    again = await eventually(notices.count(run_id, 2), timeout=15, what="the request asked again")
    assert again[1][1]["notice"] == "requested" and again[1][1]["wait_id"] != asked["wait_id"]
    assert await status_of(engine, run_id) == "WAITING_USER"
    events = await event_types(engine, run_id)
    [expired] = [d for t, d in events if t == "run.approval_expired"]
    assert expired["approval_id"] == "publish" and expired["valid_until"] < time.time()
    assert [t for t, _ in events].count("run.approval_decided") == 1
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM actions WHERE run_id = :r"), {"r": run_id})).scalar() == 0
    # Then a fresh decision publishes at once
    assert (await _decide(running, engine, "alice", run_id, again[1][1])).status_code == 200
    await eventually(lambda: _status(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")


@pytest.mark.long
async def test_a_question_is_broadcast_and_reminded_like_an_approval(  # type: ignore[no-untyped-def]
        ensemble, engine, bus) -> None:
    running, notices = ensemble
    run_id = await _start(bus, engine, "asking", task="retry storms", owner="alice", remind_after=[1])
    said = await eventually(notices.count(run_id, 2), timeout=15, what="the question and its reminder")
    assert [k for k, _ in said] == ["acme.run.notice.question.requested", "acme.run.notice.question.reminder"]
    assert (said[0][1]["question_id"], said[0][1]["subject"], said[0][1]["owner"]) == \
        ("module", "Which module is 'retry storms' about?", "alice")
    async with httpx.AsyncClient(base_url=running.gateway_url, timeout=10) as http:
        answered = await http.post(f"/runs/{run_id}/answer", headers=await bearer(engine, "alice"), json={
            "question_id": "module", "answer": {"module": "billing"}, "reason": "billing owns it"})
    assert answered.status_code == 200, answered.text
    await eventually(lambda: _status(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
