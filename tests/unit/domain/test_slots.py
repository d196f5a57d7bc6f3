"""Which waits hold a slot (``domain.slots``): a move into a new wait on a far side's health, a rate
limit, the tenant's budget or a tool group's permit gives the slot back; every other wait keeps it; a run woken from a
slotless wait is queued again; a plan of such a move is no longer admitted."""

from __future__ import annotations

import pytest

from longrun.domain import RunStatus, Wait, WakeReason
from longrun.domain import events as ev
from longrun.domain.breaker import Breaker, BreakerState, health_wait, holds_back
from longrun.domain.slots import SLOTLESS_WAITS, gives_slot_back, queued
from longrun.ports.runs import StoredRun, plan
from tests.unit.domain.support import History


def _running() -> History:
    history = History()
    history.apply(ev.RunStatusChanged, to=RunStatus.RUNNING, reason="taken")
    return history


def _parked_on(kind: str, history: History) -> Wait:
    return Wait(f"w-{kind}-{len(history.events)}", kind, history.now + 60, correlation_key=f"{kind}:x",
                wake_at=history.now + 60)


@pytest.mark.parametrize("kind", sorted(SLOTLESS_WAITS))
def test_a_new_wait_that_holds_no_slot_gives_it_back_once(kind: str) -> None:
    history = _running()
    before = history.snapshot
    wait = _parked_on(kind, history)
    after = history.apply(ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)
    assert gives_slot_back(before, after)
    # a later write to the run parked in the same wait gives nothing back again
    later = history.apply(ev.FactRecorded, key="note", value="x", source="test")
    assert not gives_slot_back(after, later)


@pytest.mark.parametrize("kind", ["ci", "timer", "retry", "approval"])
def test_every_other_wait_keeps_its_slot(kind: str) -> None:
    history = _running()
    before = history.snapshot
    after = history.apply(ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=_parked_on(kind, history))
    assert not gives_slot_back(before, after)


def test_a_run_woken_from_a_slotless_wait_is_queued_and_a_plan_of_the_park_is_not_admitted() -> None:
    history = _running()
    stored = StoredRun(history.snapshot, len(history.events), 0, "w-1", None, 1, admitted=True)
    wait = health_wait(wait_id="h-1", far_side="forge", logical_action=None, now=history.now, max_wait=60)
    parked = plan(stored, [ev.WaitStarted(seq=stored.seq(1), at=history.now + 1, status=RunStatus.RETRY_SCHEDULED,
                                          wait=wait)], release_lease=True)
    assert parked.gives_slot_back and not parked.after.admitted
    woken = plan(parked.after, [ev.RunWoken(seq=parked.after.seq(1), at=history.now + 2, wait_id="h-1",
                                            reason=WakeReason.EVENT, correlation_key=wait.correlation_key)])
    assert not woken.gives_slot_back
    assert queued(woken.after.snapshot.status, woken.after.admitted)
    assert not queued(RunStatus.READY, True) and not queued(RunStatus.CANCELLING, False)


def test_a_breaker_holds_a_run_back_until_a_probe_is_due_or_reserved_for_it() -> None:
    opened = Breaker("forge", BreakerState.OPEN, failures=1, reopen_at=100.0)
    assert not holds_back(Breaker("forge"), caller="r1", now=50.0)
    assert holds_back(opened, caller="r1", now=50.0)
    assert not holds_back(opened, caller="r1", now=100.0)  # the probe is due: the call claims it
    reserved = Breaker("forge", BreakerState.OPEN, failures=1, reopen_at=100.0, probe_by="r2", probe_until=130.0)
    assert holds_back(reserved, caller="r1", now=110.0)
    assert not holds_back(reserved, caller="r2", now=110.0)
