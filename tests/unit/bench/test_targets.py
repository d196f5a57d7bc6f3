"""The bench's TARGETS block: each target met, missed, or "not measured" when its figure (or its limit)
is missing, never met by default; from small result dicts as ``python -m bench`` writes them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from bench import report

NAMES = ["DBOS's best mode", "3-step run", "terminal event", "bare loop", "timer", "between steps", "mid-call"]
"""A word of each target's name, in the block's order."""


def _met() -> dict[str, Any]:
    """A run in which every target is met, each with little to spare."""
    return {
        "started_at": "2026-12-06T00:00:00+00:00", "knobs": {"quick": False, "steps": 3, "inflight": 64, "runs": 1000},
        "limits": {"bare_loop": [{"processes": 1, "steps_per_s": 800.0, "cpu_ms_per_step": 1.0,
                                  "per_process": [{"steps_per_s": 800.0, "process_cpu_pct": 80.0}]}]},
        "bare_after": {"steps_per_s": 700.0, "cpu_ms_per_step": 1.1},
        "ensemble": {"workers": 2, "saturate": {"runs": 1000, "steps_per_s": 450.0, "steps_per_s_overall": 440.0,
                                                "runs_per_s": 150.0, "makespan_s": 6.8},
                     "lone": {"completed_ms": {"p50": 14.0, "p95": 18.0, "p99": 20.0}},
                     "bus": {"runs": 30, "terminal_event_ms": {"p50": 19.5, "p95": 24.0, "p99": 30.0},
                             "terminal_statuses": {"completed": 30}}},
        "dbos": {"measured": True, "direct": {"steps_per_s": 220.0}, "queue": {"steps_per_s": 90.0},
                 "lone_ms": {"p50": 17.8}},
        "timers": {"timers": 10_000, "lateness_s": {"p50": 0.1, "p95": 0.2, "p99": 0.24, "max": 0.3}},
        "recovery": {"partition_lease_ttl_s": 6.0,
                     "between_steps": {"next_step_after_kill_s": {"p50": 6.5, "max": 7.9}, "not_recovered": 0},
                     "mid_call": {"next_step_after_kill_s": {"p50": 7.0, "max": 8.0}, "not_recovered": 0}},
    }


def _verdicts(r: dict[str, Any]) -> list[bool | None]:
    return [t["met"] for t in report.targets(r, report.ratios(r))]


def _set(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(r: dict[str, Any]) -> None:
        for key in path[:-1]:
            r = r[key]
        r[path[-1]] = value
    return change


def _drop(*path: str) -> Callable[[dict[str, Any]], None]:
    def change(r: dict[str, Any]) -> None:
        for key in path[:-1]:
            r = r[key]
        del r[path[-1]]
    return change


def _without(*keys: str) -> Callable[[dict[str, Any]], None]:
    def change(r: dict[str, Any]) -> None:
        for key in keys:
            del r[key]
    return change


def test_the_block_is_the_issue_s_list_in_its_order_and_all_are_met_when_every_figure_is_in() -> None:
    r = _met()

    found = report.targets(r, report.ratios(r))

    assert [next(n for n in NAMES if n in t["target"]) for t in found] == NAMES
    assert [t["met"] for t in found] == [True] * 7
    assert [t["limit"] for t in found] == [2.0, 0.8, 20.0, 0.6, 250.0, 8.0, 8.0]
    assert found[0]["measured"] == 2.05  # 450 over DBOS started directly (220), its faster mode
    assert found[4]["measured"] == 240.0 and found[4]["unit"] == "ms"


MISSED = {
    # The faster mode counts: 5 x DBOS's queue, but only 1.8 x DBOS started directly.
    "DBOS's best mode": _set("dbos", "direct", "steps_per_s", value=250.0),
    "3-step run": _set("ensemble", "lone", "completed_ms", "p50", value=14.5),  # 0.81 x DBOS's 17.8
    "terminal event": _set("ensemble", "bus", "terminal_event_ms", "p50", value=20.1),
    "bare loop": _set("bare_after", "steps_per_s", value=760.0),  # 450 over the mean 780: 0.58
    "timer": _set("timers", "lateness_s", "p99", value=0.251),
    "between steps": _set("recovery", "between_steps", "next_step_after_kill_s", "max", value=8.01),
    "mid-call": _set("recovery", "mid_call", "not_recovered", value=1),  # the rest recovered in time
}


@pytest.mark.parametrize("target", MISSED)
def test_a_figure_past_its_limit_misses_that_target_alone(target: str) -> None:
    r = _met()
    MISSED[target](r)

    assert _verdicts(r) == [name != target for name in NAMES]


NOT_MEASURED = {
    "DBOS's best mode": _drop("dbos", "queue"),  # one mode alone is not DBOS's best
    "3-step run": _drop("dbos", "lone_ms"),
    "terminal event": _drop("ensemble", "bus"),
    "bare loop": _without("limits", "bare_after"),  # neither loop ran
    "timer": _without("timers"),
    "between steps": _drop("recovery", "between_steps"),
    "mid-call": _drop("recovery", "mid_call"),
}


@pytest.mark.parametrize("target", NOT_MEASURED)
def test_a_figure_that_was_not_measured_says_so_and_is_never_met(target: str) -> None:
    r = _met()
    NOT_MEASURED[target](r)

    assert _verdicts(r) == [None if name == target else True for name in NAMES]
    r["ratios"] = report.ratios(r)
    r["targets"] = report.targets(r, r["ratios"])
    line = next(ln for ln in report.table(r).splitlines() if target in ln and ln.strip().startswith("["))
    assert "not measured" in line and "MET" not in line


def test_without_the_partition_lease_ttl_neither_recovery_row_has_a_limit_to_meet() -> None:
    r = _met()
    del r["recovery"]["partition_lease_ttl_s"]

    assert _verdicts(r)[5:] == [None, None]


def test_fewer_timers_than_the_target_s_ten_thousand_do_not_count_however_punctual() -> None:
    r = _met()
    r["timers"]["timers"] = 2_000

    found = report.targets(r, report.ratios(r))

    assert found[4]["met"] is None and "(here 2,000)" in found[4]["target"]


def test_a_run_of_the_old_bench_without_any_new_figure_meets_nothing() -> None:
    r = {"started_at": "2026-12-04T00:00:00+00:00", "knobs": {"quick": True, "steps": 3, "inflight": 64, "runs": 200},
         "ensemble": {"saturate": {"steps_per_s": 368.0}, "lone": {"completed_ms": {"p50": 22.6}}},
         "recovery": {"measured": True, "run_lease_ttl_s": 5, "next_step_after_kill_s": {"max": 5.6},
                      "not_recovered": 0}}

    assert _verdicts(r) == [None] * 7


def test_the_table_shows_the_bus_latency_beside_the_lone_run() -> None:
    r = copy.deepcopy(_met())
    r["ratios"] = report.ratios(r)
    r["targets"] = report.targets(r, r["ratios"])

    table = report.table(r)

    row = next(ln for ln in table.splitlines() if "terminal event received on the bus" in ln)
    assert "p50 20 / p95 24 / p99 30 ms" in row and "30 runs; completed 30" in row
    assert "ensemble_over_dbos_best              2.05" in table
