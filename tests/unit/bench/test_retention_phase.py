"""The bench's retention phase: one side at the declared defaults whatever ``BENCH_RETENTION`` says, one
pruning with a short horizon; both as the services would read them, and a side that lost anything says so."""

from __future__ import annotations

from typing import Any

from bench import report
from bench.infra import pruning_env
from bench.pruning import SHORT_HORIZON_S, default_retention, losses
from longrun.config import Settings


def test_the_default_side_sets_every_variable_the_short_side_does_at_its_declared_default() -> None:
    default, short = default_retention(), pruning_env(f"{SHORT_HORIZON_S:g}")

    assert set(default) == set(short)
    settings = Settings.from_env(default)
    assert settings.retention_interval == 600 and settings.retain_outbox == 7 * 86_400
    assert settings.retain_inbox == 30 * 86_400 and settings.retain_finished_runs == 30 * 86_400


def test_the_short_side_prunes_every_second_with_second_long_horizons_and_the_services_accept_it() -> None:
    settings = Settings.from_env(pruning_env(f"{SHORT_HORIZON_S:g}"))

    assert settings.retention_interval == SHORT_HORIZON_S
    assert settings.retain_outbox == settings.retain_inbox == settings.retain_timers == SHORT_HORIZON_S
    # finished runs outlive the measurement that reads their events
    assert settings.retain_finished_runs >= 60


def _side(completed: int, steps: int, unsent: int) -> dict[str, Any]:
    return {"completed_ms": {"p50": 30.0, "n": completed}, "steps": steps, "outbox_rows_unsent": unsent}


def test_a_side_that_lost_a_run_a_step_or_a_message_says_which() -> None:
    assert losses(_side(200, 600, 0), runs=200, steps=3) == {
        "runs_not_completed": 0, "steps_not_recorded": 0, "outbox_rows_unsent": 0}
    assert losses(_side(199, 597, 2), runs=200, steps=3) == {
        "runs_not_completed": 1, "steps_not_recorded": 3, "outbox_rows_unsent": 2}


def _phase(short_steps_per_s: float, *, no_loss: bool) -> dict[str, Any]:
    lost = {"runs_not_completed": 0, "steps_not_recorded": 0, "outbox_rows_unsent": 0 if no_loss else 4}
    return {"short_horizon_s": 1.0, "runs": 200, "steps_per_run": 3, "no_loss": no_loss,
            "default": {"steps_per_s": 400.0, "lost": dict.fromkeys(lost, 0), "pruned": {}},
            "short_horizon": {"steps_per_s": short_steps_per_s, "lost": lost,
                              "pruned": {"outbox": 1_800, "inbox_worker": 600}}}


def test_the_table_and_the_ratios_show_both_sides_their_ratio_and_any_loss() -> None:
    r: dict[str, Any] = {"started_at": "2026-12-06T00:00:00+00:00",
                         "knobs": {"quick": True, "steps": 3, "inflight": 64, "runs": 200},
                         "retention": _phase(380.0, no_loss=True)}
    r["ratios"] = report.ratios(r)
    r["targets"] = report.targets(r, r["ratios"])

    assert r["ratios"]["retention_short_horizon_over_default"] == 0.95
    table = report.table(r)
    assert "default horizons      400 steps/s" in table
    assert "1 s horizons          380 steps/s" in table and "pruned during it: outbox 1,800, inbox_worker 600" in table
    assert "short / default steps/s: 0.95; no loss" in table

    r["retention"] = _phase(380.0, no_loss=False)
    assert "outbox rows unsent 4" in report.table(r) and "!! LOSS" in report.table(r)
