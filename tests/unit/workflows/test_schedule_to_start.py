"""Schedule-to-start under the testing kit: the memory world queues and times a run as PostgreSQL does."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.domain import RunStatus, RunTimeouts
from longrun.testing.kit import Kit
from longrun.workflows import STEPS_VERSIONS, steps

KIND = RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO},
               timeouts=RunTimeouts(schedule_to_start=60.0))


def _queue_timers(kit: Kit, run_id: str) -> list[tuple[str, bool, bool]]:
    return [(t.timer_key, t.fired_at is not None, t.cancelled_at is not None)
            for t in kit.world.store.timers.values() if t.run_id == run_id and t.kind == "schedule_to_start"]


def test_a_run_no_worker_takes_in_time_ends_timed_out() -> None:
    with Kit(KIND) as kit:
        run_id = kit.start({"steps": 1}, timeouts={"schedule_to_start": 5})
        assert kit.snapshot(run_id).timeouts == RunTimeouts(schedule_to_start=5.0)
        # nobody delivers its wakeup; five seconds on, its queue timer ends it
        assert kit.advance(4) == 0 and kit.status(run_id) is RunStatus.READY
        assert kit.advance(2) == 1
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.TIMED_OUT and run.terminal_reason.startswith("schedule_to_start:")
        assert _queue_timers(kit, run_id) == [(f"{run_id}:schedule_to_start:1", True, False)]


def test_a_run_taken_in_time_has_its_queue_timer_cancelled_by_the_take() -> None:
    with Kit(KIND) as kit:
        run_id = kit.start({"steps": 2})  # the kind's default
        assert kit.snapshot(run_id).timeouts == RunTimeouts(schedule_to_start=60.0)
        # a worker's take ends the queue stint: its timer is cancelled while the run is still open
        assert kit.world.store.take_lease(run_id, "worker-1", 30) is not None
        assert kit.status(run_id) is RunStatus.READY
        assert _queue_timers(kit, run_id) == [(f"{run_id}:schedule_to_start:1", False, True)]


def test_a_run_settles_with_no_queue_timer_fired() -> None:
    with Kit(KIND) as kit:
        run_id = kit.start({"steps": 2})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED and kit.check() == []
        assert [fired for _, fired, _ in _queue_timers(kit, run_id)] == [False]
