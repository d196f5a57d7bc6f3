"""The checker every fault row and chaos run ends with names any message the runtime sent without its
cause, and passes one that names it."""

from __future__ import annotations

import pytest

from longrun.envelope import make
from longrun.testing.invariants import check
from tests.integration.bus_helpers import enqueue

pytestmark = pytest.mark.integration


async def test_a_message_the_runtime_sent_without_its_cause_is_a_violation(clean, engine) -> None:
    # Given a wakeup that names its cause and one that does not
    async with engine.begin() as conn:
        await enqueue(conn, make("run.wakeup", {"wakeup_id": "w-1", "reason": "probe"}, producer="tests",
                                 tenant_id="tenant-a", run_id="run-1", causation_id="operator:alice"))
        await enqueue(conn, make("run.wakeup", {"wakeup_id": "w-2", "reason": "probe"}, producer="tests",
                                 tenant_id="tenant-a", run_id="run-2"))
    # Then the checker names the one without a cause, and only it
    causeless = [v for v in (await check(engine, settled=True)).violations if "name no cause" in v]
    assert len(causeless) == 1 and causeless[0].startswith("1 run.wakeup message(s)"), causeless
