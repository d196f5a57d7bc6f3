"""Outbox rows a worker holds to publish itself right after its commit (``longrun.eager_publish``),
written by the transition statement (``db.runs``).

The statement first marks published the rows its worker got confirmed since its last statement
(``Hold.marks``). Then it inserts the transition's messages; a message offered for holding
(``Hold.offered``: a row of the run the statement moves, under its lease) is held — its
``hold_until`` set ``Hold.grace`` seconds ahead — only if, in the statement's snapshot, no row of
the run's partition is unpublished but the ones it marks. The held rows' ids come back in id
order (``Hold.held``); the worker publishes exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from longrun.db import jsonb, outbox
from longrun.ports.runs import Message

MARKS_CTE = ("eager_marked AS (UPDATE outbox SET published_at = now() "
             "WHERE id = ANY(CAST(:h_marks AS bigint[])) AND published_at IS NULL)")
"""Marks the rows confirmed since the worker's last statement (a part of its own, present only with
marks: an empty list would make PostgreSQL walk the unpublished rows for nothing)."""

_CLEAR = ("clear AS (SELECT NOT EXISTS (SELECT 1 FROM outbox AS u "
          "WHERE u.partition = CAST(:h_partition AS smallint) AND u.published_at IS NULL "
          "AND u.id <> ALL(CAST(:h_marks AS bigint[]))) AS ok)")
_HELD_UNTIL = ("CASE WHEN clear.ok AND r.row ->> 'held' IS NOT NULL "
               "THEN now() + make_interval(secs => CAST(:h_grace AS double precision)) END")
_SENT = (f"sent AS (INSERT INTO outbox ({', '.join(outbox.COLUMNS)}, hold_until) "
         f"SELECT {outbox.ROW_VALUES}, {_HELD_UNTIL} FROM moved, clear, {outbox.from_param('messages')} "
         "ORDER BY r.n RETURNING id, hold_until)")
MESSAGES_CTES = (_CLEAR, _SENT)
"""The transition's messages, the offered ones held when the partition is clear (instead of the
plain ``messages`` part)."""
HELD = "(SELECT array_agg(id ORDER BY id) FROM sent WHERE hold_until IS NOT NULL) AS held"
"""What the statement returns of the rows it held."""


@dataclass(slots=True)
class Hold:
    """What a worker's transition statement is given to hold and mark, and what it held."""

    partition: int
    """The partition of the run the statement moves (its offered rows')."""
    grace: float
    """Seconds the relay leaves a held row to its writer."""
    marks: list[int]
    """Rows this worker got confirmed and has not marked yet."""
    offered: list[bool]
    """Per message of the transition, in order: whether it may be held (``eager_publish.offered``)."""
    offered_rows: list[dict[str, Any]] = field(default_factory=list)
    """The offered messages as the statement wrote them (``outbox.row_json``), in order."""
    held: list[int] = field(default_factory=list)
    """The ids of the rows held, in id order (one per offered message, or none): set by the statement."""


def parts(hold: Hold, messages: Sequence[Message], params: dict[str, Any]) -> list[str]:
    """The transition statement's parts for ``hold`` over the transition's ``messages`` (``eager_marks``
    with marks; ``held_messages`` in place of ``messages``), their parameters added to ``params``."""
    names = []
    if hold.marks:
        names.append("eager_marks")
        params["h_marks"] = hold.marks
    if messages:
        names.append("held_messages")
        rows = [outbox.row_json(m) for m in messages]
        hold.offered_rows = [row for row, offered in zip(rows, hold.offered, strict=True) if offered]
        for row in hold.offered_rows:
            row["held"] = True
        params.update(messages=jsonb.dumps(rows), h_partition=hold.partition, h_grace=hold.grace,
                      h_marks=hold.marks)
    return names
