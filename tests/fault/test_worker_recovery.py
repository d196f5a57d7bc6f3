"""Rows: a worker dies (SIGKILL), freezes (SIGSTOP), is stopped (SIGTERM) or dies and is started again
under its own name in the middle of a call, with the default leases.

Every service runs with the default lease settings: run leases of ``LONGRUN_RUN_LEASE_TTL`` (30 s),
memberships and partition leases of ``LONGRUN_PARTITION_LEASE_TTL`` (6 s), reconciler sweeps every
``LONGRUN_RECONCILE_INTERVAL`` (1 s), and workers stop within ``LONGRUN_WORKER_STOP_GRACE`` (30 s).
The run kind is ``tests.kinds:held_call``: a call (a write of a branch on the forge, or a pure call)
that holds once, then a next step that writes a second branch. Two workers are up (one, for the
restart row); the one holding the run is killed, frozen or stopped while its call holds. Its
membership lapses and the other worker takes the run over at once (the restarted one takes it back),
long before the run lease would have expired. A worker stopped (SIGTERM) finishes its call within its
stop grace and hands the run on; one whose call outlasts the grace ends it and leaves, and its run is
taken over. The forge counts effects and refuses a write whose fencing token is older than one it saw
for the same key.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from longrun.config import Settings
from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.harness import Process

pytestmark = [pytest.mark.fault, pytest.mark.integration]

DEFAULTS = Settings.from_env({})
LEASES = {"LONGRUN_RUN_LEASE_TTL": f"{DEFAULTS.run_lease_ttl:g}",
          "LONGRUN_PARTITION_LEASE_TTL": f"{DEFAULTS.partition_lease_ttl:g}",
          "LONGRUN_RECONCILE_INTERVAL": f"{DEFAULTS.reconcile_interval:g}",
          "LONGRUN_WORKER_STOP_GRACE": f"{DEFAULTS.worker_stop_grace:g}"}
KINDS = {"LONGRUN_RUN_KINDS": "tests.kinds:held_call"}
AROUND = ("scheduler", "relay", "timer", "reconciler")
WITHIN = DEFAULTS.partition_lease_ttl + 2
"""From the kill to the next step committed: the membership TTL, then the survivor's look (every second)."""
LOOKUP = DEFAULTS.reconcile_interval + 1
"""What a write in doubt adds: the reconciler's round that looks it up, and the run's wakeup after it."""
AFTER_STOP = 3.0
"""From the end of a stopping worker's grace or call to the next step committed: it ends or records
its call and hands the run on or lapses its membership as it leaves, then the survivor's look (every
second). Well under the membership TTL."""
HOLD = DEFAULTS.partition_lease_ttl + 2
"""How long the call of the row that is let finish holds: past the membership TTL (the stopping worker
must keep its membership renewed meanwhile), well within the stop grace."""
GRACE = 1.0
"""The stop grace of the row whose call outlasts it."""


def _goal(effect: str, hold_file: Path, *, hold: float, acts_first: bool = True) -> dict[str, Any]:
    return {"repo": "acme/payments", "branch": f"held-{uuid.uuid4().hex[:8]}", "effect": effect,
            "hold_file": str(hold_file), "hold": hold, "acts_first": acts_first}


async def _two_workers(scenario: Scenario, **env: str) -> list[Process]:
    """The services around, and two workers that are both members and split the partitions."""
    await scenario.up(*AROUND, **KINDS, **LEASES)
    workers = [scenario.start("worker", **KINDS, **{**LEASES, **env}) for _ in range(2)]

    async def split() -> bool:
        return await scenario.scalar(
            "SELECT count(DISTINCT owner) FROM partition_leases WHERE service = 'worker' AND lease_until > now()") == 2

    await scenario.poll(split, timeout=30, what="two workers sharing the partitions")
    return workers


async def _holding(scenario: Scenario, run_id: str, hold_file: Path, workers: list[Process]) -> Process:
    """The worker whose call of the run holds now."""
    await scenario.poll(lambda: _gone(hold_file), timeout=30, what="the call holding")
    owner = (await scenario.stored(run_id)).lease_owner
    return next(w for w in workers if w.name == owner)


async def _held_on_one_of_two(scenario: Scenario, effect: str, *, hold: float = 60,
                              **env: str) -> tuple[str, Process, Process, int]:
    """Two workers (with ``env``) and a run whose call (``effect``) holds on one of them for ``hold``
    seconds: the run, the worker holding it, the other, and the run's fencing token."""
    workers = await _two_workers(scenario, **env)
    hold_file = scenario.tmp / f"hold-{uuid.uuid4().hex[:6]}"
    hold_file.touch()
    run_id = await scenario.create(workflow="held_call", input_=_goal(effect, hold_file, hold=hold))
    holder = await _holding(scenario, run_id, hold_file, workers)
    other = next(w for w in workers if w is not holder)
    return run_id, holder, other, (await scenario.stored(run_id)).fencing_token


async def _gone(path: Path) -> bool:
    return not path.exists()


