"""Settling actions in doubt, and the reconciler's entry: the service runs every sweep from this module.

Responsibility:
- ``settle_in_doubt`` (``reconcile_unknown`` on PostgreSQL): ask the far side, by idempotency
  key, what became of each action whose outcome is UNKNOWN, and record CONFIRMED, RETRYABLE or
  NEEDS_ATTENTION (seed 004 section 5: deterministic queries per tool, no model; a person only
  when the far side cannot be asked, fails, or contradicts the request). An action still
  SUBMITTED under a run that ended (terminated, timed out, out of budget) with no outcome
  recorded is in doubt too: once ``abandoned_after`` passed it is marked UNKNOWN (a late event)
  and settled the same way.
- The other sweeps live in modules of their own and are imported here for the service:
  expired leases in ``reconcile_leases``, alerts on silent runs and on drift in
  ``reconcile_alerts``, dead letters in ``reconcile_dead_letters``; the producer name and the
  counters they all share in ``reconcile_common``.

Invariants:
- No database transaction or row lock is held across a call to the far side. A claim
  commits RECONCILING first (``action.reconciliation_started``); the lookup runs with no
  connection checked out; the outcome commits in a new transaction under the run's lock,
  only while that claim is still the action's latest (a later claim voids an earlier one).
- A confirmation records what the worker records after a confirmed call: the ledger row's
  external id and receipt, and the fact ``receipt:<logical_action>``, so ``decide`` sees it;
  a receipt over ``INLINE_LIMIT`` is uploaded to the artifact store first and referenced.
- RETRYABLE is recorded only when the far side answered that nothing exists under the key;
  the worker then resubmits under the same key. A far side that cannot answer now
  (unavailable, timed out) decides nothing: the action stays RECONCILING with the reason in
  the ledger and is claimed again once ``abandoned_after`` passes, exactly like the claim
  of a reconciler that crashed (RECONCILING -> UNKNOWN -> RECONCILING, both recorded).
- An outcome settled after its run COMPLETED that contradicts what the run counted as done
  (``domain.closure.contradiction``) is stored late, like any outcome for a finished run, and
  opens a correction: ``run.correction_needed`` on the run (which stays COMPLETED), broadcast
  publicly, and an alert (``CORRECTION_ALERT``). Nothing the run recorded is overwritten.
- NEEDS_ATTENTION keeps the action unreconciled, so the domain leaves the run in
  ACTION_UNKNOWN; the reconciler then moves the run to NEEDS_ATTENTION itself. When the
  last action in doubt settles otherwise, the domain readies the run and it is woken (a
  CANCELLING run is woken too: it finishes cancelling once its actions are settled).
- Several replicas may run every sweep at once; each sweep's module says how. Here claims
  lock the run with SKIP LOCKED.
- The decisions are written once, against ``ports.stores.ReconcileStore``: PostgreSQL in
  ``db.reconcile_store`` (``reconcile_unknown``, the service's entry), memory in
  ``longrun.testing.reconcile_store`` (the property tests' world).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind

from longrun import logs, metrics, otel
from longrun.app import effects
from longrun.app.reconciler.common import CORRECTION_ALERT, METRICS, PRODUCER
from longrun.artifacts import INLINE_LIMIT, ArtifactStore
from longrun.authoring import Registry, Tool, ToolResult
from longrun.ports.stores import Doubtful, ReconcileStore, ReconcileTransaction
from longrun.domain import (HELD_FOR_RECONCILIATION, RECEIPT_FACT_PREFIX, TERMINAL, WAKE_A_WORKER, ActionStatus, EffectKind, RunStatus, closure, evolve, freeze,
                            thaw)
from longrun.domain import events as ev
from longrun.errors import TransientError
from longrun.ports.runs import Artifact, LedgerOutcome, StoredRun

logger = logging.getLogger(__name__)

ABANDONED_AFTER = 60.0
"""Seconds after which a RECONCILING action with no outcome is claimed again (longer than any lookup)."""
FOUND_NOTE = "found by idempotency key"
ENDED_WHILE_SUBMITTED = "the run ended while this was submitted; no worker recorded its outcome"

_A = ActionStatus
# Re-running these is safe by their effect kind, so a tool without a lookup needs no person.
_REPEATABLE = frozenset({EffectKind.PURE, EffectKind.READ, EffectKind.IDEMPOTENT_WRITE})
# Open statuses an unreconciled action can leave a run in: parked for it, or paused or cancelled on top.


@dataclass(frozen=True, slots=True)
class Verdict:
    """What reconciliation concluded; ``outcome`` None means the far side could not answer now."""

    outcome: ActionStatus | None
    note: str
    found: ToolResult | None = None


@dataclass(frozen=True, slots=True)
class _Claim:
    run_id: str
    logical_action: str
    idempotency_key: str
    request: Mapping[str, Any]
    tool: Tool
    started_seq: int
    """Seq of this claim's ``action.reconciliation_started``: the outcome lands only while it is the latest."""
    tenant_id: str
    trace_root: str | None
    """The traceparent of the run's root span: the lookup's span is its child."""


