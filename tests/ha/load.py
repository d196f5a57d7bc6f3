"""The steady load of the replicated rows: dependency upgrades created as a producer creates them,
driven to their end as their users would (approving, and CI results sent again as providers do)."""

from __future__ import annotations

import asyncio
import uuid

from longrun.bus import topology
from longrun.domain import RunStatus
from longrun.envelope import make
from longrun.errors import BusUnavailable
from tests.fault.scenario import Scenario
from tests.integration.ensemble import goal

NOMINAL = {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
"""The forge's objects per completed dependency upgrade: one per intent."""


async def create(scenario: Scenario, *, patience: float = 30) -> str:
    """Publish run.create with confirms, as a producer does: a publish not confirmed (a broker
    failing over nacks for a moment) is sent again until it is. The idempotency key it finds its
    run by."""
    key = f"ha-{uuid.uuid4().hex[:10]}"
    envelope = make("run.create", {"workflow": "dependency_upgrade", "idempotency_key": key, "priority": 5,
                                   "input": goal(key[-8:])}, producer="ha-tests", tenant_id="acme")
    deadline = asyncio.get_running_loop().time() + patience
    while True:
        try:
            await scenario.publish(topology.INGRESS_EXCHANGE, "run.create", envelope)
            return key
        except BusUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def steady(scenario: Scenario, count: int, keys: list[str]) -> None:
    """``count`` creates, 0.3 s apart, their keys appended to ``keys``."""
    for _ in range(count):
        keys.append(await create(scenario))
        await asyncio.sleep(0.3)


async def all_completed(scenario: Scenario, keys: list[str], timeout: float) -> tuple[bool, dict[str, str]]:
    """Drive every run to its end (approving what asks, redelivering CI results) until ``timeout``;
    whether all completed, and each key's last status (``missing``: the create has no run)."""
    deadline = asyncio.get_running_loop().time() + timeout
    statuses: dict[str, str] = {}
    while asyncio.get_running_loop().time() < deadline:
        rows = await scenario.rows("SELECT idempotency_key, run_id, status FROM runs WHERE tenant_id = 'acme'")
        found = {r.idempotency_key: (r.run_id, r.status) for r in rows}
        statuses = {k: found[k][1] if k in found else "missing" for k in keys}
        if all(s == RunStatus.COMPLETED.value for s in statuses.values()):
            return True, statuses
        for key, (run_id, status) in found.items():
            if key not in keys:
                continue
            if status == RunStatus.WAITING_USER.value:
                await scenario.approve(run_id)
            if status == RunStatus.WAITING_EVENT.value:
                # A CI result the gateway could not take during the outage is sent again, as providers do.
                await scenario.redeliver_ci_result(await scenario.stored(run_id))
        await asyncio.sleep(0.3)
    return False, statuses
