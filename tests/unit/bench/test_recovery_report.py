"""The bench's recovery rows in its targets: each row's slowest run against the membership TTL + 2 s."""

from __future__ import annotations

from typing import Any

from bench.report import recovery_targets


def _recovery(between: float, mid_call: float, *, not_recovered: int = 0) -> dict[str, Any]:
    return {"recovery": {"measured": True, "run_lease_ttl_s": 30.0, "partition_lease_ttl_s": 6.0,
                         "between_steps": {"not_recovered": 0, "next_step_after_kill_s": {"max": between}},
                         "mid_call": {"not_recovered": not_recovered, "next_step_after_kill_s": {"max": mid_call}}}}


def test_each_recovery_row_is_a_target_of_the_membership_ttl_plus_two_seconds() -> None:
    between, mid_call = recovery_targets(_recovery(6.1, 8.4))
    assert "between steps" in between["target"] and "mid-call" in mid_call["target"]
    assert (between["measured"], between["limit"], between["met"]) == (6.1, 8.0, True)
    assert (mid_call["measured"], mid_call["limit"], mid_call["met"]) == (8.4, 8.0, False)


def test_a_run_never_recovered_fails_its_row_and_a_row_not_measured_is_not_met() -> None:
    _, mid_call = recovery_targets(_recovery(6.1, 7.0, not_recovered=1))
    assert (mid_call["measured"], mid_call["met"]) == (float("inf"), False)
    assert [t["met"] for t in recovery_targets({})] == [None, None]
