"""Schedules in the memory world under simulated time (the kit): the timer service's due path fires each
schedule through admission, its overlap policy held by the schedule's concurrency key; a downtime past
the catch-up window is recorded as missed; pause, resume and backfill; a firing repeated (a timer
service killed before its commit) makes no second run for a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from longrun.app.timer.schedules import fire
from longrun.authoring import RunKind
from longrun.domain import RunStatus
from longrun.domain.schedules import Overlap
from longrun.testing.kit import Kit
from tests.integration.keyed_kinds import VERSIONS, Holds


def _kit() -> Kit:
    return Kit(RunKind("scan", VERSIONS, Holds(), {}))


def _run_for(kit: Kit, seconds: int) -> None:
    """``seconds`` pass a second at a time, the workers stepping whatever is woken meanwhile."""
    for _ in range(seconds):
        kit.advance(1)
        kit.settle(timers=False)


def _outcomes(kit: Kit, schedule_id: str) -> list[str]:
    return [f["outcome"] for (sid, _), f in sorted(kit.world.schedules.fires.items()) if sid == schedule_id]


def _runs(kit: Kit) -> list[str]:
    return sorted(kit.run_ids(), key=lambda r: kit.snapshot(r).created_at)


def test_skip_fires_when_the_run_before_ended_and_records_the_time_skipped_otherwise() -> None:
    # Given a schedule every 10 s whose runs last 15 s, overlap skip
    with _kit() as kit:
        schedule_id = kit.schedule({"hold": 15}, every=10, overlap=Overlap.SKIP)
        kit.world.fire_due_schedules()
        # When a minute passes
        _run_for(kit, 59)
        # Then every other due time made a run, the others were skipped naming the run that held the key
        assert _outcomes(kit, schedule_id) == ["created", "skipped"] * 3
        skipped = [f for f in kit.world.schedules.fires.values() if f["outcome"] == "skipped"]
        assert all(f["reason"].startswith("concurrency_key_held") and f"schedule:{schedule_id}" in f["reason"]
                   for f in skipped)
        runs = _runs(kit)
        assert len(runs) == 3 and [kit.status(r) for r in runs[:2]] == [RunStatus.COMPLETED] * 2
        assert kit.check(settled=False) == []


def test_buffer_one_queues_one_run_behind_the_open_one_and_skips_a_second() -> None:
    with _kit() as kit:
        schedule_id = kit.schedule({"hold": 25}, every=10, overlap=Overlap.BUFFER_ONE)
        kit.world.fire_due_schedules()
        _run_for(kit, 20)
        assert _outcomes(kit, schedule_id) == ["created", "created", "skipped"]
        first, second = _runs(kit)
        assert kit.status(first) is RunStatus.WAITING_EVENT and kit.status(second) is RunStatus.READY
        _run_for(kit, 8)  # the first ends at 25 s: the buffered one takes the key and runs
        assert kit.status(first) is RunStatus.COMPLETED and kit.status(second) is RunStatus.WAITING_EVENT


def test_cancel_previous_cancels_the_open_run_for_the_new_one() -> None:
    with _kit() as kit:
        schedule_id = kit.schedule({"hold": 100}, every=10, overlap=Overlap.CANCEL_PREVIOUS)
        kit.world.fire_due_schedules()
        _run_for(kit, 10)
        assert _outcomes(kit, schedule_id) == ["created", "created"]
        first, second = _runs(kit)
        assert kit.status(first) is RunStatus.CANCELLED and kit.status(second) is RunStatus.WAITING_EVENT


def test_due_times_older_than_the_catch_up_window_are_recorded_missed_and_the_rest_fire() -> None:
    # Given a schedule every 10 s with a catch-up window of 25 s, overlap allow, fired once
    with _kit() as kit:
        start = datetime.fromtimestamp(kit.world.clock(), UTC)
        schedule_id = kit.schedule({"hold": 1}, every=10, overlap=Overlap.ALLOW, catch_up=25)
        kit.world.fire_due_schedules()
        # When the timer service looks again only 100 s later
        kit.world.clock.advance(100)
        kit.world.fire_due_schedules()
        # Then 10 s to 70 s are one missed range, and 80 s, 90 s and 100 s each made a run
        fires = {due - start: f for (sid, due), f in kit.world.schedules.fires.items() if sid == schedule_id}
        at = [timedelta(seconds=s) for s in (0, 10, 80, 90, 100)]
        assert sorted(fires) == at
        assert fires[at[1]]["outcome"] == "missed" and fires[at[1]]["through"] - start == timedelta(seconds=70)
        assert [fires[t]["outcome"] for t in (at[0], *at[2:])] == ["created"] * 4
        assert len(kit.run_ids()) == 4


def test_pause_fires_nothing_and_resume_goes_on_from_the_next_due_time() -> None:
    with _kit() as kit:
        schedule_id = kit.schedule({"hold": 1}, every=10, overlap=Overlap.ALLOW)
        kit.world.fire_due_schedules()
        kit.world.schedules.pause(schedule_id)
        _run_for(kit, 35)
        assert _outcomes(kit, schedule_id) == ["created"]
        kit.world.schedules.resume(schedule_id)
        kit.world.fire_due_schedules()
        assert _outcomes(kit, schedule_id) == ["created"]  # 40 s is the next due time: none passed is fired
        _run_for(kit, 5)
        assert _outcomes(kit, schedule_id) == ["created", "created"]


def test_backfill_makes_the_runs_of_a_past_range_once() -> None:
    with _kit() as kit:
        now = datetime.fromtimestamp(kit.world.clock(), UTC)
        schedule_id = kit.schedule({"hold": 1}, every=10, overlap=Overlap.SKIP)
        first = kit.world.schedules.backfill(schedule_id, now - timedelta(seconds=100), now - timedelta(seconds=50))
        again = kit.world.schedules.backfill(schedule_id, now - timedelta(seconds=100), now - timedelta(seconds=50))
        assert (first.times, first.created, again.times, again.created) == (5, 5, 5, 0)
        assert len(kit.run_ids()) == 5  # no overlap key for a backfill: each time has its run


def test_a_firing_repeated_after_a_crash_makes_no_second_run_for_a_time() -> None:
    # Given a schedule fired once (overlap allow: only idempotency stands between a time and a second run)
    with _kit() as kit:
        schedule_id = kit.schedule({"hold": 1}, every=10, overlap=Overlap.ALLOW)
        before = kit.world.schedules.rows[schedule_id]
        kit.world.clock.advance(20)
        kit.world.fire_due_schedules()
        assert len(kit.run_ids()) == 3
        # When the same due times are fired again from the schedule as it was (its move never committed)
        now = datetime.fromtimestamp(kit.world.clock(), UTC)
        schedules = kit.world.schedules
        kit.world.in_transaction(lambda tx: fire(tx, schedules, before, now, schedules.admission,
                                                 clock=kit.world.clock))
        # Then each time keeps its one run
        assert len(kit.run_ids()) == 3 and _outcomes(kit, schedule_id) == ["created"] * 3