async def settle_in_doubt(store: ReconcileStore, registry: Registry, *, limit: int, clock: Callable[[], float],
                          artifacts: ArtifactStore | None = None,
                          abandoned_after: float = ABANDONED_AFTER) -> Counter[str]:
    """Settle up to ``limit`` actions in doubt; returns how many ended each way (outcome name,
    ``deferred`` when the far side could not answer, ``superseded`` when another claim won).

    Without ``artifacts`` every receipt is kept inline, whatever its size.
    """
    claims: list[_Claim] = []
    tally: Counter[str] = Counter()
    for run_id, logical_action in await in_doubt(store, limit=limit, abandoned_after=abandoned_after):
        claimed = await _isolated(store, _claim(store, registry, run_id, logical_action, clock=clock,
                                         abandoned_after=abandoned_after), f"claim {run_id}/{logical_action}")
        if isinstance(claimed, _Claim):
            claims.append(claimed)
        elif isinstance(claimed, ActionStatus):
            tally[claimed.value] += 1
    verdicts = await asyncio.gather(*(_traced_look_up(c) for c in claims))
    for claim, verdict in zip(claims, verdicts, strict=True):
        settled = await _isolated(store, _settle(store, claim, verdict, clock=clock, artifacts=artifacts),
                                  f"settle {claim.run_id}/{claim.logical_action}")
        if isinstance(settled, str):
            tally[settled] += 1
    for name, n in tally.items():
        METRICS[f"reconciled.{name}"] += n
        metrics.RECONCILED.labels(name).inc(n)
    return tally


async def _traced_look_up(claim: _Claim) -> Verdict:
    """``look_up`` in its span, a child of the run's root; log records name the run."""
    with logs.bound(claim.run_id, claim.tenant_id), otel.run_span(
            f"lookup {claim.tool.name}", claim.trace_root, kind=SpanKind.CLIENT, attributes={
                "longrun.run_id": claim.run_id, "longrun.tenant": claim.tenant_id, "gen_ai.tool.name": claim.tool.name,
                "longrun.logical_action": claim.logical_action, "longrun.idempotency_key": claim.idempotency_key}
    ) as span:
        verdict = await look_up(claim.tool, claim.idempotency_key, claim.request)
        span.set_attribute("longrun.reconcile.outcome", verdict.outcome.value if verdict.outcome else "deferred")
        return verdict


