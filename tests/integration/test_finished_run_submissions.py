"""A run that ends while its request is out still gets that request settled (found by the property tests).

Terminated by an operator, timed out, or out of budget while an action was SUBMITTED, and the
worker that sent it died before recording its answer: no worker ever comes back for a finished
run, so the ledger row stayed SUBMITTED for good — an effect nobody would ever confirm or rule
out. The reconciler now takes such a row once ``abandoned_after`` has passed (a worker still in
its call has answered by then), stores ``action.unknown`` and the reconciliation as late events
of the finished run, and settles the ledger row by idempotency key like any other.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import text

from longrun.app.gateway import operate
from longrun.app.reconciler.settle import ENDED_WHILE_SUBMITTED
from longrun.authoring import Registry, RunKind, Tool, ToolResult
from longrun.bus import topology
from longrun.db import actions as ledger
from longrun.db import runs
from longrun.db.transaction import PgTransaction
from longrun.services.reconciler.sweeps import reconcile_unknown
from longrun.domain import (
    ActionStatus,
    EffectKind,
    PinnedVersions,
    RunStatus,
    Usage,
    freeze,
    idempotency_key,
    request_hash,
)
from longrun.domain import events as ev
from longrun.testing.invariants import check
from tests.fixtures import PARTITIONS

pytestmark = pytest.mark.integration

VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")
TOOL = "probe.open_pr"
REQUEST = {"repo": "acme/payments", "title": "Upgrade payment-sdk"}


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    title: str


class _NoDecisions:
    kind = "probe"

    def decide(self, state: Any, ctx: Any) -> Any:
        raise AssertionError("the reconciler never asks the workflow to decide")

    def accept(self, state: Any, evidence: Any) -> tuple[str, ...]:
        return ()


async def _never(args: Any, key: str, token: int) -> ToolResult:
    raise AssertionError("the reconciler never executes a tool")


def _kinds(found: ToolResult | None) -> tuple[Registry, list[str]]:
    asked: list[str] = []

    async def lookup(key: str) -> ToolResult | None:
        asked.append(key)
        return found

    tool = Tool(TOOL, "1", EffectKind.NON_IDEMPOTENT_WRITE, _Args, _never, lookup, start_to_close=2.0)
    return Registry([RunKind("probe", VERSIONS, _NoDecisions(), {TOOL: tool})]), asked  # type: ignore[arg-type]


async def _terminated_while_submitted(engine: Any) -> tuple[str, str]:
    """A run whose worker submitted ``pr`` and died; an operator then terminated the run."""
    run_id, at = f"run-{uuid.uuid4()}", time.time()
    key = idempotency_key(run_id, "pr", attempt_scope=1)
    created = ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id="acme", kind="probe",
                            goal=freeze({"repo": REQUEST["repo"]}), versions=VERSIONS,  # type: ignore[arg-type]
                            budget=Usage(model_calls=5, tool_calls=5, cost=1.0))
    async with engine.begin() as conn:
        stored = await runs.create(conn, created, idempotency_key=run_id, input_hash="h" * 64,
                                   partition=topology.partition_of(run_id, PARTITIONS))
        assert stored is not None
        await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=2, at=at, to=RunStatus.RUNNING, reason="taken by a worker that will die"),
            ev.ActionPrepared(seq=3, at=at, logical_action="pr", tool=TOOL, tool_version="1",
                              effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, idempotency_key=key,
                              request_hash=request_hash(TOOL, "1", args=REQUEST)),
            ev.ActionSubmitted(seq=4, at=at, logical_action="pr"),
            ev.BudgetCharged(seq=5, at=at, tool_calls=1)])
        await ledger.prepare(conn, action_id=str(uuid.uuid4()), run_id=run_id, logical_action="pr", tool=TOOL,
                             tool_version="1", effect_kind=EffectKind.NON_IDEMPOTENT_WRITE.value,
                             idempotency_key=key, request_hash=request_hash(TOOL, "1", args=REQUEST),
                             request=dict(REQUEST), fencing_token=1)
    async with engine.begin() as conn:
        await operate.terminate(PgTransaction(conn), run_id, actor="ops", reason="incident")
    return run_id, key


@pytest.mark.parametrize("found", [ToolResult("42", {"id": 42, **REQUEST}), None], ids=["it happened", "it did not"])
async def test_a_submission_left_by_a_finished_run_is_reconciled_with_late_events(clean, engine, found) -> None:
    run_id, key = await _terminated_while_submitted(engine)
    kinds, asked = _kinds(found)
    report = await check(engine, settled=True)
    assert f"{run_id}: pr left SUBMITTED (run TERMINATED)" in report.violations
    # While a worker may still be in its call, the reconciler leaves it alone...
    assert await reconcile_unknown(engine, kinds, limit=10, clock=time.time) == {}
    assert asked == []
    # ...once that time is over, it asks the far side by key and settles the action.
    outcome = ActionStatus.CONFIRMED if found else ActionStatus.RETRYABLE
    assert await reconcile_unknown(engine, kinds, limit=10, clock=time.time, abandoned_after=0) == {outcome.value: 1}
    assert asked == [key]
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
        row = await ledger.get(conn, key)
        late = (await conn.execute(text(
            "SELECT type, data FROM run_events WHERE run_id = :r AND NOT applied ORDER BY seq"), {"r": run_id})).all()
    assert stored is not None and row is not None
    # The finished run did not change; its history says what became of the request; the ledger moved on.
    assert stored.snapshot.status is RunStatus.TERMINATED and stored.snapshot.action("pr").status.value == "SUBMITTED"
    assert [t for t, _ in late][:3] == ["action.unknown", "action.reconciliation_started", "action.reconciled"]
    assert late[0].data["cause"] == ENDED_WHILE_SUBMITTED and late[2].data["outcome"] == outcome.value
    assert row.status == outcome.value
    (await check(engine, settled=True)).assert_clean()
    # and it is settled once: the next sweeps find nothing.
    assert await reconcile_unknown(engine, kinds, limit=10, clock=time.time, abandoned_after=0) == {}
