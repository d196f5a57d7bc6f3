"""A schedule's due times (``longrun.cadence``), what a look at it fires (``domain.schedules.plan_firing``)
and its overlap policy as a concurrency key (``overlap_key``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from longrun.cadence import BACKFILL_MOST, Cadence, backfill_times, cadence_problem, idempotency_key
from longrun.domain.concurrency import KeyPolicy
from longrun.domain.schedules import Missed, Overlap, OverlapKey, overlap_key, plan_firing

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_overlap_policy_is_a_key_of_limit_one_named_after_the_schedule() -> None:
    assert overlap_key("sched-1", Overlap.SKIP) == OverlapKey("schedule:sched-1", KeyPolicy.REFUSE, None)
    assert overlap_key("sched-1", Overlap.BUFFER_ONE) == OverlapKey("schedule:sched-1", KeyPolicy.QUEUE, 1)
    assert overlap_key("sched-1", Overlap.CANCEL_PREVIOUS) == \
        OverlapKey("schedule:sched-1", KeyPolicy.CANCEL_IN_PROGRESS, None)
    assert overlap_key("sched-1", Overlap.ALLOW) is None


def test_an_interval_is_due_at_its_anchor_plus_whole_intervals() -> None:
    every = Cadence(T0, every=2.0)
    assert (every.first(), every.after(s(0)), every.after(s(3)), every.after(s(-3))) == (s(0), s(2), s(4), s(-2))
    assert every.next_from(s(4)) == s(4) and every.next_from(s(4.5)) == s(6) and every.next_from(s(-9)) == s(0)
    half = Cadence(T0, every=0.5)
    assert half.after(s(1.2)) == s(1.5)


def test_a_cron_expression_is_matched_in_utc_after_its_anchor() -> None:
    nightly = Cadence(s(60), cron="0 3 * * *")
    assert nightly.first() == datetime(2026, 1, 1, 3, tzinfo=UTC)
    assert nightly.after(datetime(2026, 1, 1, 3, tzinfo=UTC)) == datetime(2026, 1, 2, 3, tzinfo=UTC)


def test_what_is_due_fires_oldest_first_at_most_per_round() -> None:
    every = Cadence(T0, every=10.0)
    fired = plan_firing(every, s(0), s(35), s(35 - 300), per_round=20)
    assert (fired.due, fired.missed, fired.next_due) == ((s(0), s(10), s(20), s(30)), None, s(40))
    capped = plan_firing(every, s(0), s(35), s(35 - 300), per_round=3)
    assert (capped.due, capped.next_due) == ((s(0), s(10), s(20)), s(30))
    assert plan_firing(every, s(40), s(35), s(-265), per_round=20).due == ()


@pytest.mark.parametrize("cadence", [Cadence(T0, every=60.0), Cadence(T0, cron="* * * * *")])
def test_due_times_older_than_the_window_are_one_missed_range(cadence: Cadence) -> None:
    # A week down: found without walking the ten thousand minutes missed
    now = s(7 * 86400 + 30)
    fired = plan_firing(cadence, s(0), now, now - timedelta(seconds=150), per_round=20)
    assert fired.missed == Missed(s(0), s(7 * 86400 - 180))
    assert fired.due == (s(7 * 86400 - 120), s(7 * 86400 - 60), s(7 * 86400)) and fired.next_due == s(7 * 86400 + 60)


def test_a_single_due_time_before_the_window_is_missed_alone() -> None:
    fired = plan_firing(Cadence(T0, every=10.0), s(0), s(12), s(5), per_round=20)
    assert (fired.missed, fired.due) == (Missed(s(0), s(0)), (s(10),))


def test_a_backfill_holds_the_due_times_of_its_range_and_no_more_than_the_most() -> None:
    assert backfill_times(Cadence(T0, every=2.0), s(-10), s(0)) == [s(t) for t in (-10, -8, -6, -4, -2)]
    assert len(backfill_times(Cadence(T0, every=2.0), s(-3600), s(0))) == 1800
    with pytest.raises(ValueError, match=f"at most {BACKFILL_MOST}"):
        backfill_times(Cadence(T0, every=0.5), s(-3600), s(0))
    with pytest.raises(ValueError, match="must be after its start"):
        backfill_times(Cadence(T0, every=2.0), s(0), s(0))


def test_the_idempotency_key_names_the_schedule_and_the_time() -> None:
    assert idempotency_key("sched-1", s(1.5)) == "schedule:sched-1:2026-01-01T00:00:01.500+00:00"


@pytest.mark.parametrize("cron, every, problem", [
    (None, None, "either a cron expression or an interval"), ("* * * * *", 5.0, "not both"),
    ("* * *", None, "five fields"), ("61 * * * *", None, "not valid"), (None, 0.1, "0.5 to"),
])
def test_a_cadence_that_is_not_one_is_named(cron: str | None, every: float | None, problem: str) -> None:
    assert problem in (cadence_problem(cron, every) or "")
    assert cadence_problem("*/5 * * * *", None) is None and cadence_problem(None, 0.5) is None
