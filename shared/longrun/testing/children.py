"""Child runs in memory (``db.children``): which run is whose child, and the ``child_ended`` timer a
finishing child's write schedules for its parent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longrun.domain import children
from longrun.ports.runs import Planned


@dataclass(frozen=True, slots=True)
class ChildLink:
    """A ``children`` row: the child's parent, its name there, and what cancelling the parent does to it."""

    parent_run_id: str
    name: str
    on_parent_cancel: str


def tell_parent(schedule: Callable[..., None], planned: Planned, link: ChildLink | None) -> None:
    """``db.children.ENDED``: when ``planned`` finishes a child, the timer that tells its parent, through
    ``schedule`` (``MemoryStore.schedule``)."""
    if link is None or not planned.ends_run:
        return
    run = planned.after.snapshot
    schedule(timer_key=f"child_ended:{run.run_id}", run_id=link.parent_run_id, kind=children.ENDED_TIMER, delay=0.0,
             payload={**children.end_report(run), "name": link.name, "child_run_id": run.run_id})