async def _now(scenario: Scenario) -> float:
    return float(await scenario.scalar("SELECT extract(epoch FROM clock_timestamp())"))


async def _recorded(scenario: Scenario, run_id: str, logical_action: str, event: str) -> float:
    """When (database time) the run recorded ``event`` of ``logical_action``, the last time it did."""
    return float(await scenario.scalar(
        "SELECT extract(epoch FROM max(recorded_at)) FROM run_events WHERE run_id = :r AND type = :t "
        "AND data ->> 'logical_action' = :a", r=run_id, t=event, a=logical_action))


def _said(proc: Process, text: str) -> bool:
    return text in proc.output()


@pytest.mark.parametrize("effect", ["write", "pure"])
async def test_a_worker_killed_mid_call_has_its_run_taken_over_once_its_membership_lapsed(
        scenario: Scenario, effect: str) -> None:
    # Given two workers and a run whose call holds on one of them; a write holds after it acted
    # (the branch exists, its answer is not recorded), a pure call is recorded only with its answer
    run_id, doomed, survivor, token = await _held_on_one_of_two(scenario, effect)
    # When that worker is SIGKILLed
    killed_at = await _now(scenario)
    doomed.kill()
    # Then the other worker takes the run over once the dead one's membership lapsed, long before the
    # run lease would expire: the call is settled and the next step committed within the membership
    # TTL + 2 s, plus the reconciler's lookup for the write (its outcome was in doubt)
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=4 * WITHIN)
    recovered_in = await _recorded(scenario, run_id, "next", "action.confirmed") - killed_at
    assert recovered_in <= WITHIN + (LOOKUP if effect == "write" else 0), recovered_in
    assert _said(survivor, f"taken over from {doomed.name}, whose membership lapsed")
    assert await scenario.wakeups(run_id, "lease expired") == 0 and await scenario.recoveries(run_id) == 1
    call = await scenario.trail(run_id, "call")
    if effect == "write":
        # the write found SUBMITTED, never sent again: the reconciler found the branch under its key
        assert call == ["action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started",
                        "action.reconciled"], call
        assert (await scenario.ledger(run_id))["call"].attempts == 1
    else:
        # the pure call, of which nothing was on record, simply made again
        assert call == ["action.recorded"], call
    # by the newer lease, with one effect per key at the forge (the call's branch, if a write, and the next's)
    settling = [e for e in await scenario.events(run_id) if e["data"].get("logical_action") == "call"][-1]
    assert settling["token"] is None or settling["token"] > token
    assert done.fencing_token > token
    assert (await scenario.forge_counts())["branch"] == (2 if effect == "write" else 1)
    await scenario.finish()


@pytest.mark.parametrize("effect", ["write", "pure"])
async def test_a_worker_stopped_mid_call_finishes_it_and_hands_its_run_on(scenario: Scenario, effect: str) -> None:
    # Given two workers and a run whose call holds on one of them past the membership TTL, but within
    # the stop grace (the default); a write holds after it acted
    run_id, stopped, survivor, token = await _held_on_one_of_two(scenario, effect, hold=HOLD)
    # When that worker is stopped as a rolling deploy stops it (SIGTERM)
    stopped_at = await _now(scenario)
    stopped.terminate(timeout=DEFAULTS.worker_stop_grace)
    # Then it finishes the call and records its answer under its own lease before it exits, and hands
    # the run on: the other worker adopts it and takes the next step at once
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=4 * WITHIN)
    assert stopped.popen.returncode == 0, stopped.output()[-2000:]
    call = await scenario.trail(run_id, "call")
    assert call == (["action.prepared", "action.submitted", "action.confirmed"] if effect == "write"
                    else ["action.recorded"]), call
    settling = [e for e in await scenario.events(run_id) if e["data"].get("logical_action") == "call"][-1]
    assert settling["token"] in (None, token), settling
    assert _said(stopped, f"run {run_id}: handed on as this worker stops")
    assert _said(survivor, f"run {run_id}: taken over (held_call@1)")
    next_in = await _recorded(scenario, run_id, "next", "action.confirmed") - stopped_at
    assert next_in <= HOLD + AFTER_STOP, next_in
    assert await scenario.recoveries(run_id) == 0
    # with one effect per key at the forge, the call's made once
    assert (await scenario.forge_counts())["branch"] == (2 if effect == "write" else 1)
    if effect == "write":
        assert (await scenario.ledger(run_id))["call"].attempts == 1
    await scenario.finish()


