"""Runs and their events: the store behind every run transition (their leases: ``db.leases``).

A transition is ONE statement: the update of ``runs`` guarded by the expected revision
and stored seq (and, for a worker, its lease owner and fencing token), with its
``run_events`` rows and what rides along (a first ledger row, outbox messages, NOTIFYs)
inserted by the same statement only if the update matched. Zero rows updated means
someone moved first: ``LeaseLost`` if the fence no longer matches, else
``StaleRevision``; nothing is written. Being one statement, a transition is atomic on
its own: a caller with nothing else to write runs it outside a transaction (no BEGIN and
COMMIT round trips, which cost a step more than the statement itself). Events that
arrive after the run moved past them are stored as late (``applied = false``) and never
change the snapshot.

The ``runs`` columns next to ``snapshot`` are projections of it for queries and
constraints; ``last_seq`` is the highest *stored* seq (late events included), while
the snapshot's ``last_seq`` is the highest *applied* one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun import metrics
from longrun.db import admission, driver, handover, jsonb, keys, outbox, tenant_limits
from longrun.db import children as child_rows
from longrun.db.actions import first_row as ledger_first_row
from longrun.db.schema import actions, run_events, runs, sql_names
from longrun.domain import (
    PinnedVersions,
    RunSnapshot,
    calls,
    children,
    closure,
    evolve,
    queue_stint_starts,
)
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim
from longrun.errors import LeaseLost, StaleRevision
from longrun.ports.runs import AtOnce, Fence, Found, LedgerRequest, Planned, Rides, StoredRun, TenantCharge, plan


def ts(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def projection(snapshot: RunSnapshot) -> dict[str, Any]:
    wait = snapshot.wait
    plain = snapshot.to_dict()
    return {
        "status": snapshot.status.value,
        "revision": snapshot.revision,
        "priority": snapshot.priority,
        "wait_kind": wait.kind if wait else None,
        "wait_correlation_key": wait.correlation_key if wait else None,
        "wait_deadline": ts(wait.deadline) if wait else None,
        "approval_id": wait.approval_id if wait else None,
        "approval_owner": wait.owner if wait else None,
        "approved_hash": wait.approved_hash if wait else None,
        "budget": plain["budget"],
        "cancel_requested": snapshot.cancel_requested,
        "snapshot": plain,
    }


# Hot statements are built once and compiled once for psycopg, which sends them (db/driver.py).
_PROJECTED = ("status", "revision", "priority", "wait_kind", "wait_correlation_key", "wait_deadline",
              "approval_id", "approval_owner", "approved_hash", "budget", "cancel_requested", "snapshot")


_EVENT_COLUMNS = "run_id, seq, event_id, type, data, applied, fencing_token, occurred_at"
_ACTION_COLUMNS = tuple(c.name for c in actions.columns
                        if c.name not in ("created_at", "updated_at", "progress", "heartbeat_at"))


# Closure: the open timers of the wait and of the calls a transition ended (or, with neither
# named, of the run, but a child's end it has yet to record). A timer the timer service holds is
# waited for (its batch commits in milliseconds), then cancelled unless it fired meanwhile.
ENDED_TIMERS = ("((CAST({every} AS boolean) AND {t}.kind <> '" + children.ENDED_TIMER + "') "
                "OR {t}.payload ->> 'wait_id' = CAST({wait} AS text) "
                f"OR ({{t}}.kind IN ({sql_names(calls.CALL_TIMERS)}) AND {{t}}.payload ->> 'logical_action' IN "
                "(SELECT jsonb_array_elements_text(CAST({calls} AS jsonb)))))")
_CANCEL_TIMERS = ("UPDATE timers SET cancelled_at = now() FROM moved WHERE timers.run_id = moved.run_id "
                  "AND timers.fired_at IS NULL AND timers.cancelled_at IS NULL AND "
                  + ENDED_TIMERS.format(t="timers", every=":c_all", wait=":c_wait", calls=":c_calls"))


# A run that finished owing its cleanup (``domain.cleanup.starts``) is due for the reconciler at once.
OWE_CLEANUP = "INSERT INTO cleanups (run_id) SELECT run_id FROM {source} ON CONFLICT (run_id) DO NOTHING"


DEADLINE_TIMER_SUFFIX = ":business_deadline"
"""A run's business deadline timer is ``<run_id>:business_deadline``."""
QUEUE_TIMER_SUFFIX = ":schedule_to_start:"
"""The timer of a run's queue stint starting at revision r is ``<run_id>:schedule_to_start:<r>``."""


