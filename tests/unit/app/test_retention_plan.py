"""Retention's pure parts: its settings, the plan of a pass, the block walk and the archive's format."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from longrun.config import Settings
from longrun.db.retention import RULES
from longrun.errors import ConfigError
from longrun.services.reconciler.retention import Horizons, archive_lines, block_ranges, plan
from longrun.services.reconciler.sweeps import horizons

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_horizons_are_days_by_default_and_take_units() -> None:
    defaults = Settings.from_env({})
    assert defaults.retain_inbox == 30 * 86400 and defaults.quarantine_replay_window == 14 * 86400
    assert defaults.retain_audit == 365 * 86400 > defaults.retain_finished_runs
    short = Settings.from_env({"LONGRUN_RETAIN_OUTBOX": "90s", "LONGRUN_RETAIN_TIMERS": "15m",
                               "LONGRUN_RETAIN_AUDIT": "12h", "LONGRUN_RETAIN_FINISHED_RUNS": "2.5"})
    assert (short.retain_outbox, short.retain_timers, short.retain_audit, short.retain_finished_runs) == (
        90, 900, 43200, 2.5)


@pytest.mark.parametrize("raw", ["0", "-1d", "soon", "3w", "", "inf", "nan"])
def test_a_horizon_that_is_not_a_positive_duration_is_refused_naming_its_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"LONGRUN_RETAIN_OUTBOX": raw})
    assert dict(caught.value.problems) == {"LONGRUN_RETAIN_OUTBOX": (
        f"got {raw!r}; expected a duration: seconds, or a number with a unit s, m, h or d (e.g. 30d)")}


@pytest.mark.parametrize("inbox", ["14d", "7d"])
def test_the_inbox_must_outlive_the_quarantine_replay_window(inbox: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"LONGRUN_RETAIN_INBOX": inbox, "LONGRUN_QUARANTINE_REPLAY_WINDOW": "14d"})
    ((variable, why),) = caught.value.problems
    assert variable == "LONGRUN_RETAIN_INBOX"
    assert "expected more than LONGRUN_QUARANTINE_REPLAY_WINDOW (1209600 s)" in why
    assert Settings.from_env({"LONGRUN_RETAIN_INBOX": "15d", "LONGRUN_QUARANTINE_REPLAY_WINDOW": "14d"})


def test_the_plan_cuts_each_rule_at_its_own_horizon_from_the_database_time() -> None:
    settings = Settings.from_env({"LONGRUN_RETAIN_OUTBOX": "1h", "LONGRUN_RETAIN_INBOX": "2d",
                                  "LONGRUN_QUARANTINE_REPLAY_WINDOW": "1d", "LONGRUN_RETAIN_AUDIT": "365d",
                                  "LONGRUN_RETAIN_FINISHED_RUNS": "30d"})
    chosen = plan(horizons(settings), NOW)
    assert set(chosen.cutoffs) == set(RULES)
    assert chosen.cutoffs["outbox"] == NOW - timedelta(hours=1)
    assert {chosen.cutoffs[f"inbox_{s}"] for s in ("scheduler", "worker", "reconciler", "gateway")} == {
        NOW - timedelta(days=2)}
    assert chosen.cutoffs["audit_log"] == NOW - timedelta(days=365)
    assert chosen.archive_before == NOW - timedelta(days=30)


def test_a_plan_refuses_horizons_that_miss_or_invent_a_rule() -> None:
    rules = dict.fromkeys(RULES, 60.0)
    del rules["outbox"]
    with pytest.raises(ValueError, match="outbox"):
        plan(Horizons({**rules, "runs": 1.0}, 60.0), NOW)


def test_the_block_walk_covers_a_table_once_in_bounded_ranges() -> None:
    assert list(block_ranges(0)) == []
    assert list(block_ranges(5, span=2)) == [(0, 2), (2, 4), (4, 5)]
    assert list(block_ranges(4, span=2)) == [(0, 2), (2, 4)]


def test_an_archive_is_one_json_object_per_line_with_times_in_iso_8601() -> None:
    records = [{"record": "run", "run_id": "r1", "created_at": NOW},
               {"record": "event", "run_id": "r1", "seq": 1, "data": {"type": "run.created"}}]
    lines = archive_lines(records).decode().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"record": "run", "run_id": "r1", "created_at": "2026-12-04T12:00:00+00:00"},
        {"record": "event", "run_id": "r1", "seq": 1, "data": {"type": "run.created"}}]
