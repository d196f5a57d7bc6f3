"""Build runs in a given state through the real domain events and store (no shortcuts into tables)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app import effects
from longrun.bus import topology
from longrun.db import runs
from longrun.db.runs import StoredRun
from longrun.domain import PinnedVersions, RunStatus, Usage, Wait, freeze
from longrun.domain import events as ev
from tests.fixtures import PARTITIONS

VERSIONS = PinnedVersions(workflow="1", prompt="upgrade-v1", model_policy="scripted-or-openai-v1",
                          tool_schemas="forge-v1")


UPGRADE_GOAL = {"repo": "acme/payments", "branch": "b", "owner": "user_42", "package": "p", "to": "5"}


async def created(engine: AsyncEngine, *, tenant: str = "acme", kind: str = "dependency_upgrade",
                  goal: dict[str, Any] | None = None, versions: PinnedVersions = VERSIONS) -> StoredRun:
    run_id = f"run-{uuid.uuid4()}"
    event = ev.RunCreated(seq=1, at=time.time(), run_id=run_id, tenant_id=tenant, kind=kind,
                          goal=freeze(UPGRADE_GOAL if goal is None else goal),
                          versions=versions, budget=Usage(model_calls=10, tool_calls=20, cost=5.0))
    async with engine.begin() as conn:
        stored = await runs.create(conn, event, idempotency_key=f"k-{run_id}", input_hash="h" * 64,
                                   partition=topology.partition_of(run_id, PARTITIONS))
    assert stored is not None
    return stored


async def waiting_for_event(engine: AsyncEngine, correlation_key: str, *, deadline_in: float = 3600) -> StoredRun:
    stored = await created(engine)
    now = time.time()
    wait = Wait(wait_id=str(uuid.uuid4()), kind="ci", deadline=now + deadline_in, correlation_key=correlation_key)
    async with engine.begin() as conn:
        stored = await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.WaitStarted(seq=stored.seq(2), at=now, status=RunStatus.WAITING_EVENT, wait=wait)])
        await effects.schedule_wait_timers(conn, stored.snapshot, decided_at=now)
    return stored


async def waiting_for_user(engine: AsyncEngine, *, approval_id: str, approved_hash: str) -> StoredRun:
    stored = await created(engine)
    now = time.time()
    wait = Wait(wait_id=str(uuid.uuid4()), kind="approval", deadline=now + 3600, approval_id=approval_id,
                owner="user_42", approved_hash=approved_hash, subject="merge")
    async with engine.begin() as conn:
        return await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.WaitStarted(seq=stored.seq(2), at=now, status=RunStatus.WAITING_USER, wait=wait)])
