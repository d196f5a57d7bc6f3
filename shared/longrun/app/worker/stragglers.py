"""The calls that lost a satisfied join and were still submitted when their worker died.

``run.joined`` is written as soon as a join is satisfied, while its losers still run; a worker that
dies then leaves them SUBMITTED, and ``decide``, gone on from the join, never asks for them again.
The next lease holder settles them before it decides, as a fan-out does its calls cut off by a
crash: pure, read and idempotent ones sent again under their key (the new fencing token), with the
arguments the ledger holds, non-idempotent writes recorded UNKNOWN for the reconciler (which holds
the run back only once it asks for something that needs every effect settled: ``joins.holding``).
They run while the round goes on, as the losers did; the join is not written again.
"""

from __future__ import annotations

from longrun.app.worker.commit import Step, ToolRequest
from longrun.app.worker.fan_out import Joining, send
from longrun.app.worker.far_side import FarSide
from longrun.authoring import RunKind
from longrun.domain import ActionStatus, joins
from longrun.ports.runs import StoredRun


async def send_again(far: FarSide, step: Step, stored: StoredRun, kind: RunKind) -> StoredRun | None:
    """The state to decide on, once every straggler is sent again or in doubt; None once the run left."""
    run = stored.snapshot
    for fact in run.facts:
        if not fact.key.startswith(joins.JOINED_FACT_PREFIX):
            continue
        joined = joins.joined(run, fact.key.removeprefix(joins.JOINED_FACT_PREFIX))
        assert joined is not None
        lost = [c for c in joined.lost if c not in step.in_flight
                and (a := run.action(c)) is not None and a.status is ActionStatus.SUBMITTED]
        if not lost:
            continue
        args = await step.store.requests(run.run_id, lost)
        calls = []
        for name in lost:
            record = run.action(name)
            assert record is not None
            calls.append(ToolRequest(kind.tools[record.tool], name, record.idempotency_key, args[name]))
        sent = await send(far, step, stored, kind, calls,
                          Joining(joined.name, joined.calls, joins.at_least(len(joined.by))), {})
        if sent is None:
            return None
        stored, run = sent, sent.snapshot
    return stored
