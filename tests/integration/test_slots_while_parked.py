"""Which waits hold a slot, with real processes: runs parked on an open breaker give their tenant's
slots back, and are queued again, not woken onto a worker, when it closes.

The run kind is ``tests/integration/gated_kinds.py``: its far side is a gate that answers unavailable
while a file exists, and counts every call that got through in another. A sampler reads the runs
table all along: the tenant's runs holding a slot never number more than its slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.connection import Bus
from longrun.db.schema import HOLDS_SLOT
from longrun.domain import RunStatus
from longrun.domain.breaker import TOOL_HEALTHY_WAIT
from longrun.envelope import make
from tests.fault.scenario import Scenario
from tests.harness import Services
from tests.infra import Infra

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SLOTS = 2
SERVICES = ("scheduler", "relay", "timer", "reconciler", "worker")
TENANT = "acme"


class Gate:
    """The far side: down while ``down`` exists; ``calls`` holds one idempotency key per call that got through."""

    def __init__(self, tmp: Path) -> None:
        self.down_flag, self.calls_file, self.decided_file = tmp / "gate-down", tmp / "gate-calls", tmp / "decided"
        self.calls_file.touch()
        self.decided_file.touch()

    def env(self, **more: str) -> dict[str, str]:
        return {"LONGRUN_RUN_KINDS": "tests.integration.gated_kinds:kinds", "GATE_DOWN": str(self.down_flag),
                "GATE_CALLS": str(self.calls_file), "GATE_DECIDED": str(self.decided_file),
                "LONGRUN_TENANT_SLOTS": str(SLOTS),
                "LONGRUN_BREAKER_THRESHOLD": "1", "LONGRUN_BREAKER_COOL_DOWN": "3",
                "LONGRUN_BREAKER_MAX_WAIT": "120", **more}

    def break_down(self) -> None:
        self.down_flag.touch()

    def repair(self) -> None:
        self.down_flag.unlink()

    def calls(self) -> list[str]:
        return self.calls_file.read_text().split()

    def decisions(self, run_id: str) -> int:
        """How many times the run kind was asked to decide for ``run_id``."""
        return self.decided_file.read_text().split().count(run_id)


class SlotSampler:
    """The most runs of the tenant that held a slot at once, read from the runs table every 20 ms
    (a read that fails while the database is down is skipped)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.most = 0
        self.samples = 0

    async def sample(self) -> None:
        query = text(f"SELECT count(*) FROM runs WHERE tenant_id = :t AND {HOLDS_SLOT}")
        while True:
            try:
                async with self.engine.connect() as conn:
                    held = (await conn.execute(query, {"t": TENANT})).scalar_one()
                self.most, self.samples = max(self.most, held), self.samples + 1
            except Exception:  # the database restarting: the next sample reconnects
                await self.engine.dispose()
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def sampling(engine: AsyncEngine) -> AsyncIterator[SlotSampler]:
    sampler = SlotSampler(engine)
    task = asyncio.create_task(sampler.sample())
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def parked(scenario: Scenario, run_ids: list[str]) -> bool:
    """Every run of ``run_ids`` waits for the gate's health, holding no slot."""
    rows = await scenario.rows(
        "SELECT count(*) AS n FROM runs WHERE run_id = ANY(:ids) AND wait_kind = :kind AND admitted_at IS NULL",
        ids=run_ids, kind=TOOL_HEALTHY_WAIT)
    return rows[0].n == len(run_ids)


async def completed(scenario: Scenario, run_ids: list[str], *, timeout: float) -> None:
    for run_id in run_ids:
        done = await scenario.until(run_id, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION,
                                    timeout=timeout)
        assert done.snapshot.status is RunStatus.COMPLETED, await scenario.explain(run_id, "not COMPLETED")


async def admitted_after_their_last_wake(scenario: Scenario, run_ids: list[str]) -> list[str]:
    """The runs not admitted since their last wake: woken straight onto a worker."""
    rows = await scenario.rows(
        "SELECT r.run_id FROM runs r WHERE r.run_id = ANY(:ids) AND (r.admitted_at IS NULL OR r.admitted_at < "
        "(SELECT max(e.occurred_at) FROM run_events e WHERE e.run_id = r.run_id AND e.type = 'run.woken'))",
        ids=run_ids)
    return [r.run_id for r in rows]


@pytest.fixture
async def scenario(clean: None, infra: Infra, engine: AsyncEngine, bus: Bus, services: Services,
                   tmp_path: Path) -> AsyncIterator[Scenario]:
    yield Scenario(services, infra, engine, bus, tmp_path)


