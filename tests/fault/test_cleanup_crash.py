"""Row: a reconciler SIGKILLed mid-cleanup, after the far side released a finished run's workspace and
before its answer was recorded, leaves the cleanup to the next reconciler once its claim lapses: the
release (a non-idempotent write) is looked up by its key, found, and confirmed, never sent again; the
run stays COMPLETED and no alert is raised.

The run kind is ``tests/integration/cleanup_kinds.py`` (its release's start-to-close is 5 s, so a claim
holds 20 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longrun.domain import cleanup
from tests.integration.ensemble import SERVICES, Ensemble, status_of
from tests.integration.test_cleanup import STEP, _alerts, _cleaned, _cleanup_row, _cleanups_recorded, _keyed, _run

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(120)]

POINT = "reconciler.cleanup_after_call_before_record"


async def test_a_reconciler_killed_after_the_release_before_its_record_leaves_one_release(
        clean, engine, bus, services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Given the services, their reconciler armed to die right after the far side answered a release
    attempts, effects = tmp_path / "attempts.jsonl", tmp_path / "effects.jsonl"
    attempts.touch()
    effects.touch()
    env = {"LONGRUN_RUN_KINDS": "tests.integration.cleanup_kinds:kinds", "TIDY_ATTEMPTS": str(attempts),
           "TIDY_EFFECTS": str(effects), "LONGRUN_RECONCILE_INTERVAL": "0.3"}
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "worker", "relay", **env)
    doomed = ensemble.start("reconciler", SERVICES["reconciler"], LONGRUN_CRASH_POINTS=POINT, **env)
    # When a run completes and that reconciler releases its workspace, then dies before recording it
    run_id = await _run(engine, bus, {}, "COMPLETED")
    doomed.wait_dead(timeout=30)
    assert doomed.crashed_at(POINT)
    key = cleanup.key(run_id, STEP)
    assert len(_keyed(effects, key)) == 1
    row = await _cleanup_row(engine, run_id)
    assert (row.attempts, row.done_at) == (1, None)
    # Then the next reconciler takes the cleanup over once the claim lapsed, finds the release by its key
    ensemble.start("reconciler", SERVICES["reconciler"], **env)
    await _cleaned(engine, run_id)
    assert len(_keyed(attempts, key)) == 1 and len(_keyed(effects, key)) == 1
    assert await _cleanups_recorded(engine, run_id) == [(STEP, "done", 2)]
    assert await status_of(engine, run_id) == "COMPLETED" and await _alerts(engine, run_id) == []
