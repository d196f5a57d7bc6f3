"""The circuit breaker's pure transitions: consecutive unavailable answers open it, one probe per
cool-down goes through, a success closes it and a failed probe opens it again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longrun.domain.breaker import (
    TOOL_HEALTHY_PREFIX,
    Admission,
    Breaker,
    BreakerSettings,
    BreakerState,
    admit,
    failed,
    health_wait,
    probe_due,
    reserve,
    succeeded,
)

SETTINGS = BreakerSettings(threshold=3, window=10.0, cool_down=5.0)


def opened_at(now: float) -> Breaker:
    b = Breaker("forge")
    for _ in range(SETTINGS.threshold):
        b = failed(b, now=now, settings=SETTINGS)
    return b


def test_threshold_unavailable_answers_within_the_window_open_it() -> None:
    b = Breaker("forge")
    b = failed(b, now=100.0, settings=SETTINGS)
    b = failed(b, now=101.0, settings=SETTINGS)
    assert (b.state, b.failures) == (BreakerState.CLOSED, 2)
    assert admit(b, caller="r1", now=101.5, settings=SETTINGS)[0] is Admission.CALL
    b = failed(b, now=102.0, settings=SETTINGS)
    assert (b.state, b.reopen_at) == (BreakerState.OPEN, 102.0 + SETTINGS.cool_down)


def test_failures_older_than_the_window_are_not_counted() -> None:
    b = failed(failed(Breaker("forge"), now=100.0, settings=SETTINGS), now=101.0, settings=SETTINGS)
    b = failed(b, now=100.0 + SETTINGS.window + 1, settings=SETTINGS)
    assert (b.state, b.failures, b.window_start) == (BreakerState.CLOSED, 1, 111.0)


def test_open_admits_nobody_until_the_cool_down_then_exactly_one_probe() -> None:
    b = opened_at(100.0)
    assert admit(b, caller="r1", now=104.9, settings=SETTINGS) == (Admission.WAIT, b)
    verdict, claimed = admit(b, caller="r1", now=105.0, settings=SETTINGS)
    assert verdict is Admission.PROBE
    assert (claimed.state, claimed.probe_by, claimed.probe_until) == (BreakerState.HALF_OPEN, "r1", 110.0)
    # Every other caller, and the prober asking again, waits while the probe is out
    assert admit(claimed, caller="r2", now=106.0, settings=SETTINGS)[0] is Admission.WAIT
    assert admit(claimed, caller="r1", now=106.0, settings=SETTINGS)[0] is Admission.WAIT


def test_a_probe_success_closes_it_and_a_probe_failure_opens_it_for_another_cool_down() -> None:
    _, claimed = admit(opened_at(100.0), caller="r1", now=105.0, settings=SETTINGS)
    assert succeeded(claimed) == Breaker("forge")
    assert succeeded(claimed).clean
    reopened = failed(claimed, now=106.0, settings=SETTINGS)
    assert (reopened.state, reopened.reopen_at, reopened.probe_by) == (BreakerState.OPEN, 111.0, None)


def test_a_failure_reported_while_open_changes_nothing() -> None:
    b = opened_at(100.0)
    assert failed(b, now=103.0, settings=SETTINGS) == b


def test_a_claimed_probe_that_never_reports_expires_after_a_cool_down() -> None:
    _, claimed = admit(opened_at(100.0), caller="r1", now=105.0, settings=SETTINGS)
    assert not probe_due(claimed, now=109.9)
    assert probe_due(claimed, now=110.0)
    verdict, again = admit(claimed, caller="r2", now=110.0, settings=SETTINGS)
    assert (verdict, again.probe_by) == (Admission.PROBE, "r2")


def test_a_reserved_probe_goes_to_its_run_only() -> None:
    b = opened_at(100.0)
    with pytest.raises(ValueError, match="no probe due"):
        reserve(b, run_id="r1", now=104.0, settings=SETTINGS)
    kept = reserve(b, run_id="r1", now=105.0, settings=SETTINGS)
    assert not probe_due(kept, now=106.0)
    assert admit(kept, caller="r2", now=106.0, settings=SETTINGS)[0] is Admission.WAIT
    assert admit(kept, caller="r1", now=106.0, settings=SETTINGS)[0] is Admission.PROBE


@given(st.lists(st.tuples(st.sampled_from(["ask", "fail", "reserve"]), st.floats(0, 3),
                          st.sampled_from(["r1", "r2", "r3"])), max_size=60))
def test_probes_are_at_least_one_cool_down_apart(steps: list[tuple[str, float, str]]) -> None:
    # Whatever the order of asks, failures and reservations, two probes granted while the far side
    # stays unhealthy (no success closes it) are a cool-down apart, and it never closes by itself.
    b, now, last_probe = opened_at(0.0), 0.0, None
    for op, dt, caller in steps:
        now += dt
        if op == "ask":
            verdict, b = admit(b, caller=caller, now=now, settings=SETTINGS)
            if verdict is Admission.PROBE:
                assert last_probe is None or now - last_probe >= SETTINGS.cool_down
                last_probe = now
        elif op == "fail":
            b = failed(b, now=now, settings=SETTINGS)
        elif op == "reserve" and probe_due(b, now=now):
            b = reserve(b, run_id=caller, now=now, settings=SETTINGS)
        assert b.state is not BreakerState.CLOSED


def test_the_health_wait_is_woken_by_its_key_or_its_own_timer() -> None:
    wait = health_wait(wait_id="w1", far_side="forge", logical_action="branch", now=100.0, max_wait=600.0)
    assert wait.correlation_key == f"{TOOL_HEALTHY_PREFIX}forge"
    assert (wait.kind, wait.wake_at, wait.deadline, wait.subject) == ("tool_healthy", 700.0, 700.0, "branch")


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="threshold 0 must be >= 1"):
        BreakerSettings(threshold=0, window=1, cool_down=1)
