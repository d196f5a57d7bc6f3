"""What cancelling or terminating a run does to its children (``domain.children``): each open child whose
policy is ``cancel`` is cancelled through the cancel protocol, as an operator would cancel it, in the
transaction that cancels the parent; an ``abandon`` child runs on. A child cancels its own children first,
so a whole tree goes at once.

Rows are locked children first, parent last: the order a finishing child's statement takes them (its
own row, then its parent's, which its ``child_ended`` timer refers to), so the two cannot deadlock. A
child the parent's step started just before the parent was locked is found by a second look after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from longrun.domain import TERMINAL
from longrun.errors import DomainError
from longrun.ports.runs import StoredRun
from longrun.ports.stores import RunTransaction

CancelOne = Callable[[StoredRun, str], Awaitable[object]]
"""Cancels one run (locked) for the reason given."""
T = TypeVar("T")


async def with_children(tx: RunTransaction, run_id: str, cancel_one: CancelOne,
                        parent: Callable[[], Awaitable[T]]) -> T:
    """The children cancelled, then ``parent`` (the parent's own cancel or termination) carried out, then any
    child its step started between the two (committed before the parent was locked) cancelled too."""
    await cancel_children(tx, run_id, cancel_one)
    done = await parent()
    await cancel_children(tx, run_id, cancel_one)
    return done


async def cancel_children(tx: RunTransaction, run_id: str, cancel_one: CancelOne) -> None:
    """Cancel the open ``cancel`` children of ``run_id`` (theirs first)."""
    for child_id in await tx.children_to_cancel(run_id):
        await cancel_children(tx, child_id, cancel_one)
        child = await tx.load(child_id, lock=True)
        if child is None or child.snapshot.status in TERMINAL or child.snapshot.cancel_requested:
            continue
        try:
            await cancel_one(child, f"its parent {run_id} was cancelled")
        except DomainError:  # its state refuses a cancel (e.g. it is ending another way): it ends as it is
            continue
