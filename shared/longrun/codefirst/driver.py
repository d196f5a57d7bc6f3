"""The replay driver: runs a code-first function's coroutine by hand, answering each await from the
journal, until the first await the history holds no result for, or until the function returns or raises.

No event loop runs the coroutine: ``send`` and ``throw`` do, so the function's path depends on nothing
but its input and the history. An await of anything else (an asyncio future, ``asyncio.sleep``, a
task, network I/O) cannot be replayed and stops the run (``ForeignAwait``).

Replay cost: one ``decide`` replays the function from its start, and each await resolves in O(1) from
the journal's index (built once per ``decide``, in one pass over the snapshot), so a decide costs
O(awaits so far + snapshot size). A run makes at most ``MAX_AWAITS`` awaits (``TooManyAwaits`` past
them): a longer task is a parent starting children, each with its own history.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from longrun.codefirst.awaits import Request
from longrun.codefirst.journal import PENDING, Journal, ReplayError, Thrown

MAX_AWAITS = 10_000
"""The awaits one run's function may make; past them the run goes to NEEDS_ATTENTION."""


class ForeignAwait(ReplayError):
    """The function awaited something that is not a longrun await: its result is not in any history."""

    def __init__(self, index: int, awaited: str) -> None:
        super().__init__(
            f"await #{index} awaited {awaited}, which is not a longrun await: a code-first function awaits "
            "only its context's calls and waits (asyncio futures, sleeps, tasks and direct I/O cannot be replayed)")


NO_LOOP = "no running event loop"
"""What asyncio raises when awaited where no event loop runs, as in a replay."""


class TooManyAwaits(ReplayError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the function made more than {limit} awaits: split the task into child runs")


@dataclass(frozen=True, slots=True)
class Parked:
    """The replay reached await ``index``, which the history holds no result for."""

    index: int
    request: Request


@dataclass(frozen=True, slots=True)
class Returned:
    value: Any


@dataclass(frozen=True, slots=True)
class Raised:
    error: Exception


def drive(coroutine: Coroutine[Any, Any, Any], journal: Journal, *,
          limit: int = MAX_AWAITS) -> Parked | Returned | Raised:
    """Replay ``coroutine`` against ``journal``. ``ReplayError`` when the code and the history disagree."""
    index, value, error = 0, None, None
    try:
        while True:
            try:
                awaited = coroutine.send(value) if error is None else coroutine.throw(error)
            except StopIteration as stop:
                journal.check_consumed(index, "nothing more (the function returned)", parked=False)
                return Returned(stop.value)
            except RuntimeError as e:
                if NO_LOOP in str(e):
                    raise ForeignAwait(index, "an asyncio call (it needs a running event loop)") from e
                journal.check_consumed(index, f"nothing more (the function raised {type(e).__name__})", parked=False)
                return Raised(e)
            except Exception as e:
                journal.check_consumed(index, f"nothing more (the function raised {type(e).__name__})", parked=False)
                return Raised(e)
            if not isinstance(awaited, Request):
                raise ForeignAwait(index, f"{type(awaited).__module__}.{type(awaited).__qualname__} ({awaited!r:.200})")
            if index >= limit:
                raise TooManyAwaits(limit)
            outcome = awaited.resolve(journal, index)
            if outcome is PENDING:
                journal.check_consumed(index, awaited.describe(), parked=True)
                awaited.parked(journal, index)
                return Parked(index, awaited)
            if awaited.mark_kind and journal.mark(index) is None:
                journal.record_mark(index, awaited.mark_kind, awaited.mark_data())
            value, error = (None, outcome.error) if isinstance(outcome, Thrown) else (outcome, None)
            index += 1
            journal.position = index
    finally:
        coroutine.close()