async def look_up(tool: Tool, idempotency_key: str, request: Mapping[str, Any]) -> Verdict:
    """Ask the far side what ``idempotency_key`` created and judge the answer against ``request``."""
    assert tool.lookup is not None
    try:
        found = await asyncio.wait_for(tool.lookup(idempotency_key), timeout=tool.start_to_close)
    except TimeoutError:
        return Verdict(None, f"lookup unavailable: no answer within {tool.start_to_close}s")
    except TransientError as e:
        return Verdict(None, f"lookup unavailable: {e}")
    except Exception as e:
        return Verdict(_A.NEEDS_ATTENTION, f"lookup by idempotency key failed: {e.__class__.__name__}: {e}")
    if found is None:
        return Verdict(_A.RETRYABLE, "nothing exists under the idempotency key; resubmitting under it is safe")
    clashes = contradictions(request, found.receipt)
    if clashes:
        return Verdict(_A.NEEDS_ATTENTION, f"{found.external_id} was found by idempotency key but contradicts "
                                           f"the request ({', '.join(clashes)})", found)
    return Verdict(_A.CONFIRMED, FOUND_NOTE, found)


def contradictions(request: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Request fields the found object also carries, with another value.

    Tools name their far-side fields after their arguments (repo, branch, sha, title...), so
    a shared name with a different value means the key was spent on another request.
    """
    return sorted(name for name, value in request.items() if name in found and found[name] != value)


async def in_doubt(store: ReconcileStore, *, limit: int,
                   abandoned_after: float = ABANDONED_AFTER) -> list[tuple[str, str]]:
    """(run_id, logical_action) of up to ``limit`` actions to claim, oldest first.

    Three sources, because none alone sees them all: ledger rows UNKNOWN (or RECONCILING and
    abandoned); held runs whose snapshot lists an UNKNOWN action (the snapshot is the
    projection of the run's events, whatever its ledger row says); and ledger rows still
    SUBMITTED under a finished run once ``abandoned_after`` passed: the run ended (terminated,
    timed out, out of budget) while the request was out and the worker never recorded what
    became of it, and no worker will come back for a finished run.
    """
    found = await store.in_doubt(limit=limit, abandoned_after=abandoned_after, held=HELD_FOR_RECONCILIATION)
    return list(dict.fromkeys(found))[:limit]


async def _claim(store: ReconcileStore, registry: Registry, run_id: str, logical_action: str, *,
                 clock: Callable[[], float], abandoned_after: float) -> _Claim | ActionStatus | None:
    """Commit RECONCILING; settle at once when no lookup exists. None when there is nothing to claim."""
    async with store.transaction() as tx:
        # A run another replica (or a worker) is writing is left for the next sweep.
        stored = await tx.lock_run(run_id)
        row = None if stored is None else await tx.doubtful(run_id, logical_action, abandoned_after=abandoned_after)
        if stored is None or row is None:
            return None
        at = clock()
        events = _claim_events(stored, row, logical_action, at=at)
        if events is None:
            return None
        tool = _tool(registry, stored, row.tool)
        if tool is None or tool.lookup is None:
            verdict = _without_lookup(row.tool, EffectKind(row.effect_kind), known=tool is not None)
            await _record(tx, stored, events, logical_action, row.idempotency_key, row.tool, verdict, at=at)
            assert verdict.outcome is not None
            return verdict.outcome
        after = await tx.append(stored, events)
        await tx.record(LedgerOutcome(row.idempotency_key, _A.RECONCILING, {"last_error": None}))
        await _broadcast(tx, stored, after, row.idempotency_key)
        return _Claim(run_id, logical_action, row.idempotency_key, row.request, tool, events[-1].seq,
                      stored.snapshot.tenant_id, stored.trace_root)


def _claim_events(stored: StoredRun, row: Doubtful, logical_action: str, *, at: float) -> list[ev.RunEvent] | None:
    """A claim's events, ending with ``action.reconciliation_started``; None when the action is not in doubt."""
    record = stored.snapshot.action(logical_action)
    finished = stored.snapshot.status in TERMINAL
    # Events for a finished run are stored, not applied: its ledger row is what moves on.
    status = ActionStatus(row.status) if finished or record is None else record.status
    events: list[ev.RunEvent]
    if status is _A.UNKNOWN:
        events = []
    elif status is _A.SUBMITTED and finished and row.stale:
        events = [ev.ActionUnknown(seq=stored.seq(1), at=at, logical_action=logical_action,
                                   cause=ENDED_WHILE_SUBMITTED)]
    elif status is _A.RECONCILING and (row.stale or row.status != _A.RECONCILING.value):
        note = f"the previous reconciliation did not finish ({row.last_error or 'the reconciler stopped'})"
        events = [ev.ActionReconciled(seq=stored.seq(1), at=at, logical_action=logical_action,
                                      outcome=_A.UNKNOWN, note=note)]
    else:
        return None
    events.append(ev.ReconciliationStarted(seq=stored.seq(len(events) + 1), at=at, logical_action=logical_action))
    return events


def _tool(registry: Registry, stored: StoredRun, name: str) -> Tool | None:
    try:
        return registry.get(stored.snapshot.kind, stored.snapshot.versions.workflow).tools.get(name)
    except LookupError:
        return None


def _without_lookup(tool: str, effect: EffectKind, *, known: bool) -> Verdict:
    if not known:
        return Verdict(_A.NEEDS_ATTENTION, f"this deployment has no tool {tool} for the run's pinned version; "
                                           "a person must check the far side")
    if effect in _REPEATABLE:
        return Verdict(_A.RETRYABLE, f"{tool} has no lookup, and a {effect.value} re-runs safely under the same key")
    return Verdict(_A.NEEDS_ATTENTION, f"{tool} has no lookup and a {effect.value} must not be repeated blindly; "
                                       "a person must check the far side")


@dataclass(frozen=True, slots=True)
class _Receipt:
    """A receipt as the run keeps it: inline, or a reference to the uploaded original."""

    value: dict[str, Any]
    ref: str | None
    size: int


async def _keep(found: ToolResult, artifacts: ArtifactStore | None, tenant_id: str) -> _Receipt:
    """The worker's rule for receipts, so both writers leave the same shape behind."""
    receipt = dict(found.receipt)
    body = json.dumps(receipt, sort_keys=True).encode()
    if artifacts is None or len(body) <= INLINE_LIMIT:
        return _Receipt(receipt, None, len(body))
    # Uploaded before the transaction that references it, so a committed reference never dangles.
    ref = await artifacts.put(tenant_id, body)
    return _Receipt({"artifact": ref, "size": len(body), "external_id": found.external_id}, ref, len(body))


async def _settle(store: ReconcileStore, claim: _Claim, verdict: Verdict, *, clock: Callable[[], float],
                  artifacts: ArtifactStore | None) -> str:
    receipt = None
    if verdict.outcome is _A.CONFIRMED and verdict.found is not None:
        receipt = await _keep(verdict.found, artifacts, claim.tenant_id)
    async with store.transaction() as tx:
        stored = await tx.load(claim.run_id, lock=True)
        assert stored is not None, "a claimed action's run exists"
        latest = await tx.latest_claim(claim.run_id, claim.logical_action)
        status = await tx.ledger_status(claim.idempotency_key)
        # Another claim started since, or an operator settled the action meanwhile: theirs stands.
        if latest != claim.started_seq or status != _A.RECONCILING.value:
            logger.info("run %s: the claim of %s at seq %d was superseded (latest claim %s, action %s); "
                        "its outcome is dropped", claim.run_id, claim.logical_action, claim.started_seq, latest,
                        status)
            return "superseded"
        if verdict.outcome is None:
            # Touching the row restarts the abandonment clock: the next attempt waits abandoned_after.
            await tx.record(LedgerOutcome(claim.idempotency_key, _A.RECONCILING, {"last_error": verdict.note}))
            logger.warning("run %s: %s stays RECONCILING: %s", claim.run_id, claim.logical_action, verdict.note)
            return "deferred"
        if receipt is not None and receipt.ref is not None:
            await tx.register(Artifact(receipt.ref, receipt.size, claim.tenant_id), claim.run_id)
        await _record(tx, stored, [], claim.logical_action, claim.idempotency_key, claim.tool.name, verdict,
                      at=clock(), receipt=receipt)
        return verdict.outcome.value


async def _record(tx: ReconcileTransaction, stored: StoredRun, claim_events: Sequence[ev.RunEvent],
                  logical_action: str, key: str, tool: str, verdict: Verdict, *, at: float,
                  receipt: _Receipt | None = None) -> None:
    """Append the claim's events (if any) and the verdict's; update the ledger; broadcast; wake if there is work."""
    assert verdict.outcome is not None
    found = verdict.found if receipt is not None else None
    events = list(claim_events)
    events.append(ev.ActionReconciled(seq=stored.seq(len(events) + 1), at=at, logical_action=logical_action,
                                      outcome=verdict.outcome, external_id=found.external_id if found else None,
                                      receipt_ref=receipt.ref if receipt else None, note=verdict.note))
    if receipt is not None:
        events.append(ev.FactRecorded(seq=stored.seq(len(events) + 1), at=at,
                                      key=f"{RECEIPT_FACT_PREFIX}{logical_action}",
                                      value=freeze(receipt.value), source=f"tool:{tool}"))
    if verdict.outcome is _A.NEEDS_ATTENTION and _status_after(stored, events) is RunStatus.ACTION_UNKNOWN:
        # The escalated action still holds the run; nothing but a person can move it on.
        events.append(ev.RunStatusChanged(seq=stored.seq(len(events) + 1), at=at, to=RunStatus.NEEDS_ATTENTION,
                                          reason=f"{logical_action}: {verdict.note}"))
    # An outcome that contradicts a COMPLETED run is stored late (its history stands) and opens a correction.
    opened = closure.corrections(stored.snapshot, closure.reports(events), seq=stored.seq(len(events) + 1), at=at)
    after = await tx.append(stored, [*events, *opened])
    fields: dict[str, Any] = {"last_error": verdict.note if verdict.outcome is _A.NEEDS_ATTENTION else None}
    if found is not None and receipt is not None:
        fields.update(external_id=found.external_id, receipt=receipt.value, receipt_ref=receipt.ref)
    await tx.record(LedgerOutcome(key, verdict.outcome, fields))
    await _broadcast(tx, stored, after, key)
    for correction in opened:
        await tx.send([effects.correction_message(after, correction, producer=PRODUCER, cause=f"reconciler:{key}")])
        await tx.alert(actor=PRODUCER, action=CORRECTION_ALERT, target=stored.snapshot.run_id,
                       reason=correction.reason, details={"logical_action": correction.logical_action, **thaw(correction.evidence)})
        logger.warning("run %s needs a correction: %s", stored.snapshot.run_id, correction.reason)
    # A cancelling run waits for its actions to settle before it can finish: it has work again too.
    if after.snapshot.status in WAKE_A_WORKER:
        await tx.send([effects.wake_message(after, reason=f"reconciled {logical_action}", producer=PRODUCER,
                                            cause=f"reconciler:{key}")])
    logger.info("run %s: %s reconciled %s (%s)", stored.snapshot.run_id, logical_action, verdict.outcome.value,
                verdict.note)


async def _broadcast(tx: ReconcileTransaction, before: StoredRun, after: StoredRun, key: str) -> None:
    """The status change, for downstream consumers. Reconciling never finishes a run (a finished run's
    events are stored, not applied), so no tenant slot is freed here."""
    message = effects.broadcast_message(before.snapshot, after, producer=PRODUCER, cause=f"reconciler:{key}")
    if message is not None:
        await tx.send([message])


def _status_after(stored: StoredRun, events: Sequence[ev.RunEvent]) -> RunStatus:
    snapshot = stored.snapshot
    for event in events:
        snapshot = evolve(snapshot, event)
    return snapshot.status


async def _isolated(store: ReconcileStore, work: Any, what: str) -> Any:
    """One item's failure is logged and skipped, so it cannot stall the rest of the sweep."""
    try:
        return await work
    except Exception as e:
        if store.unreachable(e):
            raise
        logger.exception("%s failed; left for a later sweep", what)
        return None
