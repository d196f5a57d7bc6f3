"""Who decides an approval is checked on the run as it is decided: a run that starts waiting for
an approval while a non-owner's decision is in flight is not decided by them (driven by a
turnstile between the decision's read of the run and its write)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from sqlalchemy import text

from longrun.app.gateway import operate
from longrun.db import runs
from longrun.db.transaction import PgTransaction
from longrun.domain import RunStatus, Wait
from longrun.domain import events as ev
from longrun.ports.runs import StoredRun
from longrun.principals import Principal
from tests.integration.runs_factory import created

pytestmark = pytest.mark.integration

MALLORY = Principal("mallory", frozenset({"approver"}), None)


class Turnstile(PgTransaction):
    """Stops after its first read of a run until ``go`` is set."""

    def __init__(self, conn, read: asyncio.Event, go: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
        super().__init__(conn)
        self.read, self.go = read, go

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        stored = await super().load(run_id, lock=lock)
        if not self.read.is_set():
            self.read.set()
            await self.go.wait()
        return stored


async def start_waiting_for_approval(engine, stored: StoredRun) -> None:  # type: ignore[no-untyped-def]
    now = time.time()
    wait = Wait(wait_id=str(uuid.uuid4()), kind="approval", deadline=now + 3600, approval_id="ap-1",
                owner="user_42", approved_hash="h1", subject="merge")
    async with engine.begin() as conn:
        await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.WaitStarted(seq=stored.seq(2), at=now, status=RunStatus.WAITING_USER, wait=wait)])


async def blocked_on_a_row_lock(engine) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return bool((await conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"))).scalar())


async def test_a_non_owner_deciding_while_the_run_starts_waiting_decides_nothing(clean, engine) -> None:
    # Given a run about to wait for approval ap-1, owned by user_42
    stored = await created(engine)
    read, go = asyncio.Event(), asyncio.Event()

    async def mallory_decides() -> None:
        async with engine.begin() as conn:
            await operate.decide_approval(Turnstile(conn, read, go), stored.snapshot.run_id, approval_id="ap-1",
                                          approved_hash="h1", approved=True, by=MALLORY, reason="mine")
    # When mallory's decision has read the run (not yet waiting) and the run then starts waiting
    deciding = asyncio.create_task(mallory_decides())
    await read.wait()
    waiting = asyncio.create_task(start_waiting_for_approval(engine, stored))
    deadline = time.monotonic() + 10
    while not waiting.done() and not await blocked_on_a_row_lock(engine):
        assert time.monotonic() < deadline, "the run neither started waiting nor waited for the decision's lock"
        await asyncio.sleep(0.01)
    go.set()
    # Then mallory's decision is refused and the run waits for user_42's
    with pytest.raises((operate.NotPending, operate.NotPermitted)):
        await deciding
    await waiting
    async with engine.connect() as conn:
        after = await runs.load(conn, stored.snapshot.run_id)
        decided = (await conn.execute(text("SELECT count(*) FROM run_events WHERE run_id = :r "
                                           "AND type = 'run.approval_decided'"), {"r": stored.snapshot.run_id})).scalar()
    assert after is not None and after.snapshot.status is RunStatus.WAITING_USER
    assert decided == 0