@pytest.mark.long
async def test_runs_parked_on_an_open_breaker_hold_no_slot_and_are_queued_again_when_it_closes(
        scenario: Scenario, tmp_path: Path) -> None:
    # Given a tenant with two slots, and a far side that is down
    gate = Gate(tmp_path)
    gate.break_down()
    await scenario.up(*SERVICES, forge=False, **gate.env())
    async with sampling(scenario.engine) as sampler:
        # When two runs that call it start: the breaker opens and both park, giving their slots back
        gated = [await scenario.create(workflow="gated", input_={"gated": True}) for _ in range(2)]
        await scenario.poll(lambda: parked(scenario, gated), timeout=30, what="both gated runs parked")
        # Then a third run of the tenant is admitted meanwhile, and completes
        free = await scenario.create(workflow="gated", input_={"gated": False})
        await completed(scenario, [free], timeout=30)
        assert gate.calls() == []
        assert await scenario.scalar("SELECT state FROM tool_health WHERE far_side = 'gate'") != "CLOSED"
        # And when the far side is back, the parked runs are queued, admitted and complete, each
        # calling it once
        gate.repair()
        await completed(scenario, gated, timeout=60)
    assert len(gate.calls()) == len(set(gate.calls())) == 2
    assert await scenario.scalar("SELECT state FROM tool_health WHERE far_side = 'gate'") == "CLOSED"
    # Admitted again after the wake that ended their wait, not handed a worker by it
    assert await admitted_after_their_last_wake(scenario, gated) == []
    # And the tenant's runs never held more than its slots
    assert sampler.samples > 50
    assert sampler.most <= SLOTS, f"{sampler.most} runs held a slot at once; the tenant has {SLOTS}"
    await scenario.finish()


@pytest.mark.long
async def test_a_run_whose_kind_declares_an_unhealthy_far_side_parks_before_deciding_anything(
        scenario: Scenario, tmp_path: Path) -> None:
    # Given a far side that is down, its breaker opened by a run that called it
    gate = Gate(tmp_path)
    gate.break_down()
    await scenario.up(*SERVICES, forge=False, **gate.env())
    opener = await scenario.create(workflow="gated", input_={"gated": True})
    await scenario.poll(lambda: parked(scenario, [opener]), timeout=30, what="the first run parked")
    # When a run of a kind that declares that far side as its next call's is created
    declared = await scenario.create(workflow="gated_declared", input_={"gated": True})
    # Then it parks for the far side's health holding no slot, its kind never asked to decide
    await scenario.poll(lambda: parked(scenario, [declared]), timeout=30, what="the declared run parked")
    assert gate.decisions(declared) == 0
    assert gate.decisions(opener) >= 1
    # And once the far side is back both are queued again and complete, one effect each
    gate.repair()
    await completed(scenario, [opener, declared], timeout=60)
    assert gate.decisions(declared) >= 1
    assert len(gate.calls()) == 2
    assert await admitted_after_their_last_wake(scenario, [opener, declared]) == []
    await scenario.finish()


@pytest.mark.long
async def test_a_run_parked_on_an_open_breaker_past_its_business_deadline_ends_timed_out(
        scenario: Scenario, tmp_path: Path) -> None:
    # Given a far side that is down, and a run that calls it with a business deadline 15 s away (the
    # services start meanwhile)
    gate = Gate(tmp_path)
    gate.break_down()
    await scenario.up(*SERVICES, forge=False, **gate.env())
    deadline = datetime.now(UTC) + timedelta(seconds=15)
    envelope = make("run.create", {"workflow": "gated", "idempotency_key": f"late-{uuid.uuid4().hex[:8]}",
                                   "input": {"gated": True}, "deadline": deadline.isoformat()},
                    producer="tests", tenant_id=TENANT)
    await scenario.publish(topology.INGRESS_EXCHANGE, "run.create", envelope)
    run_id = await scenario.poll(lambda: scenario.scalar(
        "SELECT run_id FROM runs WHERE idempotency_key = :k", k=envelope.payload.idempotency_key),
        timeout=30, what="the run created")
    await scenario.poll(lambda: parked(scenario, [run_id]), timeout=30, what="the run parked")
    # When its deadline passes while it is parked, holding no slot
    # Then it ends TIMED_OUT, as any run past its deadline, the far side never reached
    done = await scenario.until(run_id, RunStatus.TIMED_OUT, RunStatus.COMPLETED, timeout=30)
    assert done.snapshot.status is RunStatus.TIMED_OUT, done.snapshot.terminal_reason
    assert gate.calls() == []
    await scenario.finish()
