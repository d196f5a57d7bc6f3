"""Child runs in the pure domain: a child is the fact ``child:<name>``; the budget it draws is charged to
its parent and what it did not spend given back when it ends; a wait for children ends when enough of
them ended (all, any, a count), and a child's end after the parent ended is late. ``fold`` rebuilds
the same snapshot."""

from __future__ import annotations

import pytest

from longrun.domain import (
    ChildEnded,
    ChildStarted,
    RunStatus,
    RunStatusChanged,
    StartChildren,
    Usage,
    WaitForChildren,
    WaitStarted,
    children,
    fold,
    freeze,
)
from longrun.domain.decisions import Child
from longrun.errors import EventRejected

from .support import History

S = RunStatus


def parent_of(*names: str, drawn: Usage = Usage(2, 2, 10.0)) -> History:
    h = History(budget=Usage(10, 10, 100.0))
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    for name in names:
        h.apply(ChildStarted, name=name, child_run_id=f"run-{name}", kind="leaf", budget=drawn)
    return h


def waiting(h: History, names: tuple[str, ...], until: str | int) -> None:
    status, wait = children.children_wait("w-1", names, children.needed(names, until), h.now + 100)
    h.apply(WaitStarted, status=status, wait=wait)


def test_a_child_draws_from_the_parent_and_gives_back_what_it_did_not_spend() -> None:
    h = parent_of("a", "b")
    assert h.snapshot.budget.used == Usage(4, 4, 20.0)
    assert children.draw(h.snapshot.budget, Usage(50, 1, 1.0)) == Usage(6, 1, 1.0)  # the least of asked and left
    assert children.draw(h.snapshot.budget, None) == Usage(6, 6, 80.0)
    h.apply(ChildEnded, name="a", child_run_id="run-a", status=S.COMPLETED, evidence=freeze({"ok": 1}),
            spent=Usage(1, 2, 4.0))
    assert h.snapshot.budget.used == Usage(3, 4, 14.0)
    outcome = children.outcome(h.snapshot, "a")
    assert outcome is not None and (outcome.status, outcome.evidence) == (S.COMPLETED, freeze({"ok": 1}))
    assert children.outcome(h.snapshot, "b").status is None  # type: ignore[union-attr]
    assert fold(h.events) == h.snapshot


def test_a_child_may_not_draw_more_than_is_left_nor_end_twice_nor_be_someone_elses() -> None:
    h = parent_of("a", drawn=Usage(10, 10, 100.0))
    with pytest.raises(EventRejected):
        h.apply(ChildStarted, name="b", child_run_id="run-b", kind="leaf", budget=Usage(1, 0, 0.0))
    with pytest.raises(EventRejected):
        h.apply(ChildEnded, name="a", child_run_id="run-x", status=S.FAILED, reason="no")
    h.apply(ChildEnded, name="a", child_run_id="run-a", status=S.FAILED, reason="no")
    with pytest.raises(EventRejected):
        h.apply(ChildEnded, name="a", child_run_id="run-a", status=S.FAILED, reason="no")


@pytest.mark.parametrize(("until", "ends_after"), [("all", 3), ("any", 1), (2, 2)])
def test_a_wait_for_children_ends_when_enough_of_them_ended(until: str | int, ends_after: int) -> None:
    h = parent_of("a", "b", "c")
    waiting(h, ("a", "b", "c"), until)
    for i, name in enumerate(("a", "b", "c"), 1):
        if i > ends_after:
            break
        assert h.snapshot.status is S.WAITING_EVENT
        h.apply(ChildEnded, name=name, child_run_id=f"run-{name}", status=S.COMPLETED)
    assert h.snapshot.status is S.READY and h.snapshot.last_wake is not None
    assert h.snapshot.last_wake.correlation_key == f"child:{('a', 'b', 'c')[ends_after - 1]}"
    assert fold(h.events) == h.snapshot


def test_a_childs_end_after_its_parent_ended_is_late() -> None:
    h = parent_of("a")
    h.apply(RunStatusChanged, to=S.FAILED, reason="gave up")
    before = h.snapshot
    assert h.apply(ChildEnded, name="a", child_run_id="run-a", status=S.CANCELLED) == before


def test_decisions_refuse_bad_names_repeats_and_counts() -> None:
    with pytest.raises(ValueError):
        Child(name="a/b", kind="leaf", input=freeze({}))
    with pytest.raises(ValueError):
        StartChildren(children=(Child(name="a", kind="leaf", input=freeze({})),) * 2)
    with pytest.raises(ValueError):
        WaitForChildren(names=("a", "b"), deadline=1.0, until=3)
    assert WaitForChildren(names=["a"], deadline=1.0).names == ("a",)  # type: ignore[arg-type]