def queue_timer_sql(source: str) -> str:
    """The ``schedule_to_start`` timer of the queue stint a write starts (``domain.queue_stint_starts``),
    for the run ``source`` returns: due ``:q_seconds`` from now (database clock), naming the revision
    the stint starts at; a repeated write of the same stint schedules nothing more."""
    return ("INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
            f"SELECT {source}.run_id || :q_suffix || CAST(:q_revision AS text), {source}.run_id, 'schedule_to_start', "
            "now() + make_interval(secs => CAST(:q_seconds AS double precision)), "
            f"jsonb_build_object('revision', CAST(:q_revision AS bigint)) FROM {source} "
            "ON CONFLICT (timer_key) DO NOTHING")


def queue_params(snapshot: RunSnapshot) -> dict[str, Any]:
    return {"q_suffix": QUEUE_TIMER_SUFFIX, "q_revision": snapshot.revision,
            "q_seconds": snapshot.timeouts.schedule_to_start}


def _cancelling(cancel: closure.Cancel) -> dict[str, Any]:
    return {"c_all": cancel.everything, "c_wait": cancel.wait_id, "c_calls": jsonb.dumps(list(cancel.calls))}


def _tenant_charging(charge: TenantCharge) -> dict[str, Any]:
    return {"g_tenant": charge.tenant_id, "g_tokens": charge.tokens, "g_cost": charge.cost, "g_period": charge.period,
            "g_tokens_default": charge.tokens_default, "g_cost_default": charge.cost_default}


@dataclass(frozen=True)
class _Part:
    """A piece of the transition statement: a guard on the run's row, columns it sets, CTEs that
    write only if the row moved, and the names of CTEs whose row counts the statement returns."""

    guard: str = ""
    sets: str = ""
    ctes: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    """Parameters typed by a column: ``a_<column>`` of ``actions``."""
    counted: tuple[str, ...] = ()


_ACTION_VALUES = ", ".join("moved.run_id" if c == "run_id" else f":a_{c}" for c in _ACTION_COLUMNS)
def _parts() -> dict[str, _Part]:
    """Every part a transition statement may hold, by name, in the order they are written (made for
    each statement compiled, from the admission rules as they are then)."""
    return {
        "fenced": _Part(guard=" AND lease_owner = :f_owner AND fencing_token = :f_token"),
        "release": _Part(sets=", lease_owner = NULL, lease_until = NULL"),
        "call": _Part(ctes=(f"ledger AS (INSERT INTO actions ({', '.join(_ACTION_COLUMNS)}) "
                            f"SELECT {_ACTION_VALUES} FROM moved)",),
                      binds=tuple(c for c in _ACTION_COLUMNS if c != "run_id")),
        "messages": _Part(ctes=(f"sent AS ({outbox.insert_sql('moved, ' + outbox.from_param('messages'))})",)),
        # A lease holder's messages, which it publishes itself after the commit where nothing is ahead of them.
        "eager_messages": _Part(ctes=(
            f"sent AS ({outbox.eager_insert_sql('moved, ' + outbox.from_param('messages'))})",)),
        "notices": _Part(ctes=("told AS (SELECT pg_notify(n.channel, n.payload) FROM moved, "
                               "jsonb_to_recordset(CAST(:notices AS jsonb)) AS n(channel text, payload text))",),
                         counted=("told",)),
        "handover": _Part(ctes=tuple(handover.ctes(handover.FINISHED_FREES)), counted=("unfilled",)),
        # A run parked in a wait that holds no slot (``domain.slots``) is admitted no more: its slot
        # is handed on as a finished run's is.
        "unslot": _Part(sets=", admitted_at = NULL"),
        "parked_handover": _Part(ctes=tuple(handover.ctes(handover.PARKED_FREES)), counted=("unfilled",)),
        "cancel": _Part(ctes=(f"cancelled AS ({_CANCEL_TIMERS})",)),
        "cleanup": _Part(ctes=(f"owed AS ({OWE_CLEANUP.format(source='moved')})",)),
        "child_ended": _Part(ctes=(f"child_ended AS ({child_rows.ENDED.format(source='moved', report=':e_report')})",)),
        "tenant_charge": _Part(ctes=(f"tenant_charged AS ({tenant_limits.charge_sql('moved')})",)),
        "queued": _Part(ctes=(f"queued AS ({queue_timer_sql('moved')})",)),
        "timed": _Part(ctes=("timed AS (INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
                             "SELECT t.timer_key, moved.run_id, t.kind, now() + make_interval(secs => t.delay), t.payload "
                             "FROM moved, jsonb_to_recordset(CAST(:timers AS jsonb)) "
                             "AS t(timer_key text, kind text, delay float8, payload jsonb) "
                             "ON CONFLICT (timer_key) DO NOTHING)",)),
    }


