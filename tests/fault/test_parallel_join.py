"""Row: a worker is SIGKILLed while a run's fan-out of 20 writes is in flight, and a fresh worker takes over.

The run (``join_kinds``' ``fanned``) makes 20 idempotent writes at once and joins all of them. Its far
side is a file that counts effects per idempotency key and checks fencing: each request is held in
flight for two seconds, and one whose fencing token is below one already seen for its key is refused.
The worker is killed once at least five are in flight (the far side's log says so); its lease expires,
the run is re-woken, and the new lease holder sends every write still submitted again, under its key
and a newer token.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.integration.join_kinds import far_side_log

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(120)]

CALLS, IN_FLIGHT = 20, 5
SERVICES = ("scheduler", "relay", "reconciler")


def in_flight(log: list[dict[str, object]], before: float) -> set[object]:
    """The keys whose request the far side had started and not ended before ``before``."""
    started = {line["key"] for line in log if line["edge"] == "start" and float(line["at"]) < before}  # type: ignore[arg-type]
    ended = {line["key"] for line in log if line["edge"] == "end" and float(line["at"]) < before}  # type: ignore[arg-type]
    return started - ended


async def test_a_worker_killed_with_a_fan_out_in_flight_leaves_one_effect_per_call_and_the_run_completes(
        scenario: Scenario, tmp_path: Path) -> None:
    # Given the fanned kind, its far side holding each write two seconds, and one worker
    far = tmp_path / "far-side.jsonl"
    far.touch()
    env = {"LONGRUN_RUN_KINDS": "tests.integration.join_kinds:kinds", "JOIN_FAR_SIDE": str(far),
           "JOIN_HOLD_SECONDS": "2"}
    await scenario.up(*SERVICES, forge=False, **env)
    doomed = scenario.start("worker", **env)
    run_id = await scenario.create(workflow="fanned", input_={"calls": CALLS},
                                   budget={"model_calls": 1, "tool_calls": 3 * CALLS, "cost_usd": 1.0})

    async def enough_in_flight() -> bool:
        return len(in_flight(far_side_log(far), time.time())) >= IN_FLIGHT

    await scenario.poll(enough_in_flight, timeout=30, interval=0.02, what=f"{IN_FLIGHT} writes in flight")
    # When the worker is SIGKILLed with them in flight, and a fresh one is started
    killed_at = time.time()
    doomed.kill()
    cut_off = in_flight(far_side_log(far), killed_at)
    assert len(cut_off) >= IN_FLIGHT
    scenario.start("worker", **env)
    # Then the run completes: every write has one ledger row, confirmed, and exactly one effect at the far side
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=60)
    ledger = await scenario.ledger(run_id)
    assert sorted(ledger) == sorted(f"put:{i}" for i in range(CALLS))
    assert {row.status for row in ledger.values()} == {"CONFIRMED"}
    log = far_side_log(far)
    effects = Counter(line["key"] for line in log if line["edge"] == "effect")
    assert set(effects) == {row.idempotency_key for row in ledger.values()} and set(effects.values()) == {1}
    # the far side never saw a stale fencing token, and the writes cut off were made by the new lease holder
    assert [line for line in log if line["edge"] == "fenced"] == []
    tokens = {line["key"]: line["token"] for line in log if line["edge"] == "effect"}
    first = {line["key"]: line["token"] for line in reversed(log) if line["edge"] == "start"}
    assert all(tokens[key] > first[key] for key in cut_off)
    assert {ledger[name].attempts for name in ledger if ledger[name].idempotency_key in cut_off} == {2}
    assert done.snapshot.fact("joined:writes") is not None
    assert [e["type"] for e in await scenario.events(run_id)].count("run.joined") == 1
    await scenario.finish()
