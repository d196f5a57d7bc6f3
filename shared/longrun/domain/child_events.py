"""The events of child runs (``longrun.domain.children``), registered with the others in
``longrun.domain.events``."""

from __future__ import annotations

from typing import ClassVar

from longrun.domain.budget import Usage
from longrun.domain.codec import FrozenMap
from longrun.domain.event_base import RunEvent, event
from longrun.domain.run import RunStatus


@event
class ChildStarted(RunEvent):
    """The run started a child run, created in the same transaction through admission: it becomes the
    fact ``child:<name>``, and the budget the child drew from the run's remaining is charged to the run."""

    type: ClassVar[str] = "run.child_started"
    name: str
    child_run_id: str
    kind: str
    budget: Usage
    """What the child may spend: its limits, drawn from this run's remaining."""


@event
class ChildEnded(RunEvent):
    """A child of the run ended (any terminal status): its fact records the status with the evidence
    (COMPLETED) or the reason, what it did not spend of its budget is given back, and a wait for enough
    of the run's children ends. After the run ended it is kept in the history, not applied."""

    type: ClassVar[str] = "run.child_ended"
    name: str
    child_run_id: str
    status: RunStatus
    evidence: FrozenMap = FrozenMap()
    reason: str | None = None
    spent: Usage = Usage()
    """What the child used of its budget."""