@functools.cache
def _compile(names: tuple[str, ...]) -> driver.Statement:
    """The transition statement made of the parts ``names`` (compiled once per combination)."""
    parts = [_parts()[name] for name in names]
    guard = "run_id = :b_run_id AND revision = :b_revision AND last_seq = :b_last_seq" + "".join(p.guard for p in parts)
    sets = ", ".join(f"{c} = :{c}" for c in (*_PROJECTED, "last_seq")) + "".join(p.sets for p in parts)
    token = "CAST(:f_token AS bigint)" if "fenced" in names else "NULL"
    ctes = [
        f"moved AS (UPDATE runs SET {sets}, updated_at = now() WHERE {guard} "
        "RETURNING run_id, admitted_at, concurrency_key, concurrency_held_at)",
        f"stored AS (INSERT INTO run_events ({_EVENT_COLUMNS}) "
        f"SELECT moved.run_id, e.seq, moved.run_id || ':' || e.seq, e.data ->> 'type', e.data, e.applied, {token}, "
        f"e.occurred_at FROM moved, jsonb_to_recordset(CAST(:events AS jsonb)) "
        f"AS e(seq bigint, data jsonb, applied boolean, occurred_at timestamptz))",
        *(cte for p in parts for cte in p.ctes)]
    # A CTE that only reads runs only when referenced: the NOTIFYs are counted to be sent.
    counted = "".join(f", (SELECT count(*) FROM {name}) AS {name}" for p in parts for name in p.counted)
    if "eager_messages" in names:
        counted += ", (SELECT array_agg(CASE WHEN eager THEN id END ORDER BY id) FROM sent) AS eager"
    binds = [bindparam(name, type_=runs.c[name].type) for name in _PROJECTED]
    binds.append(bindparam("events", type_=run_events.c.data.type))
    binds += [bindparam(f"a_{c}", type_=actions.c[c].type) for p in parts for c in p.binds]
    return driver.Statement(
        text(f"WITH {', '.join(ctes)} SELECT (SELECT count(*) FROM moved) AS moved{counted}").bindparams(*binds))


_FENCE_NOW = driver.Statement(
    select(runs.c.lease_owner, runs.c.fencing_token).where(runs.c.run_id == bindparam("run_id")))


_CREATED_COLUMNS = ("run_id", "tenant_id", "idempotency_key", "input_hash", "workflow", "workflow_version",
                    "prompt_version", "model_policy_version", "tool_schema_version", "partition", "last_seq",
                    "trace_root", *_PROJECTED)


