"""Sending a signal to a run: the one use case behind the operator API (``POST /runs/{run_id}/signals``),
``longrunctl run signal`` and a producer's ``run.signal`` on the ingress.

Checked before anything is written: the run exists (and, from the bus, belongs to the tenant the
message names), its kind declares a signal of that name and the payload satisfies its schema
(``RunKind.signal_problems``); a refusal names why and changes nothing. Then, under the run's lock:
a signal whose id the run's history holds already is a repeat, answered ``duplicate`` and written
nowhere; otherwise ``signal.received`` is appended, and the domain decides what it does
(``longrun.domain.signals``): it wakes the run waiting for it (``woke``), is recorded for ``decide`` to
read (``recorded``), or, the run having ended, is kept in its history and not applied (``late``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from longrun import logs, otel
from longrun.app import effects
from longrun.app.gateway.operate import RunNotFound
from longrun.authoring import Registry
from longrun.domain import TERMINAL, WAKE_A_WORKER, JsonValue, freeze
from longrun.domain import events as ev
from longrun.domain.signals import waits_for
from longrun.errors import DomainError, ErrorCode
from longrun.ports.stores import RunTransaction

MAX_SIGNAL_ID = 200
"""Characters of a signal's id: the sender's key for it, as an idempotency key is."""


class SignalRefused(DomainError):
    """A signal the run's kind does not accept as sent; nothing was recorded."""

    code = ErrorCode.EVENT_REJECTED

    def __init__(self, run_id: str, name: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"run {run_id}: signal {name[:100]!r} refused: " + "; ".join(problems))


async def send(tx: RunTransaction, run_id: str, *, signal_id: str, name: str, payload: JsonValue, sent_by: str,
               actor: str, kinds: Registry, reason: str, tenant_id: str | None = None, producer: str = "operator",
               clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Record the signal on the run (see the module docstring); ``tenant_id``: the tenant the sender
    may act in, a run of another one is answered as no run at all. ``sent_by``: the fact's source,
    ``operator:<subject>`` or ``producer:<broker user>``; ``actor``: who the audit log names.
    Returns the run's status and revision, and ``outcome``."""
    if not signal_id or len(signal_id) > MAX_SIGNAL_ID:
        raise SignalRefused(run_id, name, [f"signal_id: 1 to {MAX_SIGNAL_ID} characters, got {len(signal_id)}"])
    try:
        orjson.dumps(payload)
    except TypeError as e:  # an integer past 64 bits, or nesting past 255 levels: the run's JSONB cannot hold it
        raise SignalRefused(run_id, name, [f"payload: cannot be stored: {e}"]) from None
    stored = await tx.load(run_id, lock=True)
    if stored is None or (tenant_id is not None and stored.snapshot.tenant_id != tenant_id):
        raise RunNotFound(run_id)
    run = stored.snapshot
    try:
        kind = kinds.get(run.kind, run.versions.workflow)
    except LookupError as e:
        raise SignalRefused(run_id, name, [str(e)]) from None
    problems = kind.signal_problems(name, payload)
    if problems:
        raise SignalRefused(run_id, name, problems)
    answer = {"run_id": run_id, "signal_id": signal_id}
    if await tx.signal_seen(run_id, signal_id):
        return {**answer, "status": run.status.value, "revision": run.revision, "outcome": "duplicate"}
    with logs.bound(run_id, run.tenant_id), otel.run_span("signal", stored.trace_root, attributes={
            "longrun.run_id": run_id, "longrun.tenant": run.tenant_id, "longrun.signal": name,
            "longrun.signal_id": signal_id}):
        after = await tx.append(stored, [ev.SignalReceived(seq=stored.seq(), at=clock(), signal_id=signal_id,
                                                           name=name, payload=freeze(payload), sent_by=sent_by)])
        now = after.snapshot
        outcome = "late" if run.status in TERMINAL else "woke" if waits_for(run, name) else "recorded"
        await tx.audit(actor=actor, action="signal", target=run_id, reason=reason, details={
            "signal_id": signal_id, "name": name, "outcome": outcome, "from": run.status.value,
            "to": now.status.value})
        cause = f"signal:{signal_id}"
        broadcast = effects.broadcast_message(run, after, producer=producer, cause=cause)
        wakeup = (effects.wake_message(after, reason=f"signal {name}", producer=producer, cause=cause)
                  if outcome == "woke" and now.status in WAKE_A_WORKER else None)
        await tx.send([m for m in (broadcast, wakeup) if m is not None])
    return {**answer, "status": now.status.value, "revision": now.revision, "outcome": outcome}
