"""The reconciler's use cases: settle actions in doubt, re-wake abandoned runs, raise alerts, keep dead letters.

Responsibility:
- ``reconcile_unknown``: ask the far side, by idempotency key, what became of each action
  whose outcome is UNKNOWN, and record CONFIRMED, RETRYABLE or NEEDS_ATTENTION (seed 004
  section 5: deterministic queries per tool, no model; a person only when the far side cannot
  be asked, fails, or contradicts the request). An action still SUBMITTED under a run that
  ended (terminated, timed out, out of budget) with no outcome recorded is in doubt too: once
  ``abandoned_after`` passed it is marked UNKNOWN (a late event) and settled the same way.
- ``rewake_expired_leases``: a run whose worker stopped renewing its lease gets one wakeup.
- ``flag_silent_runs``: a run parked in a status longer than its limit raises one alert.
- ``check_drift``: a confirmed action whose far-side object vanished or changed identity
  raises one alert; the run is never changed.
- ``ingest_quarantine_queue``: messages the broker dead-lettered are kept in ``quarantine``.

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
- NEEDS_ATTENTION keeps the action unreconciled, so the domain leaves the run in
  ACTION_UNKNOWN; the reconciler then moves the run to NEEDS_ATTENTION itself. When the
  last action in doubt settles otherwise, the domain readies the run and it is woken (a
  CANCELLING run is woken too: it finishes cancelling once its actions are settled).
- Several replicas may run every use case at once: claims lock the run with SKIP LOCKED;
  alerts are deduplicated per episode under an advisory lock; a lease is cleared in the
  transaction that enqueues its wakeup; dead letters are deduplicated by the inbox.
- Alerts (audit_log rows by actor "reconciler") never change a run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from sqlalchemy import Float, and_, exists, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.app import effects
from longrun.app.webhooks import audit
from longrun.artifacts import INLINE_LIMIT, ArtifactStore, register
from longrun.authoring import Registry, Tool, ToolResult
from longrun.bus.connection import Bus
from longrun.bus.topology import QUARANTINE_QUEUE
from longrun.db import actions as ledger
from longrun.db import inbox, outbox, runs
from longrun.db import quarantine as quarantine_rows
from longrun.db.errors import is_transient
from longrun.db.runs import StoredRun
from longrun.db.schema import actions, audit_log, quarantine, run_events
from longrun.db.schema import runs as runs_table
from longrun.domain import RECEIPT_FACT_PREFIX, TERMINAL, ActionStatus, EffectKind, RunStatus, evolve, freeze
from longrun.domain import events as ev
from longrun.errors import TransientError

logger = logging.getLogger(__name__)

PRODUCER = "reconciler"
ABANDONED_AFTER = 60.0
"""Seconds after which a RECONCILING action with no outcome is claimed again (longer than any lookup)."""
FOUND_NOTE = "found by idempotency key"
ENDED_WHILE_SUBMITTED = "the run ended while this was submitted; no worker recorded its outcome"
SILENT_ALERT = "alert.silent_run"
DRIFT_ALERT = "alert.drift"
QUARANTINE_PREFETCH = 20
INGEST_RETRY_DELAY = 1.0

METRICS: Counter[str] = Counter()
"""Process-wide counters (outcomes, re-wakes, alerts, dead letters kept); the service logs them."""

_A = ActionStatus
# Re-running these is safe by their effect kind, so a tool without a lookup needs no person.
_REPEATABLE = frozenset({EffectKind.PURE, EffectKind.READ, EffectKind.IDEMPOTENT_WRITE})
# Open statuses an unreconciled action can leave a run in: parked for it, or paused or cancelled on top.
_HELD = (RunStatus.ACTION_UNKNOWN.value, RunStatus.PAUSED.value, RunStatus.CANCELLING.value)
# A worker has something to do for these once the lease is free; the rest are parked or finished.
_WAKEABLE = frozenset({RunStatus.READY, RunStatus.RUNNING, RunStatus.CANCELLING})
REWAKES_AFTER_DEAD_LETTER = 3
_ALERT_LOCK_NAMESPACE = 0x6C72_6C74
"""First key of the two-key advisory lock that serialises alerts for one target."""


# -- unknown actions -------------------------------------------------------------------------------


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


async def reconcile_unknown(engine: AsyncEngine, registry: Registry, *, limit: int, clock: Callable[[], float],
                            artifacts: ArtifactStore | None = None,
                            abandoned_after: float = ABANDONED_AFTER) -> Counter[str]:
    """Settle up to ``limit`` actions in doubt; returns how many ended each way (outcome name,
    ``deferred`` when the far side could not answer, ``superseded`` when another claim won).

    Without ``artifacts`` every receipt is kept inline, whatever its size.
    """
    async with engine.connect() as conn:
        candidates = await _in_doubt(conn, limit=limit, abandoned_after=abandoned_after)
    claims: list[_Claim] = []
    tally: Counter[str] = Counter()
    for run_id, logical_action in candidates:
        claimed = await _isolated(_claim(engine, registry, run_id, logical_action, clock=clock,
                                         abandoned_after=abandoned_after), f"claim {run_id}/{logical_action}")
        if isinstance(claimed, _Claim):
            claims.append(claimed)
        elif isinstance(claimed, ActionStatus):
            tally[claimed.value] += 1
    verdicts = await asyncio.gather(*(look_up(c.tool, c.idempotency_key, c.request) for c in claims))
    for claim, verdict in zip(claims, verdicts, strict=True):
        settled = await _isolated(_settle(engine, claim, verdict, clock=clock, artifacts=artifacts),
                                  f"settle {claim.run_id}/{claim.logical_action}")
        if isinstance(settled, str):
            tally[settled] += 1
    for name, n in tally.items():
        METRICS[f"reconciled.{name}"] += n
    return tally


async def look_up(tool: Tool, idempotency_key: str, request: Mapping[str, Any]) -> Verdict:
    """Ask the far side what ``idempotency_key`` created and judge the answer against ``request``."""
    assert tool.lookup is not None
    try:
        found = await asyncio.wait_for(tool.lookup(idempotency_key), timeout=tool.timeout)
    except TimeoutError:
        return Verdict(None, f"lookup unavailable: no answer within {tool.timeout}s")
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


async def _in_doubt(conn: AsyncConnection, *, limit: int, abandoned_after: float) -> list[tuple[str, str]]:
    """(run_id, logical_action) of actions to claim, oldest first.

    Three sources, because none alone sees them all: ledger rows UNKNOWN (or RECONCILING and
    abandoned); held runs whose snapshot lists an UNKNOWN action (the snapshot is the
    projection of the run's events, whatever its ledger row says); and ledger rows still
    SUBMITTED under a finished run once ``abandoned_after`` passed: the run ended (terminated,
    timed out, out of budget) while the request was out and the worker never recorded what
    became of it, and no worker will come back for a finished run.
    """
    stale = func.now() - timedelta(seconds=abandoned_after)
    rows = await conn.execute(
        select(actions.c.run_id, actions.c.logical_action)
        .where(or_(actions.c.status == _A.UNKNOWN.value,
                   and_(actions.c.status == _A.RECONCILING.value, actions.c.updated_at < stale)))
        .order_by(actions.c.updated_at).limit(limit))
    found = [(r.run_id, r.logical_action) for r in rows]
    held = await conn.execute(
        select(runs_table.c.run_id, runs_table.c.snapshot["actions"].label("actions"))
        .where(runs_table.c.status.in_(_HELD),
               runs_table.c.snapshot["actions"].contains([{"status": _A.UNKNOWN.value}]))
        .order_by(runs_table.c.updated_at).limit(limit))
    for row in held:
        found += [(row.run_id, a["logical_action"]) for a in row.actions if a["status"] == _A.UNKNOWN.value]
    orphans = await conn.execute(
        select(actions.c.run_id, actions.c.logical_action)
        .join(runs_table, runs_table.c.run_id == actions.c.run_id)
        .where(actions.c.status == _A.SUBMITTED.value, actions.c.updated_at < stale,
               runs_table.c.status.in_([s.value for s in TERMINAL]))
        .order_by(actions.c.updated_at).limit(limit))
    found += [(r.run_id, r.logical_action) for r in orphans]
    return list(dict.fromkeys(found))[:limit]


async def _claim(engine: AsyncEngine, registry: Registry, run_id: str, logical_action: str, *,
                 clock: Callable[[], float], abandoned_after: float) -> _Claim | ActionStatus | None:
    """Commit RECONCILING; settle at once when no lookup exists. None when there is nothing to claim."""
    async with engine.begin() as conn:
        # SKIP LOCKED: a run another replica (or a worker) is writing is left for the next sweep.
        if (await conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == run_id)
                               .with_for_update(skip_locked=True))).first() is None:
            return None
        stored = await runs.load(conn, run_id)
        row = (await conn.execute(
            select(actions, (actions.c.updated_at < func.now() - timedelta(seconds=abandoned_after)).label("stale"))
            .where(actions.c.run_id == run_id, actions.c.logical_action == logical_action)
            .with_for_update())).first()
        if stored is None or row is None:
            return None
        record = stored.snapshot.action(logical_action)
        # Events for a finished run are stored, not applied: its ledger row is what moves on.
        status = ActionStatus(row.status) if stored.snapshot.status in TERMINAL or record is None else record.status
        at = clock()
        if status is _A.UNKNOWN:
            events: list[ev.RunEvent] = []
        elif status is _A.SUBMITTED and stored.snapshot.status in TERMINAL and row.stale:
            # Stored as late events (the run is finished); the ledger row is what moves on.
            events = [ev.ActionUnknown(seq=stored.seq(1), at=at, logical_action=logical_action,
                                       cause=ENDED_WHILE_SUBMITTED)]
        elif status is _A.RECONCILING and (row.stale or row.status != _A.RECONCILING.value):
            note = f"the previous reconciliation did not finish ({row.last_error or 'the reconciler stopped'})"
            events = [ev.ActionReconciled(seq=stored.seq(1), at=at, logical_action=logical_action,
                                          outcome=_A.UNKNOWN, note=note)]
        else:
            return None
        events.append(ev.ReconciliationStarted(seq=stored.seq(len(events) + 1), at=at,
                                               logical_action=logical_action))
        tool = _tool(registry, stored, row.tool)
        if tool is None or tool.lookup is None:
            verdict = _without_lookup(row.tool, EffectKind(row.effect_kind), known=tool is not None)
            await _record(conn, stored, events, logical_action, row.idempotency_key, row.tool, verdict, at=at)
            assert verdict.outcome is not None
            return verdict.outcome
        after = await runs.append(conn, stored, events)
        await ledger.record(conn, row.idempotency_key, _A.RECONCILING, last_error=None)
        await effects.broadcast(conn, stored.snapshot, after, producer=PRODUCER,
                                cause=f"reconciler:{row.idempotency_key}")
        return _Claim(run_id, logical_action, row.idempotency_key, row.request, tool, events[-1].seq)


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


async def _keep(found: ToolResult, artifacts: ArtifactStore | None) -> _Receipt:
    """The worker's rule for receipts, so both writers leave the same shape behind."""
    receipt = dict(found.receipt)
    body = json.dumps(receipt, sort_keys=True).encode()
    if artifacts is None or len(body) <= INLINE_LIMIT:
        return _Receipt(receipt, None, len(body))
    # Uploaded before the transaction that references it, so a committed reference never dangles.
    ref = await artifacts.put(body)
    return _Receipt({"artifact": ref, "size": len(body), "external_id": found.external_id}, ref, len(body))


async def _settle(engine: AsyncEngine, claim: _Claim, verdict: Verdict, *, clock: Callable[[], float],
                  artifacts: ArtifactStore | None) -> str:
    receipt = None
    if verdict.outcome is _A.CONFIRMED and verdict.found is not None:
        receipt = await _keep(verdict.found, artifacts)
    async with engine.begin() as conn:
        stored = await runs.load(conn, claim.run_id, lock=True)
        assert stored is not None, "a claimed action's run exists"
        latest = (await conn.execute(
            select(func.max(run_events.c.seq))
            .where(run_events.c.run_id == claim.run_id, run_events.c.type == ev.ReconciliationStarted.type,
                   run_events.c.data["logical_action"].astext == claim.logical_action))).scalar()
        status = (await conn.execute(select(actions.c.status)
                                     .where(actions.c.idempotency_key == claim.idempotency_key))).scalar()
        # Another claim started since, or an operator settled the action meanwhile: theirs stands.
        if latest != claim.started_seq or status != _A.RECONCILING.value:
            logger.info("run %s: the claim of %s at seq %d was superseded (latest claim %s, action %s); "
                        "its outcome is dropped", claim.run_id, claim.logical_action, claim.started_seq, latest,
                        status)
            return "superseded"
        if verdict.outcome is None:
            # Touching the row restarts the abandonment clock: the next attempt waits abandoned_after.
            await ledger.record(conn, claim.idempotency_key, _A.RECONCILING, last_error=verdict.note)
            logger.warning("run %s: %s stays RECONCILING: %s", claim.run_id, claim.logical_action, verdict.note)
            return "deferred"
        if receipt is not None and receipt.ref is not None:
            assert artifacts is not None
            await register(conn, artifacts, receipt.ref, size=receipt.size, media_type="application/json",
                           run_id=claim.run_id)
        await _record(conn, stored, [], claim.logical_action, claim.idempotency_key, claim.tool.name, verdict,
                      at=clock(), receipt=receipt)
        return verdict.outcome.value


async def _record(conn: AsyncConnection, stored: StoredRun, claim_events: Sequence[ev.RunEvent],
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
    after = await runs.append(conn, stored, events)
    fields: dict[str, Any] = {"last_error": verdict.note if verdict.outcome is _A.NEEDS_ATTENTION else None}
    if found is not None and receipt is not None:
        fields.update(external_id=found.external_id, receipt=receipt.value, receipt_ref=receipt.ref)
    await ledger.record(conn, key, verdict.outcome, **fields)
    await effects.broadcast(conn, stored.snapshot, after, producer=PRODUCER, cause=f"reconciler:{key}")
    # A cancelling run waits for its actions to settle before it can finish: it has work again too.
    if after.snapshot.status in (RunStatus.READY, RunStatus.CANCELLING):
        await effects.wake(conn, after, reason=f"reconciled {logical_action}", producer=PRODUCER)
    logger.info("run %s: %s reconciled %s (%s)", stored.snapshot.run_id, logical_action, verdict.outcome.value,
                verdict.note)


def _status_after(stored: StoredRun, events: Sequence[ev.RunEvent]) -> RunStatus:
    snapshot = stored.snapshot
    for event in events:
        snapshot = evolve(snapshot, event)
    return snapshot.status


# -- expired leases --------------------------------------------------------------------------------


_EXPIRED = "lease_owner IS NOT NULL AND lease_until < now()"
_CLEAR_EXPIRED = text(
    "UPDATE runs AS r SET lease_owner = NULL, lease_until = NULL "
    f"FROM (SELECT run_id, lease_owner, fencing_token FROM runs WHERE {_EXPIRED} "
    "      ORDER BY lease_until LIMIT :limit FOR UPDATE SKIP LOCKED) AS e "
    "WHERE r.run_id = e.run_id "
    "RETURNING r.run_id, e.lease_owner, e.fencing_token")
_CLEAR_ONE_EXPIRED = text(
    "UPDATE runs AS r SET lease_owner = NULL, lease_until = NULL "
    f"FROM (SELECT run_id, lease_owner, fencing_token FROM runs WHERE {_EXPIRED} "
    "        AND run_id <> ALL(CAST(:failed AS text[])) "
    "      ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED) AS e "
    "WHERE r.run_id = e.run_id "
    "RETURNING r.run_id, e.lease_owner, e.fencing_token")


_NEXT_EXPIRY = text("SELECT extract(epoch FROM min(lease_until) - now()) FROM runs WHERE lease_owner IS NOT NULL")


async def seconds_until_a_lease_expires(engine: AsyncEngine) -> float | None:
    """Seconds (database clock) until the earliest held lease runs out; <= 0 when one has, None when none is held."""
    async with engine.connect() as conn:
        seconds = (await conn.execute(_NEXT_EXPIRY)).scalar()
    return None if seconds is None else float(seconds)


async def rewake_expired_leases(engine: AsyncEngine, *, limit: int) -> int:
    """Clear up to ``limit`` expired leases, waking each run a worker has work for; returns the wakeups.

    The lease is cleared in the transaction that enqueues the wakeup, so each expiry wakes
    the run once and the next sweep no longer sees it. Clearing is safe: the old holder's
    writes and renewals need its owner and fencing token, which no longer match, and the
    next ``take_lease`` bumps the token. Expired leases of finished or parked runs are
    cleared without a wakeup.

    A dead worker leaves many leases expiring together, and every one of them delays its run,
    so they are cleared in one statement and woken with one outbox insert; only if that
    transaction fails for another reason than the database being away is the sweep redone run
    by run, so one run that cannot be woken does not hold up the others.
    """
    try:
        async with engine.begin() as conn:
            expired = (await conn.execute(_CLEAR_EXPIRED, {"limit": limit})).all()
            if not expired:
                return 0
            stored = await runs.load_many(conn, [row.run_id for row in expired])
            woken = [stored[row.run_id] for row in expired if stored[row.run_id].snapshot.status in _WAKEABLE]
            await outbox.enqueue_many(conn, [effects.wake_message(s, reason="lease expired", producer=PRODUCER)
                                             for s in woken])
    except Exception as e:
        if is_transient(e):
            raise
        logger.warning("re-waking expired leases together failed (%r); run by run", e)
        return await _rewake_one_by_one(engine, limit=limit)
    for row in expired:
        _count_expiry(row, stored[row.run_id], wake=stored[row.run_id].snapshot.status in _WAKEABLE)
    return len(woken)


async def _rewake_one_by_one(engine: AsyncEngine, *, limit: int) -> int:
    woken = 0
    failed: set[str] = set()
    for _ in range(limit):
        current: str | None = None
        try:
            async with engine.begin() as conn:
                row = (await conn.execute(_CLEAR_ONE_EXPIRED, {"failed": sorted(failed)})).first()
                if row is None:
                    break
                current = row.run_id
                stored = await runs.load(conn, row.run_id)
                assert stored is not None
                wake = stored.snapshot.status in _WAKEABLE
                if wake:
                    await effects.wake(conn, stored, reason="lease expired", producer=PRODUCER)
        except Exception as e:
            if is_transient(e) or current is None:
                raise
            logger.exception("run %s: could not re-wake after its lease expired; skipped this sweep", current)
            failed.add(current)
            continue
        _count_expiry(row, stored, wake=wake)
        woken += wake
    return woken


def _count_expiry(row: Any, stored: StoredRun, *, wake: bool) -> None:
    METRICS["lease.expired"] += 1
    if wake:
        METRICS["lease.rewoken"] += 1
    logger.info("run %s: lease %d of %s expired (%s)%s", row.run_id, row.fencing_token, row.lease_owner,
                stored.snapshot.status.value, "; woken" if wake else "")


# -- silent runs -----------------------------------------------------------------------------------


async def flag_silent_runs(engine: AsyncEngine, *, limits: Mapping[RunStatus, float], limit: int = 200) -> int:
    """One alert per run and status episode past its limit; returns the alerts raised.

    An episode is (status, ``status_since``): entering the status again starts a new one.
    A run whose worker holds a live lease is being worked on, so it is not silent.
    """
    if not limits:
        return 0
    since = runs_table.c.snapshot["status_since"].astext
    episode = runs_table.c.status + "@" + since
    now = func.date_part("epoch", func.now())
    late = [and_(runs_table.c.status == RunStatus(status).value, since.cast(Float) < now - seconds)
            for status, seconds in limits.items()]
    async with engine.connect() as conn:
        rows = (await conn.execute(
            select(runs_table.c.run_id, runs_table.c.status, since.label("since"), episode.label("episode"),
                   (now - since.cast(Float)).label("silent_for"))
            .where(or_(*late),
                   or_(runs_table.c.lease_owner.is_(None), runs_table.c.lease_until < func.now()),
                   ~exists().where(audit_log.c.action == SILENT_ALERT, audit_log.c.target == runs_table.c.run_id,
                                   audit_log.c.details["episode"].astext == episode))
            .order_by(since.cast(Float)).limit(limit))).all()
    raised = 0
    for row in rows:
        status = RunStatus(row.status)
        reason = (f"{status.value} for {float(row.silent_for):.0f}s with no worker on it "
                  f"(limit {limits[status]:.0f}s)")
        async with engine.begin() as conn:
            if not await _alert_once(conn, SILENT_ALERT, row.run_id, row.episode, reason,
                                     {"status": status.value, "since": float(row.since),
                                      "limit_seconds": limits[status]}):
                continue
        raised += 1
        METRICS[f"{SILENT_ALERT}.{status.value}"] += 1
        logger.warning("run %s is silent: %s", row.run_id, reason)
    return raised


async def _alert_once(conn: AsyncConnection, action: str, target: str, episode: str, reason: str,
                      details: Mapping[str, Any]) -> bool:
    """Write the alert unless this episode already has one; False when it had."""
    # Held to commit: a replica raising the same alert waits, then sees this row and stops.
    await conn.execute(text("SELECT pg_advisory_xact_lock(CAST(:ns AS integer), hashtext(:key))"),
                       {"ns": _ALERT_LOCK_NAMESPACE, "key": f"{action}:{target}"})
    raised = (await conn.execute(
        select(audit_log.c.id).where(audit_log.c.action == action, audit_log.c.target == target,
                                     audit_log.c.details["episode"].astext == episode).limit(1))).first()
    if raised is not None:
        return False
    await audit(conn, actor=PRODUCER, action=action, target=target, reason=reason,
                details={"episode": episode, **details})
    return True


# -- drift -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriftSweep:
    checked: int
    drifted: int
    next_after: str
    """The action id the next sweep continues after; "" once the last confirmed action was reached."""


async def check_drift(engine: AsyncEngine, registry: Registry, *, limit: int, after: str = "") -> DriftSweep:
    """Compare up to ``limit`` confirmed actions (ids after ``after``) with the far side.

    Drift is identity, not content: far-side objects legitimately change (a branch head
    moves, a merge request is merged), so only a missing object or another external id for
    the same key is reported, once per action and problem. A lookup that fails is skipped.
    """
    async with engine.connect() as conn:
        rows = (await conn.execute(
            select(actions.c.action_id, actions.c.run_id, actions.c.logical_action, actions.c.tool,
                   actions.c.idempotency_key, actions.c.external_id, runs_table.c.workflow,
                   runs_table.c.workflow_version)
            .join_from(actions, runs_table, actions.c.run_id == runs_table.c.run_id)
            .where(actions.c.status == _A.CONFIRMED.value, actions.c.action_id > after)
            .order_by(actions.c.action_id).limit(limit))).all()
    checks = []
    for row in rows:
        try:
            tool = registry.get(row.workflow, row.workflow_version).tools.get(row.tool)
        except LookupError:
            continue
        if tool is not None and tool.lookup is not None:
            checks.append((row, tool))
    problems = await asyncio.gather(*(_drift(tool, row.idempotency_key, row.external_id) for row, tool in checks))
    drifted = 0
    for (row, tool), problem in zip(checks, problems, strict=True):
        if problem is None:
            continue
        reason = f"{row.logical_action} ({tool.name}, key {row.idempotency_key}): {problem}"
        async with engine.begin() as conn:
            if not await _alert_once(conn, DRIFT_ALERT, row.run_id, f"{row.logical_action}: {problem}", reason,
                                     {"logical_action": row.logical_action, "tool": tool.name,
                                      "idempotency_key": row.idempotency_key,
                                      "recorded_external_id": row.external_id}):
                continue
        drifted += 1
        METRICS[DRIFT_ALERT] += 1
        logger.warning("run %s drifted: %s", row.run_id, reason)
    return DriftSweep(len(checks), drifted, rows[-1].action_id if len(rows) == limit else "")


async def _drift(tool: Tool, key: str, recorded_id: str | None) -> str | None:
    assert tool.lookup is not None
    try:
        found = await asyncio.wait_for(tool.lookup(key), timeout=tool.timeout)
    except Exception as e:
        logger.info("drift check of %s skipped: lookup failed (%s: %s)", key, e.__class__.__name__, e)
        return None
    if found is None:
        return "missing: the far side has nothing under the idempotency key"
    if recorded_id is not None and found.external_id != recorded_id:
        return f"different id: recorded {recorded_id}, the far side has {found.external_id}"
    return None


# -- dead letters ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Death:
    """What the broker's ``x-death`` / ``x-first-death-*`` headers say about a dead letter."""

    reason: str
    queue: str
    count: int
    first: datetime | None
    last: datetime | None


async def ingest_quarantine_queue(bus: Bus, engine: AsyncEngine, *, delivery_limit: int | None = None,
                                  prefetch: int = QUARANTINE_PREFETCH) -> None:
    """Consume ``longrun.quarantine`` until cancelled; a message is acked only after its row committed.

    ``delivery_limit`` (the work queues' limit) turns a delivery-limit death into an attempt
    count. After a lost connection the consumer reconnects and resumes; a redelivered
    message is recognised by the inbox and acked without a second row.
    """
    while True:
        await bus.ensure_connected()
        lost = asyncio.ensure_future(bus.lost.wait())
        channel: AbstractChannel | None = None
        try:
            channel = await bus.channel(prefetch=prefetch)
            deliveries: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            await (await channel.get_queue(QUARANTINE_QUEUE, ensure=False)).consume(deliveries.put)
            while True:
                next_delivery = asyncio.ensure_future(deliveries.get())
                await asyncio.wait({next_delivery, lost}, return_when=asyncio.FIRST_COMPLETED)
                if not next_delivery.done():
                    next_delivery.cancel()
                    break
                await _ingest(engine, next_delivery.result(), delivery_limit)
        except (aiormq.exceptions.AMQPError, aio_pika.exceptions.ChannelInvalidStateError, ConnectionError) as e:
            logger.warning("quarantine consumer lost its channel (%r); reconnecting", e)
            bus.lost.set()
        finally:
            lost.cancel()
            # Closing hands every unacked delivery back to the queue at once, not at disconnect.
            if channel is not None and not channel.is_closed:
                try:
                    await asyncio.shield(channel.close())
                except Exception as e:
                    logger.debug("closing the quarantine channel: %r", e)


async def _ingest(engine: AsyncEngine, message: AbstractIncomingMessage, delivery_limit: int | None) -> None:
    headers = dict(message.headers or {})
    death = _read_death(headers)
    body_id = message.message_id or hashlib.sha256(message.body).hexdigest()
    last = death.last.isoformat() if death.last else "-"
    inbox_id = f"quarantine:{death.queue}:{body_id}:{last}:{death.count}"
    attempts = death.count * (delivery_limit + 1) if delivery_limit and death.reason == "delivery_limit" \
        else death.count
    reason = f"dead-lettered by the broker from {death.queue}: {death.reason}"
    if death.reason == "delivery_limit":
        reason += " (delivered past the queue's limit without an ack: its consumer kept failing on it)"
    while True:
        try:
            async with engine.begin() as conn:
                claim = await inbox.claim(conn, PRODUCER, message_id=inbox_id, message_type=message.type or "unknown",
                                          run_id=_text(headers.get("cloudEvents:subject")))
                if isinstance(claim, inbox.Claimed):
                    entry = await quarantine_rows.put(
                        conn, owner=_owner(death.queue), queue=death.queue, body=message.body,
                        headers=_json_safe(headers), message_id=message.message_id, error_code=death.reason,
                        reason=reason, attempts=attempts, first_failure_at=death.first)
                    if death.last is not None:
                        await conn.execute(update(quarantine).where(quarantine.c.id == entry)
                                           .values(last_failure_at=death.last))
                    if message.type == "run.wakeup" and death.reason == "delivery_limit":
                        await _rewake_dead_lettered(conn, _text(headers.get("cloudEvents:subject")))
                    await inbox.record_outcome(conn, PRODUCER, message_id=inbox_id, outcome={"quarantine_id": entry})
            break
        except Exception as e:
            if not is_transient(e):
                # Never drop a dead letter: hand it back to the queue and try again later.
                logger.exception("could not keep dead letter %s; returned to %s", body_id, QUARANTINE_QUEUE)
                await asyncio.sleep(INGEST_RETRY_DELAY)
                await message.nack(requeue=True)
                return
            logger.warning("database unavailable keeping dead letter %s (%r); retrying", body_id, e)
            await asyncio.sleep(INGEST_RETRY_DELAY)
    if isinstance(claim, inbox.Claimed):
        METRICS["quarantine.kept"] += 1
        logger.error("dead letter %s from %s kept in quarantine: %s", body_id, death.queue, death.reason)
    try:
        await message.ack()
    except Exception as e:
        # The channel is gone: the broker redelivers, and the inbox absorbs the copy.
        logger.warning("ack of dead letter %s failed (%r); the redelivery will be deduplicated", body_id, e)


async def _rewake_dead_lettered(conn: AsyncConnection, run_id: str | None) -> None:
    """Wake a run again whose wakeup hit the delivery limit, a few times at most.

    A wakeup names its run and carries no state, and a worker killed or cut off with it
    prefetched counts as a delivery: under repeated worker deaths a valid wakeup is
    dead-lettered and its run, unleased, would wait forever. A fresh wakeup starts its count
    anew. One that itself kills every worker keeps coming back, so after
    ``REWAKES_AFTER_DEAD_LETTER`` of them the run is left to an operator (the quarantine list).
    """
    if run_id is None:
        return
    stored = await runs.load(conn, run_id)
    if stored is None or stored.snapshot.status not in _WAKEABLE or stored.lease_owner is not None:
        return  # ended, parked (its own wake condition holds), or leased (the lease sweep wakes it)
    dead = (await conn.execute(
        select(func.count()).select_from(quarantine)
        .where(quarantine.c.message_type == "run.wakeup",
               quarantine.c.headers["cloudEvents:subject"].astext == run_id))).scalar_one()
    if dead > REWAKES_AFTER_DEAD_LETTER:
        logger.error("run %s: %d wakeups dead-lettered; left to an operator", run_id, dead)
        return
    await effects.wake(conn, stored, reason="wakeup dead-lettered", producer=PRODUCER)
    METRICS["quarantine.rewoken"] += 1
    logger.warning("run %s: its wakeup was dead-lettered (%d so far); woken again", run_id, dead)


def _read_death(headers: Mapping[str, Any]) -> _Death:
    deaths = [d for d in headers.get("x-death") or () if isinstance(d, Mapping)]
    latest = deaths[0] if deaths else {}
    times = [d["time"] for d in deaths if isinstance(d.get("time"), datetime)]
    return _Death(
        reason=_text(headers.get("x-first-death-reason")) or _text(latest.get("reason")) or "unknown",
        queue=_text(headers.get("x-first-death-queue")) or _text(latest.get("queue")) or "unknown",
        count=sum(int(d.get("count") or 1) for d in deaths) or 1,
        first=min(times) if times else None,
        last=max(times) if times else None,
    )


def _owner(queue: str) -> str:
    """The service whose queue it was: ``longrun.<service>.<lane>``."""
    parts = queue.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "longrun" else queue


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _json_safe(value: Any) -> Any:
    """AMQP header values (nested tables, bytes, timestamps, decimals) as JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


async def _isolated(work: Any, what: str) -> Any:
    """One item's failure is logged and skipped, so it cannot stall the rest of the sweep."""
    try:
        return await work
    except Exception as e:
        if is_transient(e):
            raise
        logger.exception("%s failed; left for a later sweep", what)
        return None