@functools.cache
def _create(*, at_once: bool, announce: bool, labelled: bool, timed: bool = False,
            queued: bool = False, keyed: bool = False) -> driver.Statement:
    """The run row and its first event in one statement, the event only if the row was new; with
    ``AtOnce``, its admission too; with ``announce``, messages sent only if the row was new; with
    ``labelled``, its labels' rows; with ``timed``, its business deadline's timer; with ``queued``, its
    schedule-to-start (the column, and the first queue stint's timer); with ``keyed``, its concurrency
    key, admitted at once only while the key has room."""
    columns, values, source = list(_CREATED_COLUMNS), [f":{c}" for c in _CREATED_COLUMNS], ""
    if queued:
        columns.append("schedule_to_start")
        values.append("CAST(:q_seconds AS double precision)")
    if keyed:
        columns += ["concurrency_key", "concurrency_limit"]
        values += ["CAST(:k_key AS text)", "CAST(:k_limit AS smallint)"]
    parts = []
    if at_once:
        parts.append(f"tenant AS ({admission.tenant_slots(':tenant_id')}{keys.CREATED_KEY_FREE if keyed else ''})")
        admit = ("tenant.active < tenant.slots AND NOT tenant.waiting AND NOT tenant.spent"
                 + (" AND tenant.key_free" if keyed else ""))
        columns.append("admitted_at")
        values.append(f"CASE WHEN {admit} THEN now() END")
        if keyed:
            columns.append("concurrency_held_at")
            values.append(f"CASE WHEN {admit} THEN now() END")
        source = " FROM tenant"
    parts += [
        f"made AS (INSERT INTO runs ({', '.join(columns)}) SELECT {', '.join(values)}{source} "
        "ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING run_id, admitted_at)",
        "first AS (INSERT INTO run_events (run_id, seq, event_id, type, data, applied, occurred_at) "
        "SELECT made.run_id, :e_seq, made.run_id || :e_suffix, :e_type, :e_data, true, :e_occurred_at FROM made)"]
    if announce:
        parts.append(f"announced AS ({outbox.insert_sql('made, ' + outbox.from_param('announce'))})")
    if labelled:
        parts.append("labelled AS (INSERT INTO run_labels (run_id, tenant_id, key, value) "
                     "SELECT made.run_id, :tenant_id, l.key, l.value "
                     "FROM made, jsonb_each_text(CAST(:labels AS jsonb)) AS l)")
    if timed:
        parts.append("timed AS (INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
                     "SELECT made.run_id || :deadline_suffix, made.run_id, 'business_deadline', "
                     "now() + make_interval(secs => CAST(:deadline_in AS double precision)), '{}'::jsonb FROM made)")
    if queued:
        parts.append(f"queued AS ({queue_timer_sql('made')})")
    counted = ""
    if at_once:
        wakeup = ("(SELECT r.row, r.n FROM made, jsonb_array_elements(CAST(:wakeup AS jsonb)) WITH ORDINALITY "
                  "AS r(row, n) WHERE made.admitted_at IS NOT NULL) AS r")
        parts += [f"woken AS ({outbox.insert_sql(wakeup)})",
                  "told AS (SELECT pg_notify(:channel, :tenant_id) FROM made, tenant "
                  "WHERE made.admitted_at IS NULL AND tenant.active < tenant.slots AND tenant.waiting "
                  "AND NOT tenant.spent)"]
        counted = (", (SELECT count(*) FROM made WHERE admitted_at IS NOT NULL) AS admitted, "
                   "(SELECT count(*) FROM told) AS told")
    binds = [bindparam(name, type_=runs.c[name].type) for name in _CREATED_COLUMNS]
    binds += [bindparam("e_data", type_=run_events.c.data.type),
              bindparam("e_occurred_at", type_=run_events.c.occurred_at.type)]
    return driver.Statement(
        text(f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM made) AS made{counted}").bindparams(*binds))


async def create(conn: driver.Connection, created: ev.RunCreated, *, idempotency_key: str, input_hash: str,
                 partition: int, at_once: AtOnce | None = None,
                 announce: Sequence[outbox.Message] = (), trace_root: str | None = None,
                 key: KeyClaim | None = None) -> StoredRun | None:
    """Insert a run with its first event, its labels, its business deadline's timer and its first queue
    stint's (schedule-to-start); None when (tenant, idempotency_key) exists. ``trace_root``: the
    traceparent of the run's root span. ``key``: its concurrency key.

    With ``at_once``, the run is admitted in the same statement when ``AtOnce`` allows it;
    ``announce`` is sent only if the run is new."""
    snapshot = evolve(None, created)
    params: dict[str, Any] = {
        "run_id": created.run_id, "tenant_id": created.tenant_id, "idempotency_key": idempotency_key,
        "input_hash": input_hash, "workflow": created.kind, "workflow_version": created.versions.workflow,
        "prompt_version": created.versions.prompt, "model_policy_version": created.versions.model_policy,
        "tool_schema_version": created.versions.tool_schemas, "partition": partition,
        "last_seq": created.seq, "trace_root": trace_root, **projection(snapshot),
        "e_seq": created.seq, "e_suffix": f":{created.seq}", "e_type": created.type,
        "e_data": ev.event_to_dict(created), "e_occurred_at": ts(created.at)}
    if at_once is not None:
        params.update(slots=at_once.slots, channel=at_once.channel, wakeup=outbox.rows_json([at_once.wakeup]))
    if announce:
        params["announce"] = outbox.rows_json(announce)
    if created.labels:
        params["labels"] = jsonb.dumps(dict(created.labels))
    if created.deadline is not None:
        # Counted from the database's clock, as every timer is (``timers.schedule``).
        params.update(deadline_suffix=DEADLINE_TIMER_SUFFIX, deadline_in=created.deadline - created.at)
    queued = queue_stint_starts(None, snapshot)
    if queued:
        params.update(queue_params(snapshot))
    if key is not None:
        params.update(k_key=key.key, k_limit=key.limit)
    statement = _create(at_once=at_once is not None, announce=bool(announce), labelled=bool(created.labels),
                        timed=created.deadline is not None, queued=queued, keyed=key is not None)
    row = await driver.one(conn, statement, params)
    if not row.made:
        return None
    return StoredRun(snapshot, created.seq, partition, None, None, 0,
                     admitted=at_once is not None and bool(row.admitted))


COLUMNS = (runs.c.snapshot, runs.c.last_seq, runs.c.partition, runs.c.lease_owner, runs.c.lease_until,
            runs.c.fencing_token, runs.c.admitted_at, runs.c.trace_root)
_LOAD = select(*COLUMNS).where(runs.c.run_id == bindparam("run_id"))
_LOAD_ONE = driver.Statement(_LOAD)
_LOAD_LOCKED = driver.Statement(_LOAD.with_for_update())


def stored_run(row: Any) -> StoredRun:
    """A run as a statement returning ``COLUMNS`` read it."""
    return StoredRun(RunSnapshot.from_dict(row.snapshot), row.last_seq, row.partition, row.lease_owner,
                     row.lease_until, row.fencing_token, row.admitted_at is not None, trace_root=row.trace_root)


async def load(conn: driver.Connection, run_id: str, *, lock: bool = False) -> StoredRun | None:
    row = await driver.first(conn, _LOAD_LOCKED if lock else _LOAD_ONE, {"run_id": run_id})
    return None if row is None else stored_run(row)


_FIND = select(runs.c.run_id, runs.c.input_hash, runs.c.partition, runs.c.workflow, runs.c.workflow_version,
               runs.c.prompt_version, runs.c.model_policy_version, runs.c.tool_schema_version,
               runs.c.snapshot["labels"].label("labels"))


async def find(conn: AsyncConnection, tenant_id: str, idempotency_key: str) -> Found | None:
    """The run created under this key, if any."""
    row = (await conn.execute(_FIND.where(runs.c.tenant_id == tenant_id,
                                          runs.c.idempotency_key == idempotency_key))).first()
    if row is None:
        return None
    versions = PinnedVersions(row.workflow_version, row.prompt_version, row.model_policy_version,
                              row.tool_schema_version)
    return Found(row.run_id, row.input_hash, row.partition, row.workflow, versions, row.labels or {})


async def append(conn: driver.Connection, stored: StoredRun, events: Sequence[ev.RunEvent], *,
                 fence: Fence | None = None, release_lease: bool = False) -> StoredRun:
    """Apply ``events`` (seqs from ``stored.seq``) in one guarded statement; return the new state."""
    return await write(conn, plan(stored, events, release_lease=release_lease), fence=fence)


async def write(conn: driver.Connection, planned: Planned, *, fence: Fence | None = None,
                rides: Rides = Rides(), call: LedgerRequest | None = None) -> StoredRun:
    """Write a planned transition and what rides with it as one statement; return the new state.
    ``call``: a first ledger row (a key on the ledger already fails the statement: unique violation)."""
    after, _ = await write_eager(conn, planned, fence=fence, rides=rides, call=call)
    return after


async def write_eager(conn: driver.Connection, planned: Planned, *, fence: Fence | None = None,
                      rides: Rides = Rides(), call: LedgerRequest | None = None,
                      eager_grace: float | None = None) -> tuple[StoredRun, list[int | None]]:
    """``write``; with ``eager_grace`` (a lease holder's write), its messages are eager
    (``outbox.eager_insert_sql``) where nothing of their partition is unsent. Returned with the new
    state: per message, in order, its row's id if eager (the caller publishes it after the commit),
    else None; empty when none is."""
    stored = planned.before
    names: list[str] = []
    params: dict[str, Any] = {
        **projection(planned.after.snapshot), "last_seq": planned.after.stored_seq,
        "b_run_id": stored.snapshot.run_id, "b_revision": stored.snapshot.revision, "b_last_seq": stored.stored_seq,
        "events": [{"seq": event.seq, "data": ev.event_to_dict(event), "applied": applied,
                    "occurred_at": datetime.fromtimestamp(event.at, UTC).isoformat()}
                   for event, applied in planned.rows]}
    if fence is not None:
        names.append("fenced")
        params.update(f_owner=fence.owner, f_token=fence.token)
    if planned.release_lease:
        names.append("release")
    if call is not None:
        names.append("call")
        row = ledger_first_row(**call.row())
        params.update({f"a_{c}": row.get(c) for c in _ACTION_COLUMNS if c != "run_id"})
    if rides.messages:
        eager = eager_grace is not None and fence is not None
        names.append("eager_messages" if eager else "messages")
        params["messages"] = outbox.rows_json(rides.messages)
        if eager:
            params["eager_grace"] = eager_grace
    if rides.notices:
        names.append("notices")
        params["notices"] = jsonb.dumps([{"channel": c, "payload": p} for c, p in rides.notices])
    unslot = planned.gives_slot_back
    if unslot:
        names.append("unslot")
    if rides.handover is not None:
        names.append("parked_handover" if unslot else "handover")
        params.update(handover.params(rides.handover))
    if rides.tenant_charge is not None:
        names.append("tenant_charge")
        params.update(_tenant_charging(rides.tenant_charge))
    cancel = planned.cancel
    if cancel is not None:
        names.append("cancel")
        params.update(_cancelling(cancel))
    if planned.owes_cleanup:
        names.append("cleanup")
    if planned.ends_run:
        names.append("child_ended")
        params["e_report"] = child_rows.report(planned.after.snapshot)
    if planned.queue_stint:
        names.append("queued")
        params.update(queue_params(planned.after.snapshot))
    if rides.timers:
        names.append("timed")
        params["timers"] = jsonb.dumps([dict(t) for t in rides.timers])
    row = await driver.one(conn, _compile(tuple(names)), params)
    if not row.moved:
        await _conflict(conn, stored, fence)
    metrics.transitioned(stored.snapshot, planned.after.snapshot)
    eager = getattr(row, "eager", None) or ()
    return planned.after, list(eager) if any(i is not None for i in eager) else []


async def _conflict(conn: driver.Connection, stored: StoredRun, fence: Fence | None) -> None:
    current = await driver.first(conn, _FENCE_NOW, {"run_id": stored.snapshot.run_id})
    if fence is not None and (current is None or current.lease_owner != fence.owner
                              or current.fencing_token != fence.token):
        raise LeaseLost(stored.snapshot.run_id, fence.token)
    raise StaleRevision(stored.snapshot.run_id, stored.snapshot.revision)


async def history(conn: AsyncConnection, run_id: str, *, after: int = 0) -> list[ev.RunEvent]:
    """The run's events in seq order; ``after``: only those past that seq."""
    rows = await conn.execute(select(run_events.c.data).where(run_events.c.run_id == run_id, run_events.c.seq > after)
                              .order_by(run_events.c.seq))
    return [ev.event_from_dict(r.data) for r in rows]
