"""Build runs in a given state through the real domain events and store (no shortcuts into tables)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.db import actions as ledger
from longrun.db import runs, timers
from longrun.domain import (
    ActionStatus,
    EffectKind,
    PinnedVersions,
    RunStatus,
    Usage,
    Wait,
    freeze,
    idempotency_key,
    request_hash,
)
from longrun.domain import events as ev
from longrun.domain.signals import signal_wait
from longrun.ports.runs import StoredRun, wait_timers
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


async def waiting_for_event(engine: AsyncEngine, correlation_key: str, *, deadline_in: float = 3600,
                            tenant: str = "acme", provider: str = "forge", kind: str = "dependency_upgrade",
                            goal: dict[str, Any] | None = None, versions: PinnedVersions = VERSIONS) -> StoredRun:
    stored = await created(engine, tenant=tenant, kind=kind, goal=goal, versions=versions)
    now = time.time()
    wait = Wait(wait_id=str(uuid.uuid4()), kind="ci", deadline=now + deadline_in, correlation_key=correlation_key,
                provider=provider)
    async with engine.begin() as conn:
        stored = await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.WaitStarted(seq=stored.seq(2), at=now, status=RunStatus.WAITING_EVENT, wait=wait)])
        await timers.schedule_all(conn, wait_timers(stored.snapshot, decided_at=now))
    return stored


async def waiting_for_signal(engine: AsyncEngine, name: str, *, kind: str, versions: PinnedVersions,
                             tenant: str = "acme", goal: dict[str, Any] | None = None) -> StoredRun:
    """A run of ``kind`` waiting an hour for a signal named ``name``."""
    stored = await created(engine, tenant=tenant, kind=kind, goal=goal or {}, versions=versions)
    now = time.time()
    status, wait = signal_wait(str(uuid.uuid4()), name, now + 3600)
    async with engine.begin() as conn:
        stored = await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.WaitStarted(seq=stored.seq(2), at=now, status=status, wait=wait)])
        await timers.schedule_all(conn, wait_timers(stored.snapshot, decided_at=now))
    return stored


async def waiting_for_user(engine: AsyncEngine, *, approval_id: str, approved_hash: str, owner: str = "user_42",
                           tenant: str = "acme") -> StoredRun:
    stored = await created(engine, tenant=tenant)
    now = time.time()
    wait = Wait(wait_id=str(uuid.uuid4()), kind="approval", deadline=now + 3600, approval_id=approval_id,
                owner=owner, approved_hash=approved_hash, subject="merge")
    async with engine.begin() as conn:
        return await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.WaitStarted(seq=stored.seq(2), at=now, status=RunStatus.WAITING_USER, wait=wait)])


async def asking(engine: AsyncEngine, *, question_id: str, owner: str | None = None) -> StoredRun:
    """A run waiting for the answer to ``question_id`` (an object with a ``module`` string)."""
    stored = await created(engine)
    now = time.time()
    wait = Wait(wait_id=str(uuid.uuid4()), kind="question", deadline=now + 3600, owner=owner,
                question_id=question_id, subject="which module?")
    schema = {"type": "object", "properties": {"module": {"type": "string"}}, "required": ["module"]}
    async with engine.begin() as conn:
        return await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.QuestionOpened(seq=stored.seq(2), at=now, question_id=question_id, text="Which module?",
                              answer_schema=freeze(schema)),
            ev.WaitStarted(seq=stored.seq(3), at=now, status=RunStatus.WAITING_USER, wait=wait)])


async def completed(engine: AsyncEngine) -> StoredRun:
    stored = await created(engine)
    now = time.time()
    async with engine.begin() as conn:
        return await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.RunCompleted(seq=stored.seq(2), at=now, evidence=freeze({"ok": True}))])


async def action_unknown(engine: AsyncEngine, *, logical_action: str = "open_mr") -> StoredRun:
    """A run parked in ACTION_UNKNOWN: its worker submitted ``logical_action`` and got no answer (the
    ledger row UNKNOWN too)."""
    return await _submitted_then(engine, logical_action, ActionStatus.UNKNOWN, lambda seq, at: [
        ev.ActionUnknown(seq=seq(4), at=at, logical_action=logical_action, cause="no answer"),
        ev.RunStatusChanged(seq=seq(5), at=at, to=RunStatus.ACTION_UNKNOWN,
                            reason=f"{logical_action}: outcome unknown")])


async def action_failed(engine: AsyncEngine, *, logical_action: str = "open_mr") -> StoredRun:
    """A run held in NEEDS_ATTENTION because the far side rejected ``logical_action`` (the ledger row
    FAILED too): what an operator retries once the cause is fixed."""
    return await _submitted_then(engine, logical_action, ActionStatus.FAILED, lambda seq, at: [
        ev.ActionFailed(seq=seq(4), at=at, logical_action=logical_action, error="branch protected"),
        ev.RunStatusChanged(seq=seq(5), at=at, to=RunStatus.NEEDS_ATTENTION, reason=f"{logical_action} failed")])


async def _submitted_then(engine: AsyncEngine, logical_action: str, outcome: ActionStatus,
                          then: Callable[[Callable[[int], int], float], list[ev.RunEvent]]) -> StoredRun:
    """A run whose worker submitted ``logical_action`` (a merge request), then the events ``then`` gives
    (by seq and time), its ledger row left at ``outcome``."""
    stored = await created(engine)
    now, run_id = time.time(), stored.snapshot.run_id
    key = idempotency_key(run_id, logical_action, attempt_scope=1)
    args = {"repo": "acme/payments", "title": "Upgrade p"}
    digest = request_hash("forge.open_merge_request", "1", args=args)
    async with engine.begin() as conn:
        after = await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=now, to=RunStatus.RUNNING, reason="test"),
            ev.ActionPrepared(seq=stored.seq(2), at=now, logical_action=logical_action,
                              tool="forge.open_merge_request", tool_version="1",
                              effect_kind=EffectKind.IDEMPOTENT_WRITE, idempotency_key=key, request_hash=digest),
            ev.ActionSubmitted(seq=stored.seq(3), at=now, logical_action=logical_action),
            *then(stored.seq, now)])
        await ledger.prepare(conn, action_id=str(uuid.uuid4()), run_id=run_id, logical_action=logical_action,
                             tool="forge.open_merge_request", tool_version="1",
                             effect_kind=EffectKind.IDEMPOTENT_WRITE.value, idempotency_key=key, request_hash=digest,
                             request=args, fencing_token=1)
        await ledger.record(conn, key, outcome)
    return after