@pytest.mark.parametrize("effect", ["write", "pure"])
async def test_a_worker_stopped_mid_call_past_its_grace_lets_its_run_be_taken_over_as_it_leaves(
        scenario: Scenario, effect: str) -> None:
    # Given two workers that give the rounds in hand one second as they stop, and a run whose call
    # holds on one of them for a minute; a write holds after it acted
    run_id, stopped, survivor, token = await _held_on_one_of_two(scenario, effect,
                                                                 LONGRUN_WORKER_STOP_GRACE=f"{GRACE:g}")
    # When that worker is stopped (SIGTERM)
    stopped_at = await _now(scenario)
    stopped.terminate()
    # Then it ends its call once the grace is out and leaves, and the other worker takes the run over
    # at once: neither the run lease nor the membership TTL is waited out
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=4 * WITHIN)
    recovered_in = await _recorded(scenario, run_id, "next", "action.confirmed") - stopped_at
    assert recovered_in <= GRACE + AFTER_STOP + (LOOKUP if effect == "write" else 0), recovered_in
    assert stopped.popen.returncode == 0, stopped.output()[-2000:]
    assert _said(survivor, f"taken over from {stopped.name}, whose membership lapsed")
    assert await scenario.wakeups(run_id, "lease expired") == 0 and await scenario.recoveries(run_id) == 1
    # with one effect per key at the forge: the write's branch was found under its key, not made again
    assert (await scenario.forge_counts())["branch"] == (2 if effect == "write" else 1)
    if effect == "write":
        assert (await scenario.ledger(run_id))["call"].attempts == 1
    assert (await scenario.stored(run_id)).fencing_token > token
    await scenario.finish()


async def test_a_worker_restarted_under_its_own_name_takes_back_the_run_its_killed_process_held(
        scenario: Scenario) -> None:
    # Given one worker, named as a container restarted in place names it again, and a run whose
    # pure call holds on it
    await scenario.up(*AROUND, **KINDS, **LEASES)
    name = "worker-in-place"
    first = scenario.start("worker", **KINDS, **LEASES, LONGRUN_INSTANCE_ID=name)
    hold_file = scenario.tmp / f"hold-{uuid.uuid4().hex[:6]}"
    hold_file.touch()
    run_id = await scenario.create(workflow="held_call", input_=_goal("pure", hold_file, hold=60))
    await scenario.poll(lambda: _gone(hold_file), timeout=30, what="the call holding")
    assert (await scenario.stored(run_id)).lease_owner == name
    # When it is SIGKILLed and started again at once under the same name, which renews the same
    # membership row before it can lapse
    killed_at = await _now(scenario)
    first.kill()
    again = scenario.start("worker", **KINDS, **LEASES, LONGRUN_INSTANCE_ID=name)
    # Then the new process takes the run back as soon as it looks, not once the run lease expires
    await scenario.until(run_id, RunStatus.COMPLETED, timeout=4 * WITHIN)
    recovered_in = await _recorded(scenario, run_id, "next", "action.confirmed") - killed_at
    assert recovered_in <= WITHIN, recovered_in
    assert _said(again, "taken over from an earlier process of this name")
    assert await scenario.wakeups(run_id, "lease expired") == 0 and await scenario.recoveries(run_id) == 1
    assert (await scenario.forge_counts())["branch"] == 1
    await scenario.finish()


async def test_a_worker_frozen_mid_write_past_its_membership_is_fenced_when_it_resumes(scenario: Scenario) -> None:
    # Given two workers and a run whose write holds on one of them before it acts. The run is taken
    # over directly, but the wakeup after its write was looked up goes to its partition, which may be
    # the frozen worker's: the broker hands it on once it drops that worker's connection, after two
    # missed AMQP heartbeats (a short heartbeat keeps the row short; no lease setting changes)
    workers = await _two_workers(scenario, LONGRUN_AMQP_HEARTBEAT="2")
    hold_file = scenario.tmp / f"hold-{uuid.uuid4().hex[:6]}"
    hold_file.touch()
    run_id = await scenario.create(workflow="held_call", input_=_goal("write", hold_file, hold=3, acts_first=False))
    frozen = await _holding(scenario, run_id, hold_file, workers)
    token = (await scenario.stored(run_id)).fencing_token
    # When that worker is frozen (SIGSTOP) past its membership TTL
    frozen.pause()
    try:
        # Then the other worker takes the run over: the reconciler finds nothing made under the write's
        # key, the write is made under a newer lease, and the run completes
        done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=4 * WITHIN)
    finally:
        frozen.resume()
    call = await scenario.trail(run_id, "call")
    assert call == ["action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started",
                    "action.reconciled", "action.submitted", "action.confirmed"], call
    assert await scenario.wakeups(run_id, "lease expired") == 0
    assert (await scenario.forge_counts())["branch"] == 2
    # And when the frozen worker resumes, its write goes out under its old token: the forge refuses
    # it, and its record is refused too; nothing more happens, at the forge or in the run
    events = await scenario.events(run_id)
    await scenario.poll(lambda: _fenced(frozen, token), timeout=20, what="the resumed worker fenced out")
    assert _said(frozen, 'branches \\"HTTP/1.1 409 Conflict')
    assert await scenario.events(run_id) == events
    assert (await scenario.forge_counts())["branch"] == 2
    assert done.fencing_token > token
    await scenario.finish()


async def _fenced(proc: Process, token: int) -> bool:
    return _said(proc, f"lease {token} lost")
